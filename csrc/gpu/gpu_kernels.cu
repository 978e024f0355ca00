// The engine's one CUDA kernel: copies of a whole fused group in one launch (packing the
// tensors into the fusion buffer, or unpacking the result), optionally scaling float32 or
// float64 elements on the way. setup.py compiles it to PTX when nvcc is there at build time
// and embeds the text in the extension; gpu_kernels.cc loads it through the driver API, so
// installing needs no CUDA toolkit and machines without the PTX use cuMemcpyDtoDAsync.
//
// Grid: x = blocks per copy, y = the copy; COLLECTIVES_COPY_THREADS threads per block.
#include "gpu/gpu_copy_batch.h"

extern "C" __global__ void __launch_bounds__(COLLECTIVES_COPY_THREADS)
    collectives_batched_copy(const CollectivesCopyBatch batch) {
  if (blockIdx.y >= static_cast<unsigned>(batch.count)) return;
  collectives_copy_part(&batch, blockIdx.y, blockIdx.x, gridDim.x, threadIdx.x);
}
