#include "gpu_runtime.h"

#include "gpu_loader.h"

namespace collectives {
namespace gpu {

Status CudaStatus(CUresult result, const std::string& what) {
  if (result == CUDA_SUCCESS) return Status::Ok();
  const CudaApi* api = Libraries::Get().cuda();
  const char* name = nullptr;
  const char* text = nullptr;
  if (api) {
    api->GetErrorName(result, &name);
    api->GetErrorString(result, &text);
  }
  std::string msg = what + " failed: " + (name ? name : "CUDA error " + std::to_string(result));
  if (text) msg += std::string(" (") + text + ")";
  return Status::Error(StatusCode::INTERNAL, msg);
}

Event::~Event() { Runtime::Get().ReturnEvent(event_, device_); }

ContextGuard::ContextGuard(int device) {
  Runtime& rt = Runtime::Get();
  status_ = rt.InitDevice(device);
  if (!status_.ok()) return;
  status_ = CudaStatus(rt.api()->CtxPushCurrent(rt.Context(device)), "cuCtxPushCurrent");
  pushed_ = status_.ok();
}

ContextGuard::~ContextGuard() {
  if (!pushed_) return;
  CUcontext ignored;
  Runtime::Get().api()->CtxPopCurrent(&ignored);
}

Runtime& Runtime::Get() {
  static Runtime* rt = new Runtime();  // never destroyed: buffers may be freed during exit
  return *rt;
}

const CudaApi* Runtime::api() const { return Libraries::Get().cuda(); }

Status Runtime::InitDevice(int device) {
  const CudaApi* cu = api();
  if (!cu) return Status::Error(StatusCode::UNSUPPORTED_TYPE, Libraries::Get().problem());
  std::lock_guard<std::mutex> lock(mu_);
  if (contexts_.count(device)) return Status::Ok();
  if (!initialized_) {
    // cuInit happens here, at the first GPU tensor, not at init(): a process that never
    // uses a GPU (or forks workers first) is not touched.
    Status st = CudaStatus(cu->Init(0), "cuInit");
    if (!st.ok()) return st;
    int count = 0;
    st = CudaStatus(cu->DeviceGetCount(&count), "cuDeviceGetCount");
    if (!st.ok()) return st;
    device_count_ = count;
    initialized_ = true;
  }
  if (device < 0 || device >= device_count_)
    return Status::Error(StatusCode::INVALID_ARGUMENT, "GPU " + std::to_string(device) + " does not exist (the driver reports " +
                                                           std::to_string(device_count_) + " device(s))");
  CUdevice dev = 0;
  Status st = CudaStatus(cu->DeviceGet(&dev, device), "cuDeviceGet");
  if (!st.ok()) return st;
  CUcontext ctx = nullptr;
  st = CudaStatus(cu->DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  if (!st.ok()) return st;
  contexts_[device] = ctx;
  return Status::Ok();
}

CUcontext Runtime::Context(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = contexts_.find(device);
  return it == contexts_.end() ? nullptr : it->second;
}

int Runtime::DeviceCount() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (initialized_) return device_count_;
  }
  // InitDevice(0) runs cuInit; its outcome for device 0 does not matter here.
  InitDevice(0);
  std::lock_guard<std::mutex> lock(mu_);
  return initialized_ ? device_count_ : 0;
}

Status Runtime::ResolveDevice(uintptr_t ptr, int claimed, int* device) {
  const CudaApi* cu = api();
  if (!cu) return Status::Error(StatusCode::UNSUPPORTED_TYPE, Libraries::Get().problem());
  *device = claimed;
  // cuInit and a context to ask in (device 0 exists wherever any GPU does).
  Status st = InitDevice(claimed >= 0 ? claimed : 0);
  if (!st.ok()) return st;
  int ordinal = -1;
  CUresult r;
  {
    ContextGuard guard(claimed >= 0 ? claimed : 0);
    r = cu->PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, static_cast<CUdeviceptr>(ptr));
  }
  if (r != CUDA_SUCCESS) {
    // Memory the driver cannot place (some virtual-memory allocations): trust the framework.
    if (claimed >= 0) return Status::Ok();
    return Status::Error(StatusCode::INVALID_ARGUMENT,
                         "the array's data pointer is not GPU memory known to the CUDA driver (" +
                             CudaStatus(r, "cuPointerGetAttribute").message + ")");
  }
  if (claimed >= 0 && ordinal != claimed)
    return Status::Error(StatusCode::INVALID_ARGUMENT, "the tensor claims to be on GPU " + std::to_string(claimed) +
                                                           " but its memory is on GPU " + std::to_string(ordinal));
  *device = ordinal;
  return claimed >= 0 ? Status::Ok() : InitDevice(ordinal);
}

Status Runtime::NewEvent(int device, EventPtr* out) {
  CUevent e = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& pool = free_events_[device];
    if (!pool.empty()) {
      e = pool.back();
      pool.pop_back();
    }
  }
  if (!e) {
    ContextGuard guard(device);
    if (!guard.status().ok()) return guard.status();
    Status st = CudaStatus(api()->EventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    if (!st.ok()) return st;
  }
  out->reset(new Event(e, device));
  return Status::Ok();
}

void Runtime::ReturnEvent(CUevent e, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  free_events_[device].push_back(e);  // events are few (one per operation in flight): kept for reuse
}

Status Runtime::EngineStream(int device, CUstream* out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = streams_.find(device);
    if (it != streams_.end()) {
      *out = it->second;
      return Status::Ok();
    }
  }
  ContextGuard guard(device);
  if (!guard.status().ok()) return guard.status();
  int least = 0, greatest = 0;
  if (api()->CtxGetStreamPriorityRange(&least, &greatest) != CUDA_SUCCESS) greatest = 0;
  CUstream s = nullptr;
  Status st = CudaStatus(api()->StreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, greatest), "cuStreamCreateWithPriority");
  if (!st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  auto inserted = streams_.emplace(device, s);  // only the engine thread creates streams
  *out = inserted.first->second;
  return Status::Ok();
}

Status Runtime::RecordEvent(int device, uintptr_t stream, EventPtr* out) {
  Status st = NewEvent(device, out);
  if (!st.ok()) return st;
  ContextGuard guard(device);
  if (!guard.status().ok()) return guard.status();
  st = CudaStatus(api()->EventRecord((*out)->get(), StreamFromHandle(stream)),
                  "cuEventRecord on the producer's stream " + std::to_string(stream));
  if (!st.ok()) out->reset();
  return st;
}

Status DeviceBuffer::Allocate(int device, int64_t bytes, CUstream stream, std::shared_ptr<DeviceBuffer>* out) {
  const CudaApi* cu = Runtime::Get().api();
  if (!cu) return Status::Error(StatusCode::UNSUPPORTED_TYPE, Libraries::Get().problem());
  ContextGuard guard(device);
  if (!guard.status().ok()) return guard.status();
  std::shared_ptr<DeviceBuffer> buf(new DeviceBuffer());
  buf->device_ = device;
  buf->bytes_ = bytes;
  const size_t n = static_cast<size_t>(bytes > 0 ? bytes : 1);  // a valid pointer even when empty
  CUresult r = 1;
  if (cu->MemAllocAsync && stream) {
    r = cu->MemAllocAsync(&buf->ptr_, n, stream);
    buf->stream_ordered_ = r == CUDA_SUCCESS;
  }
  if (r != CUDA_SUCCESS) r = cu->MemAlloc(&buf->ptr_, n);
  Status st = CudaStatus(r, "allocating " + std::to_string(bytes) + " bytes on GPU " + std::to_string(device));
  if (st.ok()) *out = std::move(buf);
  return st;
}

DeviceBuffer::~DeviceBuffer() {
  if (!ptr_) return;
  const CudaApi* cu = Runtime::Get().api();
  ContextGuard guard(device_);
  if (!guard.status().ok()) return;  // the driver is gone (process exit): nothing to free
  uintptr_t s = free_stream_;
  if (s == 0x2) s = kLegacyStream;  // a per-thread stream names the thread that frees, not the consumer's
  // Stream-ordered memory is freed after the consumer's queued work; other memory with
  // cuMemFree, which waits for the device.
  if (stream_ordered_ && cu->MemFreeAsync && cu->MemFreeAsync(ptr_, StreamFromHandle(s)) == CUDA_SUCCESS) return;
  cu->MemFree(ptr_);
}

}  // namespace gpu
}  // namespace collectives
