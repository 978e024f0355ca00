// Process-wide GPU state shared by the threads that submit tensors and the engine: each
// device's primary context (the one PyTorch and CuPy use), pooled events, the check of a
// pointer's device, and engine-owned device memory. Everything here is thread-safe and
// works through the driver API loaded by gpu_loader.cc.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpu_api.h"
#include "status.h"
#include "types.h"

namespace collectives {
namespace gpu {

// "what failed: CUDA_ERROR_X (the driver's text)" as an INTERNAL status (OK for CUDA_SUCCESS).
Status CudaStatus(CUresult result, const std::string& what);

// A pooled CUDA event of one device; going out of scope returns it to the pool.
class Event {
 public:
  Event(CUevent e, int device) : event_(e), device_(device) {}
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  CUevent get() const { return event_; }
  int device() const { return device_; }

 private:
  CUevent event_;
  int device_;
};
using EventPtr = std::shared_ptr<Event>;

// Makes a device's primary context current on this thread for a scope and restores the
// caller's afterwards (push/pop), so a framework thread's own context choice is untouched.
class ContextGuard {
 public:
  explicit ContextGuard(int device);
  ~ContextGuard();
  const Status& status() const { return status_; }

 private:
  Status status_;
  bool pushed_ = false;
};

class Runtime {
 public:
  static Runtime& Get();

  // The driver table, or null when the libraries are not loaded.
  const CudaApi* api() const;
  // cuInit (once) and the device's primary context (retained for the process's life: memory
  // handed to frameworks must stay valid). Cheap after the first call for a device.
  Status InitDevice(int device);
  CUcontext Context(int device);
  int DeviceCount();

  // The device that owns `ptr`. `claimed` >= 0: the framework's answer, checked against the
  // driver's when the driver can tell; -2: unknown, the driver must tell.
  Status ResolveDevice(uintptr_t ptr, int claimed, int* device);
  // An event recorded now on `stream` (a producer's stream, 0/1/2 as CUDA defines them).
  Status RecordEvent(int device, uintptr_t stream, EventPtr* out);
  // An unrecorded pooled event of `device`.
  Status NewEvent(int device, EventPtr* out);
  void ReturnEvent(CUevent e, int device);
  // The engine's stream on `device`: non-blocking, of the highest priority (so that NCCL
  // kernels get the SMs while backward kernels keep coming), created once per process and
  // never destroyed (buffers handed out may free on it after an engine has shut down).
  Status EngineStream(int device, CUstream* out);

 private:
  Runtime() = default;
  std::mutex mu_;
  bool initialized_ = false;
  int device_count_ = -1;
  std::unordered_map<int, CUcontext> contexts_;
  std::unordered_map<int, std::vector<CUevent>> free_events_;
  std::unordered_map<int, CUstream> streams_;
};

// Device memory owned by the engine: fusion buffers, and outputs whose size is known only
// after negotiation (allgather, alltoall), which frameworks adopt through DLPack.
class DeviceBuffer {
 public:
  // Stream-ordered on `stream` when the driver has memory pools (cuMemAllocAsync), else cuMemAlloc.
  static Status Allocate(int device, int64_t bytes, CUstream stream, std::shared_ptr<DeviceBuffer>* out);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr_)); }
  int64_t size() const { return bytes_; }
  int device() const { return device_; }
  // The stream whose work must finish before the memory is reused: the consumer's stream,
  // as a framework's caching allocator would record it (set when a framework adopts the
  // buffer; the legacy default stream until then).
  void set_free_stream(uintptr_t stream) { free_stream_ = stream; }

  // What the buffer holds, for __dlpack__ and __cuda_array_interface__.
  std::vector<int64_t> shape;
  DataType dtype = DataType::UINT8;

 private:
  DeviceBuffer() = default;
  CUdeviceptr ptr_ = 0;
  int64_t bytes_ = 0;
  int device_ = 0;
  bool stream_ordered_ = false;
  std::atomic<uintptr_t> free_stream_{kLegacyStream};
};

}  // namespace gpu
}  // namespace collectives
