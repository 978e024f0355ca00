"""Training that a rank can stall on purpose, for the watchdog's tests: tests/engine/test_watchdog.py
on this machine (one rank stops itself), tests/multihost/test_multihost_failures.py on simulated hosts
(a link is cut or a host crashes under it).

Usage: watchdog_worker.py MODE SECONDS [--stop-rank R --stop-after N] [--linger] [--report-exit]

  sync   every step: allreduce_async_ of a numpy array, then synchronize, checked against the
         numpy sum of every rank's input
  verb   every step: a synchronous allreduce of a small numpy array (whose waiting caller runs
         the engine's cycles itself), checked the same way
  torch  every step: a small model's forward and backward (whose hooks submit the gradients'
         allreduces) and a DistributedOptimizer step (which synchronizes them); the parameters
         are checked equal on every rank at the end

Every rank prints ``[rank R host H] step S t=T.Ts`` about once a second (T: seconds since the
loop began, on this rank's clock) and ``[rank R host H] done S steps`` when SECONDS are over.
An exception prints ``[rank R host H] error in PHASE after T.Ts: Type: message`` (PHASE: where
it was raised: synchronize, forward, backward, step) and exits 1, or with --linger sleeps on
so that only the watchdog can end the process. --stop-rank R --stop-after N: rank R stops
itself with SIGSTOP after N steps, engine thread and all, as a hung or debugged process would.
--report-exit: the process mpirun started runs the rank as its child (handing it the PMI
connection, and taking it down if killed itself) and prints ``[rank R] exit status S`` when the
rank ends, before exiting with the same status: how a rank's own exit status is seen even when
mpirun reports another rank's.
"""
import argparse
import os
import signal
import socket
import sys
import time

import numpy as np

import collectives as hvd  # importing does not initialize MPI: the --report-exit parent stays out of it


class Failed(Exception):
    def __init__(self, phase, error):
        super().__init__(phase)
        self.phase, self.error = phase, error


def in_phase(phase, fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - reported with the phase it came from
        raise Failed(phase, e) from e


def sync_steps(r, n):
    x = np.full(65536, r + 1, np.float32)
    expected = np.full(65536, n * (n + 1) / 2, np.float32)

    def step(i):
        buf = x.copy()
        handle = in_phase("submit", lambda: hvd.allreduce_async_(buf, op=hvd.Sum, name=f"wd.sync.{i % 4}"))
        got = in_phase("synchronize", hvd.synchronize, handle)
        if not np.array_equal(got, expected):
            raise AssertionError(f"step {i}: wrong sum")
    return step, lambda: None


def verb_steps(r, n):
    # A synchronous verb: the waiting caller runs the cycles itself (csrc/core/engine_inline.cc), and a
    # small tensor rides in the negotiation, so a stopped peer leaves this thread, not the engine
    # thread, waiting inside MPI.
    x = np.full(64, r + 1, np.float32)
    expected = np.full(64, n * (n + 1) / 2, np.float32)

    def step(i):
        got = in_phase("allreduce", lambda: hvd.allreduce(x, op=hvd.Sum, name=f"wd.verb.{i % 4}"))
        if not np.array_equal(got, expected):
            raise AssertionError(f"step {i}: wrong sum")
    return step, lambda: None


def torch_steps(r, n):
    import torch

    import collectives.torch as thvd

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                    named_parameters=model.named_parameters())
    thvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(r)

    def step(i):
        data, target = torch.randn(16, 32, generator=gen), torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        loss = in_phase("forward", lambda: torch.nn.functional.mse_loss(model(data), target))
        in_phase("backward", loss.backward)
        in_phase("step", opt.step)

    def check():
        flat = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
        everyone = hvd.allgather_object(flat, name="wd.torch.params")
        for q, other in enumerate(everyone):
            if not np.array_equal(other, flat):
                raise AssertionError(f"rank {q}'s parameters differ from rank {r}'s")
    return step, check


def report_exit():
    """Run this worker as a child without --report-exit; print and return its exit status."""
    import ctypes
    import subprocess

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pmi_fd = int(os.environ.get("PMI_FD", "-1"))
    argv = [a for a in sys.argv if a != "--report-exit"]
    child = subprocess.Popen([sys.executable] + argv, pass_fds=(pmi_fd,) if pmi_fd >= 0 else (),
                             preexec_fn=lambda: prctl(1, int(signal.SIGKILL), 0, 0, 0))  # PR_SET_PDEATHSIG
    code = child.wait()
    print(f"[rank {os.environ.get('PMI_RANK', '?')}] exit status {code}", flush=True)
    return code if code >= 0 else 128 - code


def main():
    if "--report-exit" in sys.argv:
        sys.exit(report_exit())
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["sync", "verb", "torch"])
    p.add_argument("seconds", type=float)
    p.add_argument("--stop-rank", type=int, default=-1)
    p.add_argument("--stop-after", type=int, default=5)
    p.add_argument("--linger", action="store_true")
    p.add_argument("--report-exit", action="store_true")
    args = p.parse_args()
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    tag = f"[rank {r} host {socket.gethostname()}]"
    step, check = {"sync": sync_steps, "verb": verb_steps, "torch": torch_steps}[args.mode](r, n)
    print(f"{tag} pid {os.getpid()} ready", flush=True)
    start = last = time.monotonic()
    i = 0
    try:
        while time.monotonic() - start < args.seconds:
            if r == args.stop_rank and i == args.stop_after:
                print(f"{tag} stopping itself after {i} steps", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            step(i)
            i += 1
            now = time.monotonic()
            if now - last >= 1.0:
                print(f"{tag} step {i} t={now - start:.1f}s", flush=True)
                last = now
        check()
    except Failed as f:
        e = f.error
        print(f"{tag} error in {f.phase} after {time.monotonic() - start:.1f}s: {type(e).__name__}: {e}", flush=True)
        if args.linger:
            time.sleep(600)
        sys.exit(1)
    print(f"{tag} done {i} steps", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
