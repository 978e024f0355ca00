"""Where the sharded optimizer (zero_optimizer.py) packs a bucket's gradients for its
reducescatter: memory allocated once and reused step after step, never fresh per step.

Why: on CPU, copying into freshly allocated memory costs about 9x copying into memory already
written (page faults: a 66 MB ``torch.empty().copy_()`` 252 ms vs 28 ms reused here, docs/zero.md),
and a step packs a model's worth of gradients.

* Stage 1 keeps one persistent flat buffer per bucket (the full gradients persist at stage 1
  anyway, as ``p.grad``). After packing, each ``p.grad`` is re-pointed at its slice of the buffer
  (as DDP's ``gradient_as_bucket_view``): the next backward then accumulates straight into the
  buffer when the gradients were zeroed in place (``zero_grad(set_to_none=False)``) or kept
  (``backward_passes_per_step``), and packing copies nothing.
* Stage 2 keeps only a small pool, at most ``POOL_BUFFERS`` buffers per device (each the size of
  the largest bucket, viewed as the bucket's dtype): a bucket takes a free one, and when all are in flight the oldest
  reducescatter is finished first to free its buffer. So what persists between steps beyond the
  1/N shards is bounded by ``POOL_BUFFERS`` buckets, and communication still overlaps backward.

A buffer is the input of a running reducescatter until that is waited: it is handed out again
only after ``release``. After an error a reducescatter may still be running on it (the engine
keeps its input alive): ``discard`` forgets it, and a new one is allocated.
"""
import torch

POOL_BUFFERS = 2


class PersistentBuffers:
    """Stage 1: one buffer per bucket, allocated (and so faulted in) at the first use."""

    def __init__(self, buckets):
        self._buckets = buckets
        self._buffers = [None] * len(buckets)

    def take(self, b, finish_oldest):
        buf = self._buffers[b]
        if buf is None:
            bucket = self._buckets[b]
            buf = self._buffers[b] = torch.zeros(bucket.length, dtype=bucket.dtype, device=bucket.device)
        return buf

    def release(self, b):
        pass

    def discard(self, b):
        self._buffers[b] = None

    views_as_grads = True


class BufferPool:
    """Stage 2: at most ``limit`` buffers per device, reused by whichever bucket packs next. Each
    is as many bytes as the largest bucket and is viewed as the bucket's dtype, so buckets of
    every size and dtype share them and none is ever replaced."""

    def __init__(self, buckets, limit=POOL_BUFFERS):
        self._buckets = buckets
        self._limit = max(1, int(limit))
        self._bytes = {}       # device -> the largest bucket's bytes
        for bucket in buckets:
            nbytes = bucket.length * bucket.dtype.itemsize
            self._bytes[bucket.device] = max(self._bytes.get(bucket.device, 0), nbytes)
        self._free = {d: [] for d in self._bytes}    # device -> buffers (uint8) not in use
        self._in_use = {}      # bucket -> its buffer, until its reducescatter is waited

    def take(self, b, finish_oldest):
        """The bucket's flat tensor, in a free buffer. ``finish_oldest()`` waits for the oldest
        running reducescatter, which releases its buffer."""
        bucket = self._buckets[b]
        while sum(1 for x in self._in_use.values() if x.device == bucket.device) >= self._limit:
            finish_oldest()
        free = self._free[bucket.device]
        buf = free.pop() if free else torch.zeros(self._bytes[bucket.device], dtype=torch.uint8,
                                                  device=bucket.device)
        self._in_use[b] = buf
        itemsize = bucket.dtype.itemsize
        return buf[:bucket.length * itemsize].view(bucket.dtype)

    def release(self, b):
        buf = self._in_use.pop(b, None)
        if buf is not None:
            self._free[buf.device].append(buf)

    def discard(self, b):
        self._in_use.pop(b, None)

    views_as_grads = False


def grad_buffers(stage, buckets):
    return PersistentBuffers(buckets) if stage == 1 else BufferPool(buckets)
