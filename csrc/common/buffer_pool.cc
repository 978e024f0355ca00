// Host memory for engine-allocated outputs and the fusion buffer.
//
// Why a pool: a fresh large buffer is a new mapping whose first touch page-faults (measured:
// 24 ms for a 64 MiB output), and a training loop allocates the same sizes every step. Why it
// is bounded and trimmed: an unbounded cache of exact sizes grew a rank by hundreds of MiB
// under varying sizes. So: size classes (varying sizes share buffers), a byte limit on idle
// buffers with least-recently-released eviction, and buffers that are their own mappings, so
// that releasing one returns its memory to the system at once (malloc might keep it in an
// arena, where it stays resident).
#include "common/buffer_pool.h"

#include <pthread.h>
#include <sys/mman.h>

#include <cstdlib>
#include <iterator>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace collectives {
namespace {

uint64_t RoundUp(uint64_t n, uint64_t step) { return (n + step - 1) / step * step; }

int FloorLog2(uint64_t n) { return 63 - __builtin_clzll(n); }

constexpr uint64_t kHugePage = 2u << 20;

// A fresh mapping of `bytes` (page-aligned, so 64-byte aligned). Large ones start on a 2 MiB
// boundary and ask for transparent huge pages: their first touch then faults once per 2 MiB
// instead of once per 4 KiB (measured: a fresh 64 MiB copy costs 31 ms with small pages,
// 14 ms with huge ones, 7 ms when reused), which is what a buffer the pool cannot keep costs.
void* MapBytes(uint64_t bytes) {
  const bool huge = bytes >= 2 * kHugePage;
  const uint64_t span = huge ? bytes + kHugePage : bytes;
  void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (!huge) return p;
  // Keep the aligned `bytes` in the middle; unmap the slack on either side.
  const uintptr_t base = reinterpret_cast<uintptr_t>(p);
  const uintptr_t start = RoundUp(base, kHugePage);
  if (start > base) munmap(p, start - base);
  const uintptr_t end = start + bytes;
  if (base + span > end) munmap(reinterpret_cast<void*>(end), base + span - end);
  madvise(reinterpret_cast<void*>(start), bytes, MADV_HUGEPAGE);  // advice only: failure is harmless
  return reinterpret_cast<void*>(start);
}

void Unmap(void* p, uint64_t bytes) { munmap(p, bytes); }

class BufferPool {
 public:
  BufferPool() {
    // A child forked while another thread held the lock would otherwise deadlock on its first
    // release: take the lock around fork() and hand both sides an unlocked mutex.
    pthread_atfork([] { Get().mu_.lock(); }, [] { Get().mu_.unlock(); }, [] { Get().mu_.unlock(); });
  }

  static BufferPool& Get() {
    static BufferPool* pool = new BufferPool();  // never destroyed: buffers may outlive statics
    return *pool;
  }

  void* Take(uint64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = by_class_.find(bytes);
      if (it != by_class_.end() && !it->second.empty()) {
        // The most recently released buffer of the class: the likeliest to be in cache.
        auto entry = it->second.back();
        it->second.pop_back();
        void* p = entry->data;
        lru_.erase(entry);
        idle_bytes_ -= bytes;
        stats_.hits++;
        NoteInUse(bytes, +1);
        return p;
      }
      stats_.misses++;
    }
    void* p = MapBytes(bytes);
    if (p) {
      std::lock_guard<std::mutex> lock(mu_);
      NoteInUse(bytes, +1);
    }
    return p;
  }

  void Give(void* p, uint64_t bytes) {
    std::vector<Idle> victims;
    {
      std::lock_guard<std::mutex> lock(mu_);
      NoteInUse(bytes, -1);
      if (bytes <= limit_) {
        EvictDownTo(limit_ - bytes, &victims);
        lru_.push_front(Idle{p, bytes});
        by_class_[bytes].push_back(lru_.begin());
        idle_bytes_ += bytes;
        p = nullptr;
      }
    }
    // Unmapping takes a while for large buffers: outside the lock.
    for (const Idle& v : victims) Unmap(v.data, v.bytes);
    if (p) Unmap(p, bytes);
  }

  void SetLimit(uint64_t limit) {
    std::vector<Idle> victims;
    {
      std::lock_guard<std::mutex> lock(mu_);
      limit_ = limit;
      EvictDownTo(limit_, &victims);
    }
    for (const Idle& v : victims) Unmap(v.data, v.bytes);
  }

  BufferPoolStats Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    BufferPoolStats s = stats_;
    s.limit_bytes = static_cast<int64_t>(limit_);
    s.idle_bytes = static_cast<int64_t>(idle_bytes_);
    s.idle_buffers = static_cast<int64_t>(lru_.size());
    return s;
  }

 private:
  struct Idle {
    void* data;
    uint64_t bytes;
  };

  // Under mu_: moves the least recently released idle buffers to `victims` until at most
  // `target` idle bytes remain.
  void EvictDownTo(uint64_t target, std::vector<Idle>* victims) {
    while (idle_bytes_ > target) {
      auto oldest = std::prev(lru_.end());
      // A class's entries are appended in release order, so its oldest is the front one.
      auto& entries = by_class_[oldest->bytes];
      entries.erase(entries.begin());
      if (entries.empty()) by_class_.erase(oldest->bytes);
      idle_bytes_ -= oldest->bytes;
      victims->push_back(*oldest);
      lru_.erase(oldest);
      stats_.evictions++;
    }
  }

  void NoteInUse(uint64_t bytes, int sign) {
    stats_.in_use_bytes += sign * static_cast<int64_t>(bytes);
    stats_.in_use_buffers += sign;
  }

  std::mutex mu_;
  uint64_t limit_ = 0;  // nothing is kept until an engine configures the pool
  uint64_t idle_bytes_ = 0;
  std::list<Idle> lru_;  // idle buffers, most recently released first
  std::unordered_map<uint64_t, std::vector<std::list<Idle>::iterator>> by_class_;  // oldest first
  BufferPoolStats stats_;
};

}  // namespace

uint64_t BufferSizeClass(int64_t bytes) {
  if (bytes < kPooledMinBytes) return RoundUp(static_cast<uint64_t>(bytes < 64 ? 64 : bytes), 64);
  // Quarter octaves: at most 25% more than asked for (powers of two would waste up to half),
  // and still only four classes per doubling, so that varying sizes keep hitting the same few
  // buffers. Every class is a multiple of 32 KiB, hence of the page size.
  const uint64_t n = static_cast<uint64_t>(bytes);
  return RoundUp(n, (uint64_t{1} << FloorLog2(n)) / 4);
}

HostBuffer::HostBuffer(int64_t bytes) : size_(bytes), capacity_(BufferSizeClass(bytes)) {
  if (bytes >= kPooledMinBytes) {
    data_ = BufferPool::Get().Take(capacity_);
  } else if (posix_memalign(&data_, 64, capacity_) != 0) {
    data_ = nullptr;
  }
}

HostBuffer::~HostBuffer() {
  if (!data_) return;
  if (size_ >= kPooledMinBytes) {
    BufferPool::Get().Give(data_, capacity_);
  } else {
    std::free(data_);
  }
}

void SetBufferPoolLimit(int64_t bytes) { BufferPool::Get().SetLimit(bytes > 0 ? static_cast<uint64_t>(bytes) : 0); }

BufferPoolStats GetBufferPoolStats() { return BufferPool::Get().Stats(); }

}  // namespace collectives
