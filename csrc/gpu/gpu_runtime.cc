#include "gpu/gpu_runtime.h"

#include "gpu/gpu_loader.h"

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

Status Runtime::EnsureInitLocked(const CudaApi* cu) {
  if (initialized_) return init_status_;
  // cuInit happens here, at the first GPU tensor, not at init(): a process that never uses
  // a GPU (or forks workers first) is not touched.
  init_status_ = CudaStatus(cu->Init(0), "cuInit");
  int count = 0;
  if (init_status_.ok()) init_status_ = CudaStatus(cu->DeviceGetCount(&count), "cuDeviceGetCount");
  device_count_ = init_status_.ok() ? count : 0;
  initialized_ = true;  // cuInit's outcome does not change within a process
  return init_status_;
}

Status Runtime::InitDevice(int device) {
  const CudaApi* cu = api();
  if (!cu) return Status::Error(StatusCode::UNSUPPORTED_TYPE, Libraries::Get().problem());
  std::lock_guard<std::mutex> lock(mu_);
  if (contexts_.count(device)) return Status::Ok();
  Status st = EnsureInitLocked(cu);
  if (!st.ok()) return st;
  if (device < 0 || device >= device_count_)
    return Status::Error(StatusCode::INVALID_ARGUMENT, "GPU " + std::to_string(device) + " does not exist (the driver reports " +
                                                           std::to_string(device_count_) + " device(s))");
  CUdevice dev = 0;
  st = CudaStatus(cu->DeviceGet(&dev, device), "cuDeviceGet");
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
  const CudaApi* cu = api();
  if (!cu) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  return EnsureInitLocked(cu).ok() ? device_count_ : 0;
}

CUresult Runtime::QueryDevice(const CudaApi* cu, uintptr_t ptr, int* ordinal) {
  // The caller's own context (a framework's thread usually has one), or none: the device
  // ordinal needs no context with unified addressing, and asking in another device's
  // context would retain that device's primary context.
  CUresult r = cu->PointerGetAttribute(ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, static_cast<CUdeviceptr>(ptr));
  if (r == CUDA_SUCCESS) return r;
  CUcontext current = nullptr;
  if (cu->CtxGetCurrent(&current) == CUDA_SUCCESS && current) return r;  // asked in a context: that is the answer
  // No context on this thread and the driver wants one: the process's own device's (the
  // first GPU of the process when it has not used one yet).
  const int own = process_device_ >= 0 ? static_cast<int>(process_device_) : 0;
  ContextGuard guard(own);
  if (!guard.status().ok()) return r;
  return cu->PointerGetAttribute(ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, static_cast<CUdeviceptr>(ptr));
}

Status Runtime::ResolveDevice(uintptr_t ptr, int claimed, int* device) {
  const CudaApi* cu = api();
  if (!cu) return Status::Error(StatusCode::UNSUPPORTED_TYPE, Libraries::Get().problem());
  *device = claimed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status st = EnsureInitLocked(cu);
    if (!st.ok()) return st;
  }
  if (ptr == 0) {
    // An empty array owns no memory (__cuda_array_interface__ gives its pointer as 0):
    // it is on the framework's device, else this process's.
    if (claimed < 0) *device = process_device_;
    if (*device < 0)
      return Status::Error(StatusCode::INVALID_ARGUMENT, "an empty array with no data pointer does not say which GPU it is on");
    return InitDevice(*device);
  }
  if (claimed >= 0) {
    Status st = InitDevice(claimed);
    if (!st.ok()) return st;
  }
  int ordinal = -1;
  const CUresult r = QueryDevice(cu, ptr, &ordinal);
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
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  if (cu->MemAllocAsync && stream) {
    r = cu->MemAllocAsync(&buf->ptr_, n, stream);
    buf->stream_ordered_ = r == CUDA_SUCCESS;
    if (buf->stream_ordered_) buf->own_stream_ = stream;
  }
  if (r != CUDA_SUCCESS) r = cu->MemAlloc(&buf->ptr_, n);
  Status st = CudaStatus(r, "allocating " + std::to_string(bytes) + " bytes on GPU " + std::to_string(device));
  if (st.ok()) *out = std::move(buf);
  return st;
}

Status DeviceBuffer::CopyOf(const DeviceBuffer& src, uintptr_t stream, std::shared_ptr<DeviceBuffer>* out) {
  const CudaApi* cu = Runtime::Get().api();
  if (!cu) return Status::Error(StatusCode::UNSUPPORTED_TYPE, Libraries::Get().problem());
  const uintptr_t s = stream ? stream : kLegacyStream;
  std::shared_ptr<DeviceBuffer> copy;
  Status st = Allocate(src.device_, src.bytes_, StreamFromHandle(s), &copy);
  if (!st.ok()) return st;
  copy->own_stream_ = nullptr;  // a consumer's stream: never used to free (see set_consumer_stream)
  copy->set_consumer_stream(static_cast<int64_t>(s));
  copy->shape = src.shape;
  copy->dtype = src.dtype;
  ContextGuard guard(src.device_);
  if (!guard.status().ok()) return guard.status();
  st = CudaStatus(cu->MemcpyDtoDAsync(copy->ptr_, src.ptr_, static_cast<size_t>(src.bytes_), StreamFromHandle(s)),
                  "cuMemcpyDtoDAsync (a copy for __dlpack__)");
  if (st.ok()) *out = std::move(copy);
  return st;
}

void DeviceBuffer::set_consumer_stream(int64_t stream) {
  FreeOrder order = FreeOrder::kSynchronize;
  if (stream == 0 || stream == static_cast<int64_t>(kLegacyStream) || stream == static_cast<int64_t>(kPerThreadStream))
    order = FreeOrder::kLegacyStream;
  // The strictest order any consumer asked for wins (a buffer may be exported twice).
  int current = free_order_.load();
  while (current < static_cast<int>(order) && !free_order_.compare_exchange_weak(current, static_cast<int>(order))) {
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (!ptr_) return;
  const CudaApi* cu = Runtime::Get().api();
  ContextGuard guard(device_);
  if (!guard.status().ok()) return;  // the driver is gone (process exit): nothing to free
  CUstream order = own_stream_;
  switch (static_cast<FreeOrder>(free_order_.load())) {
    case FreeOrder::kOwnStream: break;
    case FreeOrder::kLegacyStream: order = StreamFromHandle(kLegacyStream); break;
    case FreeOrder::kSynchronize:
      // The consumer's stream may be gone: wait for all work on the device instead.
      cu->CtxSynchronize();
      order = StreamFromHandle(kLegacyStream);
      break;
  }
  if (stream_ordered_ && order && cu->MemFreeAsync && cu->MemFreeAsync(ptr_, order) == CUDA_SUCCESS) return;
  cu->MemFree(ptr_);  // not stream-ordered: cuMemFree waits for the device itself
}

}  // namespace gpu
}  // namespace collectives
