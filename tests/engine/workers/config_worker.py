"""init() with a bad value in the environment: InvalidArgumentError naming the variable,
nothing started; after fixing the environment, init() works.

  config_worker.py VARIABLE   (the test sets VARIABLE to an invalid value)
"""
import os
import sys

import numpy as np

import collectives as hvd
from common import Checker
from robust_util import wait


def main():
    variable = sys.argv[1]
    chk = Checker(int(os.environ.get("PMI_RANK", "0")))

    def bad_init():
        try:
            hvd.init()
        except hvd.InvalidArgumentError as e:
            assert isinstance(e, ValueError)
            assert variable in str(e), f"message does not name {variable}: {e}"
        else:
            raise AssertionError(f"init() accepted {variable}={os.environ.get(variable)!r}")
        assert not hvd.is_initialized()
    chk.check("init with an invalid value", bad_init)

    del os.environ[variable]

    def good_init():
        hvd.init()
        n = hvd.size()
        out = wait(hvd.allreduce_async(np.ones(3, np.float32), op=hvd.Sum, name="cfg"), 60, "cfg")
        np.testing.assert_array_equal(out, np.full(3, n, np.float32))
    chk.check("init after fixing the environment", good_init)
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
