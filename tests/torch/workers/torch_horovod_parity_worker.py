"""Differences from Horovod 0.28.1 found by the differential test, now matched (run under mpirun, np=2).

Each case states Horovod's behaviour (verified under Horovod 0.28.1's own venv) and checks ours:
values against numpy references computed from every rank's inputs, errors on every rank that
made the call.

  stateless     broadcast_optimizer_state of a stateless optimizer (SGD without momentum)
                broadcasts nothing: each rank keeps its own lr; a stateful one still gets root's.
  handles       once synchronize(h) returned (or raised the operation's error), the handle is
                released: synchronize(h) returns None, poll(h) raises ValueError; Ctrl-C during
                synchronize keeps it valid; a non-handle raises ArgumentTypeError.
  psrank        ProcessSet.rank() on a non-member raises ValueError; a collective on an
                unregistered set raises TypeError (and InvalidArgumentError).
  errtypes      unsupported dtype -> ValueError (and TypeError); broadcast_parameters(5, 0) ->
                ValueError; DistributedOptimizer(groups='x') -> TypeError, groups=-1 -> ValueError.
  submodules    collectives.torch.mpi_ops / compression / functions / sync_batch_norm.
  small         grouped results' list/tuple types, Compression.fp16's ctx, mpi_enabled() before init.
"""
import signal
import sys
import time

import numpy as np
import torch

import collectives.torch as hvd
from collectives.errors import ArgumentTypeError, InvalidArgumentError, TensorMismatchError, UnsupportedTypeError
from common import Checker, raises, rank_input

torch.set_num_threads(1)
MPI_ENABLED_BEFORE_INIT = hvd.mpi_enabled()
hvd.init()
R, S = hvd.rank(), hvd.size()
chk = Checker(R)



def everyone(seed, shape, dtype=np.float32):
    """Every rank's input for ``seed`` (the numpy reference's operands) and this rank's as a tensor."""
    arrays = [rank_input(seed, r, shape, dtype) for r in range(S)]
    return arrays, torch.from_numpy(arrays[R].copy())


def same(tensor, expected):
    np.testing.assert_allclose(tensor.numpy(), expected, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- stateless

def family_stateless():
    def stateless_keeps_own_lr():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * (R + 1))
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        # Nothing was left in flight: the next collective matches its reference (made before
        # the asserts, so a failing rank does not leave the other waiting).
        arrays, t = everyone(11, (4,))
        same(hvd.allreduce(t, op=hvd.Sum, name="after.stateless"), np.sum(arrays, axis=0))
        assert opt.param_groups[0]["lr"] == 0.1 * (R + 1), opt.param_groups[0]["lr"]  # not root's 0.1
        assert len(opt.state_dict()["state"]) == 0
        for p, b in zip(model.parameters(), before):  # the initialization step did not move them
            assert torch.equal(p.detach(), b)
    chk.check("stateless optimizer: nothing broadcast, own lr kept", stateless_keeps_own_lr)

    def stateful_gets_root():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * (R + 1), momentum=0.5 + 0.1 * R, weight_decay=0.1)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        assert opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[0]["momentum"] == 0.5
        assert len(opt.state_dict()["state"]) == 2
        for p, b in zip(model.parameters(), before):  # our documented difference: parameters put back
            assert torch.equal(p.detach(), b)
    chk.check("stateful optimizer: root's param_groups, parameters put back", stateful_gets_root)


# ---------------------------------------------------------------- handles

def family_handles():
    def released_after_result():
        arrays, t = everyone(21, (5,))
        h = hvd.allreduce_async(t, op=hvd.Sum, name="h.result")
        same(hvd.synchronize(h), np.sum(arrays, axis=0))
        assert hvd.synchronize(h) is None
        raises(ValueError, lambda: hvd.poll(h), "was not created or has been cleared")
    chk.check("synchronize releases the handle", released_after_result)

    def released_after_error():
        h = hvd.allreduce_async(torch.ones(2 + R), name="h.mismatch")  # shapes differ across ranks
        raises(TensorMismatchError, lambda: hvd.synchronize(h))
        assert hvd.synchronize(h) is None
        raises(ValueError, lambda: hvd.poll(h), "has been cleared")
    chk.check("a failed handle is released too, on every rank", released_after_error)

    def grouped_and_sparse_released():
        arrays, t = everyone(22, (3,))
        h = hvd.grouped_allreduce_async_([t.clone(), t.clone()], op=hvd.Sum, name="h.grouped")
        outs = hvd.synchronize(h)
        assert isinstance(outs, tuple) and len(outs) == 2
        for o in outs:
            same(o, np.sum(arrays, axis=0))
        assert hvd.synchronize(h) is None
        dense = torch.zeros(4, 2)
        dense[R] = 1.0 + R
        h = hvd.sparse_allreduce_async(dense.to_sparse(), name="h.sparse", op=hvd.Sum)
        expected = np.zeros((4, 2), dtype=np.float32)
        for r in range(S):
            expected[r] = 1.0 + r
        same(hvd.synchronize(h).to_dense(), expected)
        assert hvd.synchronize(h) is None
        same(h().to_dense(), expected)  # Horovod's call form is the handle's own method: still the result
    chk.check("grouped and sparse handles are released", grouped_and_sparse_released)

    def interrupted_stays_valid():
        # Rank 1 submits 0.6 s late; rank 0's wait is interrupted by Ctrl-C (a handler that
        # raises KeyboardInterrupt) at 0.2 s, and a later synchronize returns the result.
        arrays, t = everyone(23, (6,))
        if R == 1:
            time.sleep(0.6)
        h = hvd.allreduce_async(t, op=hvd.Sum, name="h.interrupted")
        if R == 0:
            def interrupt(signum, frame):
                raise KeyboardInterrupt
            previous = signal.signal(signal.SIGALRM, interrupt)
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            try:
                hvd.synchronize(h)
                raise AssertionError("synchronize returned before the late rank submitted")
            except KeyboardInterrupt:
                pass
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
            assert hvd.poll(h) in (True, False)  # still a valid handle
        same(hvd.synchronize(h), np.sum(arrays, axis=0))
        assert hvd.synchronize(h) is None
    chk.check("Ctrl-C during synchronize leaves the handle valid", interrupted_stays_valid)

    def not_a_handle():
        for fn in (hvd.synchronize, hvd.poll):
            e = raises(ArgumentTypeError, lambda: fn("x"), "expected a handle")
            assert isinstance(e, TypeError) and isinstance(e, ValueError)
    chk.check("a non-handle raises ArgumentTypeError (our deliberate difference)", not_a_handle)

    def optimizer_still_reduces():
        torch.manual_seed(1)
        model = torch.nn.Linear(4, 1, bias=False)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                       named_parameters=model.named_parameters())
        xs = [rank_input(24, r, (2, 4), np.float32) for r in range(S)]
        w0 = model.weight.detach().numpy().copy()
        opt.zero_grad()
        model(torch.from_numpy(xs[R].copy())).sum().backward()
        opt.step()
        grad = np.mean([x.sum(axis=0) for x in xs], axis=0)
        same(model.weight.detach(), w0 - grad)
    chk.check("DistributedOptimizer still reduces its gradients", optimizer_still_reduces)


# ---------------------------------------------------------------- psrank

def family_psrank():
    def non_member_rank():
        ps = hvd.add_process_set([0])
        try:
            if R == 0:
                assert ps.rank() == 0 and ps.included()
            else:
                raises(ValueError, ps.rank, "Process is not part of provided process set.")
            assert hvd.global_process_set.rank() == R
        finally:
            hvd.remove_process_set(ps)
    chk.check("ProcessSet.rank() outside the set raises ValueError", non_member_rank)

    def unregistered_set():
        ps = hvd.ProcessSet(list(range(S)))  # never added
        assert ps.rank() is None  # as Horovod: None while not registered
        e = raises(TypeError, lambda: hvd.allreduce(torch.ones(2), name="ps.unregistered", process_set=ps),
                   "is not registered")
        assert isinstance(e, InvalidArgumentError)
        arrays, t = everyone(31, (3,))  # nothing was submitted: the next call matches
        same(hvd.allreduce(t, op=hvd.Sum, name="ps.after"), np.sum(arrays, axis=0))
    chk.check("unregistered process set raises TypeError on every rank", unregistered_set)


# ---------------------------------------------------------------- errtypes

def family_errtypes():
    def unsupported_dtype():
        z = torch.ones(3, dtype=torch.complex64)
        for label, fn in (("allreduce", lambda: hvd.allreduce(z, name="cx.ar")),
                          ("allgather", lambda: hvd.allgather(z, name="cx.ag")),
                          ("broadcast", lambda: hvd.broadcast(z, 0, name="cx.bc"))):
            e = raises(ValueError, fn)
            assert isinstance(e, UnsupportedTypeError) and isinstance(e, TypeError), label
    chk.check("unsupported dtype is a ValueError (and TypeError)", unsupported_dtype)

    def broadcast_parameters_type():
        for bad in (5, torch.ones(2, 2), "weights"):
            e = raises(ValueError, lambda: hvd.broadcast_parameters(bad, 0), "broadcast_parameters takes")
            assert isinstance(e, ArgumentTypeError)
        model = torch.nn.Linear(2, 2)  # a different init on each rank
        roots = hvd.broadcast_object({k: v.numpy().copy() for k, v in model.state_dict().items()}, 0,
                                     name="bp.reference")
        hvd.broadcast_parameters(model.state_dict(), 0)  # nothing was left in flight by the errors
        for k, v in model.state_dict().items():
            same(v, roots[k])
    chk.check("broadcast_parameters(5, 0) raises ArgumentTypeError on every rank", broadcast_parameters_type)

    def groups_types():
        model = torch.nn.Linear(2, 2)

        def make(groups):
            return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                            named_parameters=model.named_parameters(), groups=groups)
        for bad in ("x", 1.5):
            e = raises(TypeError, lambda: make(bad))
            assert isinstance(e, ArgumentTypeError)
        for bad in (-1, 0, False):
            e = raises(ValueError, lambda: make(bad))
            assert not isinstance(e, TypeError), bad
    chk.check("DistributedOptimizer groups: TypeError for a wrong type, ValueError for a bad value", groups_types)


# ---------------------------------------------------------------- submodules

HOROVOD_NAMES = {  # public names of Horovod 0.28.1's modules that collectives has
    "mpi_ops": "allreduce allreduce_ allreduce_async allreduce_async_ grouped_allreduce grouped_allreduce_ "
               "grouped_allreduce_async grouped_allreduce_async_ sparse_allreduce_async allgather allgather_async "
               "grouped_allgather grouped_allgather_async broadcast broadcast_ broadcast_async broadcast_async_ "
               "alltoall alltoall_async reducescatter reducescatter_async grouped_reducescatter "
               "grouped_reducescatter_async join barrier poll synchronize init shutdown is_initialized size rank "
               "local_size local_rank cross_size cross_rank is_homogeneous mpi_built mpi_enabled gloo_built "
               "gloo_enabled nccl_built ddl_built ccl_built cuda_built rocm_built mpi_threads_supported "
               "start_timeline stop_timeline ProcessSet global_process_set add_process_set remove_process_set "
               "Average Sum Adasum Min Max Product Compression HorovodInternalError "
               "handle_average_backwards_compatibility",
    "compression": "Compression Compressor NoneCompressor FP16Compressor",
    "functions": "broadcast_parameters broadcast_optimizer_state broadcast_object allgather_object ProcessSet "
                 "global_process_set allgather broadcast_ broadcast_async_ synchronize rank size",
    "sync_batch_norm": "SyncBatchNorm Sum allgather_async allreduce_async size synchronize",
}


def family_submodules():
    def names():
        import importlib

        for module, listed in HOROVOD_NAMES.items():
            mod = importlib.import_module(f"collectives.torch.{module}")
            assert getattr(hvd, module) is mod, module
            missing = [n for n in listed.split() if not hasattr(mod, n)]
            assert not missing, f"{module} lacks {missing}"
        assert hvd.mpi_ops.allreduce_async_ is hvd.allreduce_async_
        assert hvd.functions.broadcast_parameters is hvd.broadcast_parameters
        assert hvd.sync_batch_norm.SyncBatchNorm is hvd.SyncBatchNorm
        assert hvd.mpi_ops.HorovodInternalError is hvd.HorovodInternalError
    chk.check("Horovod's submodules and their names", names)

    def ported_import():
        from collectives.torch.mpi_ops import allreduce_async_, synchronize

        arrays, t = everyone(41, (2, 3))
        out = synchronize(allreduce_async_(t, op=hvd.Sum, name="sub.allreduce_"))
        assert out is t
        same(t, np.sum(arrays, axis=0))
    chk.check("from collectives.torch.mpi_ops import allreduce_async_", ported_import)


# ---------------------------------------------------------------- small

def family_small():
    def grouped_types():
        a, ta = everyone(51, (4, 2))
        b, tb = everyone(52, (2, 2))
        sums = [np.sum(a, axis=0), np.sum(b, axis=0)]
        gathered = [np.concatenate(a), np.concatenate(b)]
        results = {
            "grouped_allreduce_": (tuple, hvd.grouped_allreduce_([ta.clone(), tb.clone()], op=hvd.Sum, name="g.1"),
                                   sums),
            "grouped_allreduce_async_": (tuple, hvd.synchronize(hvd.grouped_allreduce_async_(
                [ta.clone(), tb.clone()], op=hvd.Sum, name="g.2")), sums),
            "grouped_allreduce_async": (tuple, hvd.synchronize(hvd.grouped_allreduce_async(
                [ta, tb], op=hvd.Sum, name="g.3")), sums),
            "grouped_allreduce": (list, hvd.grouped_allreduce([ta, tb], op=hvd.Sum, name="g.4"), sums),
            "grouped_allgather": (tuple, hvd.grouped_allgather([ta, tb], name="g.5"), gathered),
            "grouped_allgather_async": (tuple, hvd.synchronize(hvd.grouped_allgather_async([ta, tb], name="g.6")),
                                        gathered),
            "grouped_reducescatter": (list, hvd.grouped_reducescatter([ta, tb], op=hvd.Sum, name="g.7"),
                                      [s[R * s.shape[0] // S:(R + 1) * s.shape[0] // S] for s in sums]),
            "grouped_reducescatter_async": (tuple, hvd.synchronize(hvd.grouped_reducescatter_async(
                [ta, tb], op=hvd.Sum, name="g.8")), [s[R * s.shape[0] // S:(R + 1) * s.shape[0] // S] for s in sums]),
        }
        for label, (kind, got, expected) in results.items():
            assert type(got) is kind, f"{label}: {type(got).__name__}, Horovod gives {kind.__name__}"
            for g, e in zip(got, expected):
                same(g, e)
    chk.check("grouped results: tuple or list as Horovod", grouped_types)

    def fp16_ctx():
        i = torch.arange(3, dtype=torch.int32)
        c, ctx = hvd.Compression.fp16.compress(i)
        assert c is i and ctx == torch.int32
        assert hvd.Compression.fp16.decompress(c, ctx) is c
        f = torch.tensor([1.5, 2.25], dtype=torch.float32)
        c, ctx = hvd.Compression.fp16.compress(f)
        assert c.dtype == torch.float16 and ctx == torch.float32
        assert hvd.Compression.fp16.decompress(c, ctx).dtype == torch.float32
        assert hvd.Compression.fp16.compress(c)[1] == torch.float16
        arrays, t = everyone(53, (3,), np.int32)
        out = hvd.allreduce(t, op=hvd.Sum, name="fp16.int", compression=hvd.Compression.fp16)
        assert out.dtype == torch.int32
        np.testing.assert_array_equal(out.numpy(), np.sum(arrays, axis=0))
    chk.check("Compression.fp16: ctx is the input's dtype", fp16_ctx)

    def mpi_enabled():
        assert MPI_ENABLED_BEFORE_INIT is False and hvd.mpi_enabled() is True
    chk.check("mpi_enabled(): False before init, True after", mpi_enabled)


FAMILIES = {"stateless": family_stateless, "handles": family_handles, "psrank": family_psrank,
            "errtypes": family_errtypes, "submodules": family_submodules, "small": family_small}

if __name__ == "__main__":
    for family in sys.argv[1:] or list(FAMILIES):
        FAMILIES[family]()
    hvd.shutdown()
    chk.finish()
