"""Bad input on one rank, or ranks that disagree about a group's size: every rank must raise
within seconds (never wait forever), the good ranks naming the bad rank and its reason, and
the engine must keep working afterwards.

  shared_failure_worker.py one_rank    bad input on the last rank only (item 3 of issue 10)
  shared_failure_worker.py groups      grouped ops whose member count differs (item 2)
  shared_failure_worker.py arguments   typed argument errors and scalars (items 8-12)
  shared_failure_worker.py torch_inputs   torch broadcast_parameters with different state dicts,
                                          alltoall with float splits
"""
import math
import pickle
import sys
import time

import numpy as np

import collectives as hvd
from common import Checker
from robust_util import expect_error, wait

# A good rank must see the bad rank's error within this many seconds (a hang fails the case
# with a 'HANG:' line and stops the rank).
DEADLINE = 10.0


class Unpicklable:
    def __reduce__(self):
        raise pickle.PicklingError("this object refuses to be pickled")


def sum_works(label, n, r):
    """A normal allreduce after an error case: the engine was not poisoned."""
    out = wait(hvd.allreduce_async(np.full(3, r + 1.0), op=hvd.Sum, name=f"after.{label}"), DEADLINE, label)
    assert np.array_equal(out, np.full(3, n * (n + 1) / 2.0)), out


def one_rank(chk, n, r):
    bad = n - 1

    def case(label, good_call, bad_call, local_type, reason_fragment):
        """good ranks: good_call() returns a handle (or is a blocking call); the bad rank's
        bad_call() raises local_type at once."""
        def run():
            if r == bad:
                start = time.monotonic()
                try:
                    bad_call()
                except local_type:
                    assert time.monotonic() - start < 2.0
                else:
                    raise AssertionError(f"{label}: the bad rank did not raise {local_type.__name__}")
            else:
                start = time.monotonic()
                try:
                    result = good_call()
                    if result is not None and hasattr(result, "poll"):
                        wait(result, DEADLINE, label)
                except hvd.TensorMismatchError as e:
                    took = time.monotonic() - start
                    assert took < DEADLINE, took
                    text = str(e)
                    assert f"rank {bad}" in text and reason_fragment in text, text
                else:
                    raise AssertionError(f"{label}: a good rank completed instead of raising")
            sum_works(label, n, r)
        chk.check(label, run)

    x = np.arange(6, dtype=np.float32)
    case("broadcast root out of range",
         lambda: hvd.broadcast_async(x, 0, name="bad.root"),
         lambda: hvd.broadcast_async(x, n + 5, name="bad.root"), hvd.InvalidArgumentError, "out of range")
    case("alltoall splits that do not add up",
         lambda: hvd.alltoall_async(np.zeros((n, 2)), name="bad.splits"),
         lambda: hvd.alltoall_async(np.zeros((n, 2)), splits=[n + 1] + [0] * (n - 1), name="bad.splits"),
         hvd.InvalidArgumentError, "splits")
    case("alltoall splits of a float type (integral values)",
         lambda: hvd.alltoall_async(np.zeros((n, 2)), splits=np.ones(n, np.int32), name="bad.floatsplits"),
         lambda: hvd.alltoall_async(np.zeros((n, 2)), splits=np.ones(n, np.float32), name="bad.floatsplits"),
         ValueError, "integers")
    ro = np.ones(4)
    ro.flags.writeable = False
    case("read-only array for allreduce_",
         lambda: hvd.allreduce_async_(np.ones(4), name="bad.readonly"),
         lambda: hvd.allreduce_async_(ro, name="bad.readonly"), hvd.InvalidArgumentError, "writable")
    case("unsupported dtype",
         lambda: hvd.allreduce_async(np.ones(4, np.float32), name="bad.dtype"),
         lambda: hvd.allreduce_async(np.ones(4, np.complex64), name="bad.dtype"), hvd.UnsupportedTypeError,
         "complex64")
    case("0-d reducescatter",
         lambda: hvd.reducescatter_async(np.ones((n, 2)), name="bad.0d"),
         lambda: hvd.reducescatter_async(np.float64(1.0), name="bad.0d"), hvd.InvalidArgumentError, "dimension")
    case("NaN prescale factor",
         lambda: hvd.allreduce_async(np.ones(4), name="bad.nan", prescale_factor=1.0),
         lambda: hvd.allreduce_async(np.ones(4), name="bad.nan", prescale_factor=math.nan), hvd.InvalidArgumentError,
         "finite")
    case("float root rank",
         lambda: hvd.broadcast_async(x, 0, name="bad.rootfloat"),
         lambda: hvd.broadcast_async(x, 1.7, name="bad.rootfloat"), TypeError, "root_rank")
    case("one bad member of a grouped allreduce",
         lambda: hvd.grouped_allreduce_async([np.ones(2), np.ones(3)], name="bad.group"),
         lambda: hvd.grouped_allreduce_async([np.ones(2), np.ones(3, np.complex128)], name="bad.group"),
         hvd.UnsupportedTypeError, "complex128")
    # A name every rank used before (so the good ranks find it in the response cache).
    for step in range(3):
        wait(hvd.allreduce_async(np.ones(5), name="bad.cached"), DEADLINE, "cached warm-up")
    case("bad input under a cached name",
         lambda: hvd.allreduce_async(np.ones(5), name="bad.cached"),
         lambda: hvd.allreduce_async(np.ones(5, np.complex64), name="bad.cached"), hvd.UnsupportedTypeError,
         "complex64")
    case("unpicklable object in broadcast_object (bad rank is the root)",
         lambda: hvd.broadcast_object(None, root_rank=bad, name="bad.bobj"),
         lambda: hvd.broadcast_object(Unpicklable(), root_rank=bad, name="bad.bobj"), pickle.PicklingError,
         "refuses to be pickled")
    case("unpicklable object in allgather_object",
         lambda: hvd.allgather_object({"rank": r}, name="bad.gobj"),
         lambda: hvd.allgather_object(Unpicklable(), name="bad.gobj"), pickle.PicklingError, "refuses to be pickled")


def groups(chk, n, r):
    def case(label, make, count):
        def run():
            start = time.monotonic()
            try:
                wait(make(count), DEADLINE, label)
            except hvd.TensorMismatchError as e:
                assert time.monotonic() - start < DEADLINE
                text = str(e)
                assert "'grp." in text and "different numbers of tensors" in text, text
                # Every count this rank can know about: at least its own and one other.
                assert f"rank {r} has {count}" in text or "has" in text, text
            else:
                raise AssertionError(f"{label}: completed although the ranks' group sizes differ")
            sum_works(label, n, r)
        chk.check(label, run)

    more_on_0 = 3 if r == 0 else 2
    fewer_on_0 = 2 if r == 0 else 3
    for label, count in (("rank 0 has more", more_on_0), ("rank 0 has fewer", fewer_on_0)):
        tag = label.replace(" ", "_")
        case(f"grouped_allreduce, {label}",
             lambda k, tag=tag: hvd.grouped_allreduce_async([np.ones(4) for _ in range(k)], name=f"grp.ar.{tag}"), count)
        case(f"grouped_allgather, {label}",
             lambda k, tag=tag: hvd.grouped_allgather_async([np.ones((2, 2)) for _ in range(k)], name=f"grp.ag.{tag}"),
             count)
        case(f"grouped_reducescatter, {label}",
             lambda k, tag=tag: hvd.grouped_reducescatter_async([np.ones((n, 2)) for _ in range(k)],
                                                                name=f"grp.rs.{tag}"), count)

    def reuse():
        # The same group name works again once the ranks agree.
        out = wait(hvd.grouped_allreduce_async([np.full(2, r + 1.0)] * 3, op=hvd.Sum, name="grp.ar.rank_0_has_more"),
                   DEADLINE, "reuse")
        for o in out:
            assert np.array_equal(o, np.full(2, n * (n + 1) / 2.0)), o
    chk.check("group name reused after a mismatch", reuse)


def arguments(chk, n, r):
    def raises(label, exc_type, fn, fragment):
        def run():
            try:
                fn()
            except exc_type as e:
                assert fragment in str(e), str(e)
            else:
                raise AssertionError(f"{label}: no {exc_type.__name__}")
            sum_works(label, n, r)
        chk.check(label, run)

    for value in (np.float64(3.0), 3.0, 7):
        raises(f"allreduce_ of scalar {value!r}", hvd.InvalidArgumentError,
               lambda value=value: hvd.allreduce_(value, op=hvd.Sum), "in place")
    raises("broadcast_ of a scalar", hvd.InvalidArgumentError, lambda: hvd.broadcast_(np.float32(2.0), root_rank=0),
           "in place")
    raises("prescale NaN", hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(2), prescale_factor=math.nan),
           "prescale_factor")
    raises("postscale inf on ints", hvd.InvalidArgumentError,
           lambda: hvd.allreduce(np.ones(2, np.int32), postscale_factor=math.inf), "postscale_factor")
    raises("splits that wrap around int64", hvd.InvalidArgumentError,
           lambda: hvd.alltoall(np.zeros((n, 1)), splits=[2 ** 62] * (n - 1) + [2 ** 63 - 2 ** 62 * (n - 1) + n]),
           "split")
    raises("split of 2**63", hvd.InvalidArgumentError, lambda: hvd.alltoall(np.zeros((n, 1)), splits=[2 ** 63] * n),
           "split")
    raises("root_rank 2**32", hvd.InvalidArgumentError, lambda: hvd.broadcast(np.ones(2), root_rank=2 ** 32),
           "root_rank")
    for value in (None, 1.7, "1", True):
        raises(f"root_rank={value!r}", TypeError, lambda value=value: hvd.broadcast(np.ones(2), root_rank=value),
               "root_rank")
    raises("name=123", TypeError, lambda: hvd.allreduce(np.ones(2), name=123), "name")
    raises("name with a lone surrogate", hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(2), name="x\udc80"),
           "surrogate")
    for value in (3.7, True):
        raises(f"op={value!r}", TypeError, lambda value=value: hvd.allreduce(np.ones(2), op=value), "op")
    raises("start_timeline(None)", TypeError, lambda: hvd.start_timeline(None), "file_path")

    def alltoall_async_tuple():
        # One rule for every type (Horovod's): the handle resolves to (received, received_splits).
        received, splits = hvd.synchronize(hvd.alltoall_async(np.arange(2 * n, dtype=np.float32).reshape(n, 2)))
        assert received.shape == (n, 2) and list(splits) == [1] * n, (received, splits)
        only = hvd.alltoall(np.arange(2 * n, dtype=np.float32).reshape(n, 2))
        assert isinstance(only, np.ndarray) and only.shape == (n, 2)
    chk.check("alltoall_async resolves to a tuple for numpy", alltoall_async_tuple)


def torch_inputs(chk, n, r):
    """torch broadcast_parameters with a state dict that differs on one rank (issue 10, item 3),
    and a float alltoall splits tensor on one rank (issue 35, item 6)."""
    import torch

    import collectives.torch as thvd

    bad = n - 1

    def params(extra=False, shape=(3, 4)):
        torch.manual_seed(r)
        d = {"fc.weight": torch.randn(*shape), "fc.bias": torch.randn(shape[0])}
        if extra:
            d["fc2.weight"] = torch.randn(2)
        return d

    def differing(label, make_bad, fragment):
        def run():
            start = time.monotonic()
            try:
                thvd.broadcast_parameters(make_bad() if r == bad else params(), root_rank=0)
            except hvd.InvalidArgumentError as e:
                assert time.monotonic() - start < DEADLINE
                assert f"rank {bad}" in str(e) and fragment in str(e), str(e)
            else:
                raise AssertionError(f"{label}: no error")
            sum_works(label, n, r)
        chk.check(label, run)

    differing("an extra parameter on one rank", lambda: params(extra=True), "fc2.weight")
    differing("a parameter of another shape on one rank", lambda: params(shape=(3, 5)), "fc.weight")
    differing("a parameter missing on one rank", lambda: {"fc.weight": params()["fc.weight"]}, "fc.bias")

    def same():
        p = params()
        thvd.broadcast_parameters(p, root_rank=0)
        torch.manual_seed(0)
        want = {"fc.weight": torch.randn(3, 4), "fc.bias": torch.randn(3)}
        for k in want:
            assert torch.equal(p[k], want[k]), k
    chk.check("equal state dicts broadcast as before", same)

    def float_splits():
        # issue 35 item 6: a float splits tensor (torch.empty's garbage, as in Horovod's test) on
        # one rank was converted to counts; now that rank gets a ValueError, the others the mismatch.
        x = torch.zeros(n, 2)
        start = time.monotonic()
        try:
            if r == bad:
                thvd.alltoall(x, torch.empty(n, dtype=torch.float32), name="bad.torchsplits")
            else:
                thvd.alltoall(x, torch.ones(n, dtype=torch.int32), name="bad.torchsplits")
        except (ValueError, hvd.TensorMismatchError) as e:
            assert time.monotonic() - start < DEADLINE
            if r == bad:
                assert isinstance(e, ValueError) and "integers" in str(e) and "float32" in str(e), repr(e)
            else:
                assert isinstance(e, hvd.TensorMismatchError), repr(e)
                assert f"rank {bad}" in str(e) and "integers" in str(e), str(e)
        else:
            raise AssertionError("float splits: no error")
        sum_works("torch float splits", n, r)
    chk.check("torch alltoall with float splits on one rank", float_splits)


def main():
    mode = sys.argv[1]
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    chk = Checker(r)
    {"one_rank": one_rank, "groups": groups, "arguments": arguments, "torch_inputs": torch_inputs}[mode](chk, n, r)
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
