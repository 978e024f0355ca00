"""Correctness of every collective against numpy references (run under mpirun, one process per rank).

Usage: ops_worker.py FAMILY [FAMILY ...]

Every rank recomputes every other rank's input with ``rank_input`` and checks its own result
against a numpy reference. All ranks run the same cases in the same order (so automatic
names agree); failures are collected by ``Checker`` and reported at the end, and the process
exits non-zero if any case failed on this rank.

The families live in ops_reduce_checks.py (allreduce, reducescatter, grouped), ops_layout_checks.py
(shapes, noncontig), ops_movement_checks.py (broadcast, allgather, alltoall), ops_types_checks.py
(types, objects) and ops_stress_checks.py (stress); their shared helpers in ops_util.py.
"""
import sys
import time

import collectives as hvd
from common import Checker
from ops_layout_checks import fam_noncontig, fam_shapes
from ops_movement_checks import fam_allgather, fam_alltoall, fam_broadcast
from ops_reduce_checks import fam_allreduce, fam_grouped, fam_reducescatter
from ops_stress_checks import fam_stress
from ops_types_checks import fam_objects, fam_types
from ops_util import ctx

FAMILIES = {
    "allreduce": fam_allreduce,
    "shapes": fam_shapes,
    "noncontig": fam_noncontig,
    "broadcast": fam_broadcast,
    "allgather": fam_allgather,
    "alltoall": fam_alltoall,
    "reducescatter": fam_reducescatter,
    "grouped": fam_grouped,
    "types": fam_types,
    "objects": fam_objects,
    "stress": fam_stress,
}


def main():
    families = sys.argv[1:] or list(FAMILIES)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        print(f"unknown families {unknown}; known: {list(FAMILIES)}", file=sys.stderr)
        sys.exit(2)
    hvd.init()
    ctx.R, ctx.S = hvd.rank(), hvd.size()
    ctx.chk = Checker(ctx.R)
    R, chk = ctx.R, ctx.chk
    for fam in families:
        start = time.time()
        before = len(chk.failures)
        FAMILIES[fam]()
        if R == 0:
            print(f"[rank 0] family {fam}: {len(chk.failures) - before} failed, {time.time() - start:.1f} s",
                  flush=True)
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
