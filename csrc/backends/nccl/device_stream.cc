// The engine's stream on the GPU and the engine thread's copies on it (device_stream.h).
#include "backends/nccl/device_stream.h"

#include "gpu/gpu_copy_batch.h"
#include "gpu/gpu_loader.h"
#include "common/log.h"

namespace collectives {
namespace {

using gpu::CudaStatus;

gpu::CUdeviceptr Dev(const void* p) { return static_cast<gpu::CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }

}  // namespace

Status DeviceStream::Start(const gpu::CudaApi* cu, int device) {
  cu_ = cu;
  gpu::Runtime& rt = gpu::Runtime::Get();
  Status st = rt.InitDevice(device);
  if (!st.ok()) return st;
  // The engine thread works in this context from now on (NCCL, which uses the CUDA runtime,
  // picks up the current driver context).
  st = CudaStatus(cu_->CtxSetCurrent(rt.Context(device)), "cuCtxSetCurrent");
  if (!st.ok()) return st;
  st = rt.EngineStream(device, &stream_);
  if (!st.ok()) return st;
  rt.SetProcessDevice(device);
  st = kernel_.Load(device);  // in this thread's (the engine's) context
  if (!st.ok() && gpu::BatchedCopy::BuiltIn())
    Log(LogLevel::INFO, "the batched copy kernel is not used (" + st.message + "): fused groups copy tensor by tensor");
  device_ = device;
  return Status::Ok();
}

Status DeviceStream::WaitFor(const gpu::EventPtr& producer) {
  if (!producer) return Status::Ok();
  return CudaStatus(cu_->StreamWaitEvent(stream_, producer->get(), 0), "cuStreamWaitEvent (engine stream on the producer)");
}

Status DeviceStream::CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0 || dst == src) return Status::Ok();
  return CudaStatus(cu_->MemcpyDtoDAsync(Dev(dst), Dev(src), static_cast<size_t>(bytes), stream_), "cuMemcpyDtoDAsync");
}

Status DeviceStream::CopyMany(const std::vector<gpu::Copy>& copies, DataType dtype, double scale) {
  if (kernel_.ready()) {
    int kind = COLLECTIVES_COPY_BYTES;
    if (scale != 1.0) kind = dtype == DataType::FLOAT32 ? COLLECTIVES_COPY_FLOAT32 : COLLECTIVES_COPY_FLOAT64;
    return kernel_.Run(copies, kind, scale, stream_);
  }
  if (scale != 1.0) return Status::Error(StatusCode::INTERNAL, "internal: scaled copies without the copy kernel");
  for (const gpu::Copy& c : copies) {
    Status st = CopyDeviceToDevice(c.dst, c.src, c.bytes);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

Status DeviceStream::Zero(void* dst, int64_t bytes) {
  if (bytes <= 0) return Status::Ok();
  return CudaStatus(cu_->MemsetD8Async(Dev(dst), 0, static_cast<size_t>(bytes), stream_), "cuMemsetD8Async");
}

Status DeviceStream::CopyDeviceToHost(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return Status::Ok();
  return CudaStatus(cu_->MemcpyDtoHAsync(dst, Dev(src), static_cast<size_t>(bytes), stream_), "cuMemcpyDtoHAsync");
}

Status DeviceStream::CopyHostToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return Status::Ok();
  return CudaStatus(cu_->MemcpyHtoDAsync(Dev(dst), src, static_cast<size_t>(bytes), stream_), "cuMemcpyHtoDAsync");
}

Status DeviceStream::Synchronize() { return CudaStatus(cu_->StreamSynchronize(stream_), "cuStreamSynchronize"); }

Status DeviceStream::FusionBuffer(int64_t bytes, void** out) {
  if (!fusion_ || fusion_->size() < bytes) {
    // Powers of two from 1 MiB: a warming-up training loop reallocates only a few times.
    int64_t grown = 1 << 20;
    while (grown < bytes) grown *= 2;
    fusion_.reset();  // freed in the engine stream's order, after the work queued on it
    Status st = gpu::DeviceBuffer::Allocate(device_, grown, stream_, &fusion_);
    if (!st.ok()) return st;
  }
  *out = fusion_->data();
  return Status::Ok();
}

Status DeviceStream::AllocateOutput(int64_t bytes, std::shared_ptr<gpu::DeviceBuffer>* out) {
  // Freed in the engine stream's order unless a consumer adopts it (and names its stream).
  return gpu::DeviceBuffer::Allocate(device_, bytes, stream_, out);
}

}  // namespace collectives
