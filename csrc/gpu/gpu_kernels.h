// The batched copy kernel (gpu_kernels.cu) on the host side: loading its PTX, embedded at
// build time when nvcc was there, through the driver API, and launching it. Without the PTX,
// or when the driver refuses it, or with COLLECTIVES_GPU_COPY_KERNEL=0, nothing is loaded
// and the engine copies with cuMemcpyDtoDAsync instead.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/gpu_api.h"
#include "common/status.h"

namespace collectives {
namespace gpu {

struct Copy {
  void* dst;
  const void* src;
  int64_t bytes;
};

class BatchedCopy {
 public:
  // True when the extension was built with the kernel's PTX.
  static bool BuiltIn();
  // Loads the kernel into `device`'s primary context (current on the calling thread); once
  // per device and process. An error says why the copies fall back.
  Status Load(int device);
  bool ready() const { return fn_ != nullptr; }
  // dst = src for every copy (times `scale` for kind COLLECTIVES_COPY_FLOAT32/64), on
  // `stream`, in one launch per COLLECTIVES_COPY_BATCH copies.
  Status Run(const std::vector<Copy>& copies, int kind, double scale, CUstream stream) const;

 private:
  const CudaApi* cu_ = nullptr;
  CUfunction fn_ = nullptr;
};

}  // namespace gpu
}  // namespace collectives
