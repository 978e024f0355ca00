// Engine-owned host memory: 64-byte aligned buffers, the larger ones drawn from a bounded
// process-wide pool of recently released buffers.
#pragma once
#include <cstdint>

namespace collectives {

// 64-byte aligned host memory owned by the engine (outputs whose size is known only after
// negotiation, aligned outputs made for Python, and the fusion buffer). 64 bytes: what
// TensorFlow requires of borrowed memory. Buffers of kPooledMinBytes or more come from the
// pool and may be larger than asked for (a size class); size() is what was asked for.
class HostBuffer {
 public:
  explicit HostBuffer(int64_t bytes);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  int64_t size_ = 0;
  uint64_t capacity_ = 0;  // bytes actually allocated
};

// Below this size buffers come from malloc, whose arenas already reuse small blocks without
// page faults (it is glibc's default mmap threshold); from here on they are pooled mappings.
constexpr int64_t kPooledMinBytes = 128 * 1024;

// The size class a request of `bytes` is served from: below kPooledMinBytes the request
// rounded up to 64 bytes; above, quarter octaves (2^k times 1, 1.25, 1.5 or 1.75).
uint64_t BufferSizeClass(int64_t bytes);

// The most bytes of idle (released, not yet reused) buffers the pool keeps; the least
// recently released ones beyond it are unmapped at once. 0 keeps none and releases
// everything idle now: the engine's shutdown does that, so a shut-down process holds nothing.
void SetBufferPoolLimit(int64_t bytes);

struct BufferPoolStats {
  int64_t limit_bytes = 0;
  int64_t idle_bytes = 0;     // kept for reuse
  int64_t idle_buffers = 0;
  int64_t in_use_bytes = 0;   // pooled-size buffers handed out and not yet released
  int64_t in_use_buffers = 0;
  int64_t hits = 0;           // requests served by an idle buffer
  int64_t misses = 0;         // requests that mapped fresh memory
  int64_t evictions = 0;      // idle buffers unmapped to stay within the limit
};
BufferPoolStats GetBufferPoolStats();

}  // namespace collectives
