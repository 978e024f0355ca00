// Engine-owned host memory: 64-byte aligned buffers drawn from a process-wide pool.
#pragma once
#include <cstdint>

namespace collectives {

// 64-byte aligned host memory owned by the engine (outputs whose size is known only after
// negotiation, and the fusion buffer). 64 bytes: what TensorFlow requires of borrowed memory.
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
};

}  // namespace collectives
