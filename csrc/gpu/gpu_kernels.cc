#include "gpu/gpu_kernels.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "gpu/gpu_copy_batch.h"
#include "gpu/gpu_loader.h"
#include "gpu/gpu_runtime.h"

#ifdef COLLECTIVES_HAVE_PTX
#include "gpu_kernels_ptx.inc"  // kCollectivesPtx: gpu_kernels.cu as PTX text (setup.py)
static constexpr bool kHavePtx = true;
#else
static const char* const kCollectivesPtx = nullptr;
static constexpr bool kHavePtx = false;
#endif

namespace collectives {
namespace gpu {
namespace {

std::mutex loaded_mu;
std::map<int, CUfunction> loaded;  // device -> the kernel (modules stay loaded for the process)

}  // namespace

bool BatchedCopy::BuiltIn() { return kHavePtx; }

Status BatchedCopy::Load(int device) {
  cu_ = Libraries::Get().cuda();
  fn_ = nullptr;
  if (!cu_ || !cu_->ModuleLoadData || !cu_->ModuleGetFunction || !cu_->LaunchKernel)
    return Status::Error(StatusCode::UNSUPPORTED_TYPE, "the CUDA driver lacks the module API");
  if (!BuiltIn()) return Status::Error(StatusCode::UNSUPPORTED_TYPE, "built without nvcc: no PTX");
  const char* knob = std::getenv("COLLECTIVES_GPU_COPY_KERNEL");  // a switch for comparing both paths
  if (knob && std::strcmp(knob, "0") == 0)
    return Status::Error(StatusCode::UNSUPPORTED_TYPE, "COLLECTIVES_GPU_COPY_KERNEL=0");
  std::lock_guard<std::mutex> lock(loaded_mu);
  auto it = loaded.find(device);
  if (it != loaded.end()) {
    fn_ = it->second;
    return Status::Ok();
  }
  // The driver compiles the PTX for this GPU here (once; tens of milliseconds).
  CUmodule module = nullptr;
  Status st = CudaStatus(cu_->ModuleLoadData(&module, kCollectivesPtx), "cuModuleLoadData (the batched copy kernel)");
  if (!st.ok()) return st;
  CUfunction fn = nullptr;
  st = CudaStatus(cu_->ModuleGetFunction(&fn, module, COLLECTIVES_COPY_KERNEL), "cuModuleGetFunction");
  if (!st.ok()) return st;
  loaded[device] = fn;
  fn_ = fn;
  return Status::Ok();
}

Status BatchedCopy::Run(const std::vector<Copy>& copies, int kind, double scale, CUstream stream) const {
  if (!fn_) return Status::Error(StatusCode::INTERNAL, "internal: the batched copy kernel is not loaded");
  CollectivesCopyBatch batch;
  size_t next = 0;
  while (next < copies.size()) {
    std::memset(&batch, 0, sizeof(batch));
    batch.scale = scale;
    batch.kind = kind;
    int64_t largest = 0;
    for (; next < copies.size() && batch.count < COLLECTIVES_COPY_BATCH; ++next) {
      const Copy& c = copies[next];
      if (c.bytes <= 0) continue;
      batch.src[batch.count] = reinterpret_cast<uintptr_t>(c.src);
      batch.dst[batch.count] = reinterpret_cast<uintptr_t>(c.dst);
      batch.bytes[batch.count] = static_cast<unsigned long long>(c.bytes);
      largest = std::max(largest, c.bytes);
      ++batch.count;
    }
    if (batch.count == 0) break;
    // Enough blocks that each thread moves about eight 16-byte vectors of the largest copy
    // (smaller copies' extra blocks exit at once), at most 1024 per copy.
    const int64_t per_block = int64_t{COLLECTIVES_COPY_THREADS} * 16 * 8;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(1024, std::max<int64_t>(1, (largest + per_block - 1) / per_block)));
    void* params[] = {&batch};
    Status st = CudaStatus(cu_->LaunchKernel(fn_, blocks, static_cast<unsigned>(batch.count), 1, COLLECTIVES_COPY_THREADS,
                                             1, 1, 0, stream, params, nullptr),
                           "cuLaunchKernel (the batched copy kernel)");
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

}  // namespace gpu
}  // namespace collectives
