"""A peer that vanishes mid-job: after STEPS allreduces rank 1 shuts down its TCP connections and
stops itself (SIGSTOP), which is how a crashed host's rank looks to its peers, while MPICH's
launcher (which ends every rank at once when one exits) still sees it running. Rank 0 goes on
allreducing ELEMENTS float32 values until something ends it.

Usage: peer_cut_worker.py STEPS [ELEMENTS]

Rank 0 prints ``[rank 0] error after N steps: Type: message`` and exits 1 when an operation
raises; it must never die by a signal inside MPI (tests/engine/test_mpi_crash.py).
"""
import os
import signal
import socket
import stat
import sys

import numpy as np

import collectives as hvd


def cut_connections_and_stop():
    """Shut down every TCP connection of this process but the launcher's (PMI_FD), then stop:
    to its peers this rank is gone as if its host had crashed, while MPICH's launcher, which
    ends every rank at once when one exits, still sees it running."""
    pmi = int(os.environ.get("PMI_FD", "-1"))
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd == pmi or not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
                s.getpeername()  # connected ones only (not a listener the launcher shares)
                s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            s.close()
    os.kill(os.getpid(), signal.SIGSTOP)


def main():
    steps = int(sys.argv[1])
    hvd.init()
    r = hvd.rank()
    x = np.ones(int(sys.argv[2]) if len(sys.argv) > 2 else 1024, np.float32)
    step = 0
    try:
        while True:
            hvd.allreduce(x, op=hvd.Sum, name="loop")
            step += 1
            if r == 1 and step == steps:
                print(f"[rank 1] cutting its connections after {step} steps", flush=True)
                cut_connections_and_stop()
    except Exception as e:  # noqa: BLE001 - the one line the test reads
        print(f"[rank {r}] error after {step} steps: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
