"""Started by collectivesrun in tests/launcher/test_launcher.py: a real allreduce checked against a
numpy reference, a grouped allreduce (fused when fusion is on), and one line with what this
rank sees of its configuration, for the test to compare with the flags it gave.

  launcher_worker.py [--out DIR] [VAR ...]
      --out DIR   write what this rank sees to DIR/rank<R>.json (stdout lines of several
                  ranks can interleave mid-line under the launcher)
      VAR ...     environment variables to include
"""
import json
import os
import sys

import numpy as np

import collectives as hvd
from collectives import config
from common import Checker, rank_input


def main():
    argv = sys.argv[1:]
    out_dir = None
    if argv[:1] == ["--out"]:
        out_dir, argv = argv[1], argv[2:]
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    chk = Checker(r)

    def allreduce_matches_numpy():
        shape = (4, 3)
        x = rank_input(5, r, shape, np.float64)
        expected = sum(rank_input(5, q, shape, np.float64) for q in range(n))
        np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum, name="launch.sum"), expected)
        np.testing.assert_allclose(hvd.allreduce(x, op=hvd.Average, name="launch.avg"), expected / n)
    chk.check("allreduce against numpy", allreduce_matches_numpy)

    def grouped_allreduce():
        outs = hvd.grouped_allreduce([np.full(8, r + i, np.float32) for i in range(4)], op=hvd.Sum,
                                     name="launch.group")
        for i, out in enumerate(outs):
            np.testing.assert_array_equal(out, np.full(8, n * i + n * (n - 1) / 2, np.float32))
    chk.check("grouped allreduce", grouped_allreduce)

    # The engine's effective settings, read as init() reads them (there is no public getter).
    seen = {"rank": r, "size": n, "local_size": hvd.local_size(), "config": config.load(),
            "env": {name: os.environ.get(name) for name in argv}}
    if out_dir:
        with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
            json.dump(seen, f)
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
