// Host memory for engine-allocated outputs and the fusion buffer.
#include "buffer_pool.h"

#include <cstdlib>
#include <map>
#include <mutex>

namespace collectives {
namespace {

// Recently freed large host buffers, reused by later allocations of the same size. Fresh
// large allocations are new mappings whose first touch page-faults (measured: 24 ms for a
// 64 MiB output); a training loop allocates the same sizes every step.
class BufferPool {
 public:
  static constexpr size_t kMinBytes = 1 << 20;
  static constexpr size_t kMaxCachedBytes = 512u << 20;

  void* Take(size_t bytes) {
    if (bytes >= kMinBytes) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        cached_ -= bytes;
        return p;
      }
    }
    void* p = nullptr;
    return posix_memalign(&p, 64, bytes) == 0 ? p : nullptr;
  }

  void Give(void* p, size_t bytes) {
    if (bytes >= kMinBytes) {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + bytes <= kMaxCachedBytes) {
        free_.emplace(bytes, p);
        cached_ += bytes;
        return;
      }
    }
    std::free(p);
  }

 private:
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0;
};

BufferPool& Pool() {
  static BufferPool* pool = new BufferPool();  // never destroyed: buffers may outlive statics
  return *pool;
}

size_t RoundedBytes(int64_t bytes) { return static_cast<size_t>(bytes < 64 ? 64 : ((bytes + 63) / 64) * 64); }

}  // namespace

HostBuffer::HostBuffer(int64_t bytes) : data_(Pool().Take(RoundedBytes(bytes))), size_(bytes) {}

HostBuffer::~HostBuffer() {
  if (data_) Pool().Give(data_, RoundedBytes(size_));
}


}  // namespace collectives
