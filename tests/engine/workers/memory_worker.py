"""Host memory of the engine: the bounded buffer pool, and resident memory under many ops.

  memory_worker.py pool LIMIT_BYTES    focused checks of the pool (np=2), the limit the
                                       engine should have been configured with
  memory_worker.py soak OPS SEED       OPS mixed collectives of sizes from bytes to a few
                                       MiB (mixed_ops.py, np=3), every result checked, RSS
                                       bounded

Every rank prints "[rank R] N passed, M failed" (Checker) and, in soak mode, one line
"[rank R] memory: ..." with the figures the test parses.
"""
import ctypes
import gc
import sys
import time

import numpy as np
import psutil

import collectives as hvd
from collectives._loader import engine_module
from collectives.arrays import aligned_empty
from common import Checker
from mixed_ops import MixedOps

MiB = 2**20
PROCESS = psutil.Process()
LIBC = ctypes.CDLL("libc.so.6")


def raw_rss():
    return PROCESS.memory_info().rss


def rss():
    """Resident bytes held by live objects and caches, without glibc's free heap memory.

    glibc keeps freed blocks in its heap for reuse, and with its dynamic mmap threshold that
    includes the harness's own numpy temporaries of up to a few MiB (measured: 27-40 MiB free
    in its arenas after a few thousand ops, with or without the engine's pool). malloc_trim
    returns those free pages; it frees nothing in use, so a leak or a cache still shows."""
    gc.collect()
    LIBC.malloc_trim(0)
    return raw_rss()


def stats():
    return engine_module().buffer_pool_stats()


# ====================================================================== pool mode

def pool_checks(chk, r, n, limit):
    chk.check("the engine configured the pool's limit", lambda: _limit_is(limit))
    if limit >= 4 * MiB:
        chk.check("an output of a slightly different size reuses a released buffer (size classes)", _size_class_reuse)
        chk.check("a training loop's repeated outputs map no fresh memory after the first step",
                  lambda: _training_loop_reuses(r, n))
        chk.check("the least recently released buffers go first; the newest stay",
                  lambda: _lru_eviction(limit))
        chk.check("a buffer larger than the limit is not kept and evicts nothing",
                  lambda: _larger_than_limit(limit))
    else:
        chk.check("with a limit of 0 nothing is kept", lambda: _nothing_kept(r, n))
    chk.check("allgathers of varying 1-3 MiB sizes stay within the limit", lambda: _varying_allgathers(r, n, limit))


def _limit_is(limit):
    s = stats()
    assert s["limit_bytes"] == limit, f"engine's pool limit {s['limit_bytes']}, expected {limit}"


def _size_class_reuse():
    a = aligned_empty((1_000_000,), np.uint8)
    a[:] = 1
    address = a.ctypes.data
    del a
    before = stats()
    b = aligned_empty((1_040_000,), np.uint8)  # 1,000,000 and 1,040,000 bytes: both in the 1 MiB class
    after = stats()
    assert b.nbytes == 1_040_000, "the array must have the requested size, not its class's"
    assert after["hits"] == before["hits"] + 1 and after["misses"] == before["misses"], (before, after)
    assert b.ctypes.data == address, "the released buffer was not reused"
    assert b.ctypes.data % 64 == 0
    del b
    c = aligned_empty((1_300_000,), np.uint8)  # the 1.5 MiB class: the idle 1 MiB buffer is too small
    assert stats()["misses"] == after["misses"] + 1 and c.ctypes.data != address
    del c


def _training_loop_reuses(r, n):
    sizes = [300_000, 1_000_000, 2_500_000]  # bytes of float32 inputs of each step's allgathers
    misses = []
    for step in range(12):
        outs = []
        for k, size in enumerate(sizes):
            x = np.full(size // 4, r + k, np.float32)
            outs.append(hvd.allgather(x, name=f"loop.allgather.{k}"))
        y = np.full(1_000_000, float(r), np.float32)
        outs.append(hvd.allreduce(y, op=hvd.Sum, name="loop.allreduce"))
        for k, size in enumerate(sizes):
            expected = np.concatenate([np.full(size // 4, p + k, np.float32) for p in range(n)])
            assert np.array_equal(outs[k], expected), f"step {step}: allgather {k} wrong"
        assert np.all(outs[-1] == sum(range(n))), f"step {step}: allreduce wrong"
        del outs  # the step's outputs are released before the next step, as in training
        misses.append(stats()["misses"])
    assert misses[-1] == misses[1], f"fresh mappings after the first steps (misses per step: {misses})"


def _lru_eviction(limit):
    # 14/32, 12/32 and 10/32 of a power-of-two limit: three size classes (1.75, 1.5 and 1.25
    # times a power of two), all three more than the limit, any two within it.
    sizes = [limit // 32 * k for k in (14, 12, 10)]
    filler = _empty_the_pool(limit)
    bufs = [aligned_empty((s,), np.uint8) for s in sizes]
    for b in bufs:
        b[::4096] = 7
    before = stats()
    del b
    while bufs:
        bufs.pop(0)  # released oldest first
    s = stats()
    assert s["idle_bytes"] == sizes[1] + sizes[2], f"expected the two newest kept: {s}"
    assert s["evictions"] == before["evictions"] + 1, f"expected the oldest evicted: {before} -> {s}"
    kept = [aligned_empty((size,), np.uint8) for size in sizes[1:]]
    s2 = stats()
    assert s2["hits"] == s["hits"] + 2, f"the most recently released buffers were not kept: {s} -> {s2}"
    del kept, filler


def _empty_the_pool(limit):
    """Releasing a buffer of the limit's size evicts every other idle one; taking it back
    leaves the pool empty. Returns it: the caller holds it while the pool must stay empty."""
    a = aligned_empty((limit,), np.uint8)
    del a
    b = aligned_empty((limit,), np.uint8)
    s = stats()
    assert s["idle_bytes"] == 0, s
    return b


def _larger_than_limit(limit):
    before = stats()
    big = aligned_empty((limit + MiB,), np.uint8)
    big[::4096] = 1
    del big
    after = stats()
    assert after["idle_bytes"] == before["idle_bytes"] and after["evictions"] == before["evictions"], (before, after)


def _nothing_kept(r, n):
    for i in range(20):
        out = hvd.allgather(np.full(300_000 + i, r, np.uint8), name="nothing.kept")
        assert out.shape == ((300_000 + i) * n,)
        del out
        s = stats()
        assert s["idle_bytes"] == 0 and s["idle_buffers"] == 0 and s["hits"] == 0, s


def _varying_allgathers(r, n, limit):
    """The case that grew a rank from 60 to 610 MiB: every allgather's size differs."""
    start = rss()
    peak_idle = 0
    peak = start
    for i in range(200):
        rows = [int(np.random.default_rng([i, p]).integers(MiB, 3 * MiB)) // 4 for p in range(n)]
        x = np.full(rows[r], r + 1, np.float32)
        out = hvd.allgather(x, name=f"varying.{i % 5}")
        starts = np.cumsum([0] + rows)
        for p in range(n):
            piece = out[starts[p]:starts[p + 1]]
            assert piece.shape == (rows[p],) and piece[0] == p + 1 and piece[-1] == p + 1, f"op {i}: rank {p}'s part"
        del out, x
        if i % 10 == 0:
            peak_idle = max(peak_idle, stats()["idle_bytes"])
            peak = max(peak, rss())
    peak = max(peak, rss())
    growth = (peak - start) / MiB
    print(f"[rank {r}] varying allgathers: RSS {start / MiB:.0f} -> peak {peak / MiB:.0f} MiB (+{growth:.1f}), "
          f"idle at most {peak_idle / MiB:.1f} MiB", flush=True)
    assert peak_idle <= limit, f"idle buffers {peak_idle} over the limit {limit}"
    # The limit, one op's buffers (input, output, numpy temporaries) and slack for malloc.
    allowed = limit / MiB + 3 * n + 24
    assert growth < allowed, f"RSS grew by {growth:.1f} MiB (allowed {allowed:.0f})"


def shutdown_checks(chk, r):
    """Shutdown unmaps every idle buffer; one still held is freed when released."""
    held = hvd.allgather(np.full(MiB, r, np.uint8), name="held.over.shutdown")
    held[:] = 1
    before, rss_before = stats(), rss()
    # Any rank's shutdown() stops every rank's engine: none may start before all have measured.
    hvd.allreduce(np.zeros(1), op=hvd.Sum, name="measured.before.shutdown")
    hvd.shutdown()
    after, rss_after = stats(), rss()
    print(f"[rank {r}] shutdown: idle {before['idle_bytes'] / MiB:.1f} MiB -> {after['idle_bytes'] / MiB:.1f}, "
          f"RSS {rss_before / MiB:.0f} -> {rss_after / MiB:.0f} MiB", flush=True)

    def released():
        assert after["limit_bytes"] == 0 and after["idle_bytes"] == 0 and after["idle_buffers"] == 0, after
        # The memory really goes back to the system (their touched pages; classes round up to 25%).
        dropped = rss_before - rss_after
        assert dropped >= 0.5 * before["idle_bytes"], f"RSS dropped by {dropped} for {before['idle_bytes']} idle"

    def held_is_freed():
        assert after["in_use_buffers"] >= 1, after
        nonlocal held
        held = None
        s = stats()
        assert s["idle_bytes"] == 0 and s["in_use_buffers"] == after["in_use_buffers"] - 1, s
    chk.check("shutdown() unmaps every idle buffer", released)
    chk.check("a buffer released after shutdown() is freed, not kept", held_is_freed)


# ====================================================================== soak mode

def soak(chk, r, n, ops, seed):
    """Rounds of mixed ops until `ops` are done; RSS sampled every 500 ops."""
    limit = stats()["limit_bytes"]
    before, raw_before = rss(), raw_rss()
    raw_peak = raw_before  # without malloc_trim, for information
    samples = []  # (RSS, idle bytes)
    counts = {}
    mixed = MixedOps(seed, r, n)
    start = time.monotonic()

    def run():
        nonlocal raw_peak
        done, next_sample = 0, 500
        while done < ops:
            try:
                done += mixed.round(counts)
            except AssertionError as e:
                raise AssertionError(f"after {done} ops: {e}") from None
            if done >= next_sample:
                next_sample += 500
                raw_peak = max(raw_peak, raw_rss())
                samples.append((rss(), stats()["idle_bytes"]))
                if len(samples) % 10 == 0:
                    print(f"[rank {r}] {done} ops, {time.monotonic() - start:.0f} s, RSS {samples[-1][0] / MiB:.0f} MiB",
                          flush=True)
    chk.check(f"{ops} mixed ops, each checked against numpy", run)
    elapsed = time.monotonic() - start
    end = rss()
    # With every result released, the only pooled buffer still in use is the fusion buffer.
    fusion = stats()["in_use_bytes"]
    peak = max([end] + [s[0] for s in samples])
    peak_idle = max([0] + [s[1] for s in samples])
    growth = (peak - before) / MiB
    print(f"[rank {r}] memory: RSS before {before / MiB:.1f} MiB, peak {peak / MiB:.1f}, end {end / MiB:.1f} "
          f"(+{growth:.1f} MiB); fusion buffer {fusion / MiB:.1f} MiB; pool idle at most {peak_idle / MiB:.1f} "
          f"MiB of {limit / MiB:.0f}; untrimmed RSS {raw_before / MiB:.1f} -> peak {raw_peak / MiB:.1f} MiB", flush=True)
    print(f"[rank {r}] {sum(counts.values())} ops in {elapsed:.1f} s: {counts}; pool {stats()}", flush=True)

    def bounded():
        assert len(samples) >= ops // 500, f"{len(samples)} samples"
        assert peak_idle <= limit, f"idle buffers {peak_idle} over the limit {limit}"
        assert growth < 64 + fusion / MiB, f"RSS grew by {growth:.1f} MiB, more than 64 MiB beyond the fusion buffer"
    chk.check("RSS grows by less than 64 MiB beyond the fusion buffer", bounded)
    return before


def main():
    mode = sys.argv[1]
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    chk = Checker(r)
    if mode == "pool":
        pool_checks(chk, r, n, int(sys.argv[2]))
        shutdown_checks(chk, r)
    elif mode == "soak":
        before = soak(chk, r, n, int(sys.argv[2]), int(sys.argv[3]))
        shutdown_checks(chk, r)
        after = rss()
        print(f"[rank {r}] memory: RSS after shutdown {after / MiB:.1f} MiB ({(after - before) / MiB:+.1f})",
              flush=True)
    else:
        raise SystemExit(f"unknown mode {mode}")
    chk.finish()


if __name__ == "__main__":
    main()
