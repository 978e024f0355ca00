"""Run under collectivesrun by tests/multihost/test_multihost.py on simulated hosts (and by test_launcher.py
on this machine alone): where each rank landed and the topology as Horovod defines it, checked
against the placement the test asked for, and collectives in a process set with a member on
every host, against numpy references.

Usage: multihost_worker.py HOST:N[,HOST:N...]   (the placement given to collectivesrun -H,
       with ranks filled host by host in that order)

Horovod's definitions (horovod/common/mpi/mpi_context.cc, mpi_controller.cc):
  local:  MPI_Comm_split_type(SHARED) - the ranks on this host, ordered by rank;
  cross:  MPI_Comm_split(comm, color=local_rank, key=rank) - the ranks with this local_rank,
          one per host that has that many ranks, ordered by rank;
  is_homogeneous: every rank's local_size equals this rank's.
"""
import os
import socket
import sys

import numpy as np

import collectives as hvd
from common import Checker, rank_input


def expected_topology(placement, size):
    """{rank: (host, local_rank, local_size, cross_rank, cross_size)} from the placement."""
    hosts = [h for h, n in placement for _ in range(n)][:size]
    local = {r: [q for q in range(size) if hosts[q] == hosts[r]] for r in range(size)}
    out = {}
    for r in range(size):
        local_rank = local[r].index(r)
        cross = [q for q in range(size) if local[q].index(q) == local_rank]
        out[r] = (hosts[r], local_rank, len(local[r]), cross.index(r), len(cross))
    return out


def main():
    placement = [(entry.split(":")[0], int(entry.split(":")[1])) for entry in sys.argv[1].split(",")]
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    chk = Checker(r)
    seen = (socket.gethostname(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
    everyone = hvd.allgather_object(seen, name="mh.topology")
    print(f"[rank {r}] host={seen[0]} local_rank={seen[1]} local_size={seen[2]} cross_rank={seen[3]} "
          f"cross_size={seen[4]} is_homogeneous={hvd.is_homogeneous()}", flush=True)

    def topology():
        expected = expected_topology(placement, n)
        for q in range(n):
            assert tuple(everyone[q]) == expected[q], f"rank {q}: (host, local_rank, local_size, cross_rank, " \
                                                      f"cross_size) = {tuple(everyone[q])}, expected {expected[q]}"
    chk.check("host, local and cross ranks as Horovod defines them", topology)

    def homogeneous():
        local_sizes = {n_ for _, n_ in placement}
        assert hvd.is_homogeneous() is (len(local_sizes) == 1), (hvd.is_homogeneous(), placement)
    chk.check("is_homogeneous", homogeneous)

    def traffic_on_the_links():
        # On simulated hosts UCX otherwise moves data between them through shared memory.
        if len(placement) > 1:
            assert os.environ.get("UCX_TLS") == "tcp,self", os.environ.get("UCX_TLS")
    chk.check("UCX kept to TCP between hosts", traffic_on_the_links)

    # The last rank of every host: a set with a member on each host, without rank 0 (the
    # global set's coordinator) when rank 0's host has other ranks.
    members = sorted({everyone[q][0]: q for q in range(n)}.values())
    spanning = hvd.add_process_set(members)

    def in_spanning_set():
        assert {everyone[q][0] for q in members} == {h for h, _ in placement}, "the set does not span every host"
        if r not in members:
            return
        me = members.index(r)
        assert spanning.rank() == me and spanning.size() == len(members)
        for dt in (np.float32, np.int64, np.float64):
            xs = [rank_input(11, q, (5, 3), dt) for q in members]
            got = hvd.allreduce(xs[me], op=hvd.Sum, name=f"mh.set.sum.{np.dtype(dt).name}", process_set=spanning)
            np.testing.assert_array_equal(got, np.sum(xs, axis=0).astype(dt))
            rows = [rank_input(12, q, (members.index(q) + 1, 2), dt) for q in members]
            got = hvd.allgather(rows[me], name=f"mh.set.gather.{np.dtype(dt).name}", process_set=spanning)
            np.testing.assert_array_equal(got, np.concatenate(rows))
            root = members[-1]  # a rank on the last host
            got = hvd.broadcast(xs[me], root_rank=root, name=f"mh.set.bcast.{np.dtype(dt).name}",
                                process_set=spanning)
            np.testing.assert_array_equal(got, xs[members.index(root)])
            # Every member gives the same rows len(members) times: member i receives block i, the sum.
            got = hvd.reducescatter(np.tile(xs[me], (len(members), 1)), op=hvd.Sum,
                                    name=f"mh.set.rs.{np.dtype(dt).name}", process_set=spanning)
            np.testing.assert_array_equal(got, np.sum(xs, axis=0).astype(dt))
    chk.check("collectives in a process set spanning the hosts", in_spanning_set)

    hvd.remove_process_set(spanning)
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
