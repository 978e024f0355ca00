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

#include "gpu/gpu_api.h"
#include "common/status.h"
#include "common/types.h"

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
  // Devices the driver reports (cuInit and cuDeviceGetCount only: no context is retained,
  // so counting does not cost every process memory on GPU 0). 0 when there is no driver.
  int DeviceCount();

  // The GPU this process uses (engine::gpu_device once a GPU tensor fixed it; -1 before).
  void SetProcessDevice(int device) { process_device_ = device; }
  int process_device() const { return process_device_; }

  // The device that owns `ptr`. `claimed` >= 0: the framework's answer, checked against the
  // driver's when the driver can tell; -2: unknown, the driver must tell. The driver is
  // asked in the caller's current context, else without one, else in the process's own
  // device's context: never in another device's (retaining one costs memory on it).
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
  Status EnsureInitLocked(const CudaApi* cu);
  CUresult QueryDevice(const CudaApi* cu, uintptr_t ptr, int* ordinal);

  std::mutex mu_;
  bool initialized_ = false;
  int device_count_ = -1;
  Status init_status_;
  std::atomic<int> process_device_{-1};
  std::unordered_map<int, CUcontext> contexts_;
  std::unordered_map<int, std::vector<CUevent>> free_events_;
  std::unordered_map<int, CUstream> streams_;
};

// Device memory owned by the engine: fusion buffers, and outputs whose size is known only
// after negotiation (allgather, alltoall), which frameworks adopt through DLPack.
//
// Freeing: memory nobody outside the engine saw is freed in the order of the stream it
// was allocated on (the engine's, which lives as long as the process). Memory handed to a
// consumer may still be read by work the consumer queued before it let go, on the stream
// it named when adopting: the legacy default stream (which waits for every blocking
// stream, per-thread default streams included) is always valid, so it frees there; any
// other stream may have been destroyed by then, so the device is synchronized first.
class DeviceBuffer {
 public:
  // Stream-ordered on `stream` when the driver has memory pools (cuMemAllocAsync), else cuMemAlloc.
  static Status Allocate(int device, int64_t bytes, CUstream stream, std::shared_ptr<DeviceBuffer>* out);
  // A copy of `src` (same shape and dtype), ordered on `stream` (a consumer's stream: 1, 2,
  // or a stream handle valid now).
  static Status CopyOf(const DeviceBuffer& src, uintptr_t stream, std::shared_ptr<DeviceBuffer>* out);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr_)); }
  int64_t size() const { return bytes_; }
  int device() const { return device_; }
  // A consumer adopted the buffer (DLPack) and uses it on `stream` (1: legacy default,
  // 2: per-thread default, other: a stream handle, -1: unknown).
  void set_consumer_stream(int64_t stream);
  // Exported without a stream (__cuda_array_interface__): any stream may read it.
  void set_consumer_unknown() { set_consumer_stream(-1); }

  // What the buffer holds, for __dlpack__ and __cuda_array_interface__.
  std::vector<int64_t> shape;
  DataType dtype = DataType::UINT8;

 private:
  // How the memory is freed (see the class comment).
  enum class FreeOrder : int { kOwnStream = 0, kLegacyStream = 1, kSynchronize = 2 };

  DeviceBuffer() = default;
  CUdeviceptr ptr_ = 0;
  int64_t bytes_ = 0;
  int device_ = 0;
  bool stream_ordered_ = false;
  CUstream own_stream_ = nullptr;  // allocated in this stream's order (a stream that is never destroyed)
  std::atomic<int> free_order_{static_cast<int>(FreeOrder::kOwnStream)};
};

}  // namespace gpu
}  // namespace collectives
