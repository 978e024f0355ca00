"""A training-like loop of allreduces that reports its progress, for runs on simulated hosts
where a link is cut or a host crashes mid-job (tests/support/simhosts.py).

Usage: allreduce_loop_worker.py SECONDS [ELEMENTS]

Every rank allreduces ELEMENTS float32 values (default 65536) again and again for SECONDS,
checking each result against the numpy sum, and prints one line per second:
``[rank R host H] step S t=T.Ts`` (T: seconds since the loop began, on this rank's clock).
An exception ends the loop with ``[rank R host H] error after T.Ts: Type: message`` and exit 1;
the end of the loop with ``[rank R host H] done S steps`` and exit 0.
"""
import socket
import sys
import time

import numpy as np

import collectives as hvd


def main():
    seconds = float(sys.argv[1])
    elements = int(sys.argv[2]) if len(sys.argv) > 2 else 65536
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    tag = f"[rank {r} host {socket.gethostname()}]"
    x = np.full(elements, r + 1, np.float32)
    expected = np.full(elements, n * (n + 1) / 2, np.float32)
    start = last = time.monotonic()
    step = 0
    try:
        while time.monotonic() - start < seconds:
            got = hvd.allreduce(x, op=hvd.Sum, name="loop")
            if not np.array_equal(got, expected):
                raise AssertionError(f"step {step}: wrong sum")
            step += 1
            now = time.monotonic()
            if now - last >= 1.0:
                print(f"{tag} step {step} t={now - start:.1f}s", flush=True)
                last = now
    except Exception as e:  # noqa: BLE001 - reported as the one line the test reads
        print(f"{tag} error after {time.monotonic() - start:.1f}s: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
    print(f"{tag} done {step} steps", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
