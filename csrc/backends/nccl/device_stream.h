// The engine's stream on the process's GPU (gpu_runtime.h's EngineStream) and the work the
// engine thread puts on it besides NCCL's calls: waits on the producers' events, copies (one
// launch of the batched copy kernel of gpu_kernels.h per 64 when it loads), zeroing, the device
// fusion buffer and outputs. Engine thread only, but device(), api() and get(), which the
// completion thread reads once Start has returned.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "common/types.h"
#include "gpu/gpu_api.h"
#include "gpu/gpu_kernels.h"
#include "gpu/gpu_runtime.h"

namespace collectives {

class DeviceStream {
 public:
  // Binds the calling (engine) thread to `device`'s primary context, takes the engine stream
  // and loads the copy kernel there (its absence is no error: copies go one by one).
  Status Start(const gpu::CudaApi* cu, int device);
  int device() const { return device_; }  // -1 until Start succeeded
  const gpu::CudaApi* api() const { return cu_; }
  gpu::CUstream get() const { return stream_; }
  bool has_copy_kernel() const { return kernel_.ready(); }

  Status WaitFor(const gpu::EventPtr& producer);
  Status CopyDeviceToDevice(void* dst, const void* src, int64_t bytes);
  // Several copies (a fused group's packing or unpacking): one launch of the batched copy
  // kernel per 64 when it is loaded, else one cuMemcpyDtoDAsync each. `scale` != 1 is
  // applied to float32/float64 elements and needs the kernel (NcclCommunicators::ScalesInKernel).
  Status CopyMany(const std::vector<gpu::Copy>& copies, DataType dtype, double scale = 1.0);
  Status Zero(void* dst, int64_t bytes);
  Status CopyDeviceToHost(void* dst, const void* src, int64_t bytes);
  Status CopyHostToDevice(void* dst, const void* src, int64_t bytes);
  Status Synchronize();
  // The device fusion buffer, at least `bytes` long (valid until the next call).
  Status FusionBuffer(int64_t bytes, void** out);
  void ReleaseFusionBuffer() { fusion_.reset(); }
  // Device memory for an output, stream-ordered on the engine stream.
  Status AllocateOutput(int64_t bytes, std::shared_ptr<gpu::DeviceBuffer>* out);

 private:
  const gpu::CudaApi* cu_ = nullptr;
  int device_ = -1;
  gpu::CUstream stream_ = nullptr;
  gpu::BatchedCopy kernel_;
  std::shared_ptr<gpu::DeviceBuffer> fusion_;
};

}  // namespace collectives
