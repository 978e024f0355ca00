/* The batched copy kernel's argument and its per-thread work, shared by the kernel
 * (gpu_kernels.cu, compiled by nvcc), the engine that launches it (gpu_kernels.cc), a CPU
 * run of the same work for tests (tests/gpu/gpu_kernel_check.c) and the stand-in driver
 * (tests/gpu/fakes/fake_cuda.c). Plain C layout: it is passed by value as the kernel's one
 * parameter, so host and device must agree byte for byte. */
#ifndef COLLECTIVES_GPU_COPY_BATCH_H_
#define COLLECTIVES_GPU_COPY_BATCH_H_

#define COLLECTIVES_COPY_BATCH 64      /* copies per launch (the parameter stays under 4 KB) */
#define COLLECTIVES_COPY_THREADS 256   /* threads per block */
#define COLLECTIVES_COPY_KERNEL "collectives_batched_copy"

/* What the elements are, for scaling (plain copies ignore the scale). */
#define COLLECTIVES_COPY_BYTES 0
#define COLLECTIVES_COPY_FLOAT32 1
#define COLLECTIVES_COPY_FLOAT64 2

typedef struct {
  unsigned long long src[COLLECTIVES_COPY_BATCH];
  unsigned long long dst[COLLECTIVES_COPY_BATCH];
  unsigned long long bytes[COLLECTIVES_COPY_BATCH];
  double scale; /* dst = src * scale, for COLLECTIVES_COPY_FLOAT32/64 */
  int kind;     /* COLLECTIVES_COPY_BYTES, _FLOAT32 or _FLOAT64 */
  int count;    /* copies used, <= COLLECTIVES_COPY_BATCH */
} CollectivesCopyBatch;

#ifdef __CUDACC__
#define COLLECTIVES_DEVICE __device__ __forceinline__
typedef uint4 CollectivesVec16;
#else
#define COLLECTIVES_DEVICE static inline
typedef struct {
  unsigned int x, y, z, w;
} CollectivesVec16;
#endif

/* The work of thread `thread` of block (block, copy) in a grid of `blocks` blocks per copy:
 * a grid-stride loop over the copy's elements, 16 bytes at a time when both ends are
 * 16-byte aligned, else 4, else 1 (the fusion buffer's offsets keep tensors' alignment). */
COLLECTIVES_DEVICE void collectives_copy_part(const CollectivesCopyBatch* b, unsigned int copy, unsigned int block,
                                              unsigned int blocks, unsigned int thread) {
  const char* src = (const char*)(b->src[copy]);
  char* dst = (char*)(b->dst[copy]);
  const unsigned long long n = b->bytes[copy];
  const unsigned long long first = (unsigned long long)block * COLLECTIVES_COPY_THREADS + thread;
  const unsigned long long stride = (unsigned long long)blocks * COLLECTIVES_COPY_THREADS;
  unsigned long long i;
  if (b->kind == COLLECTIVES_COPY_FLOAT32) {
    const float f = (float)b->scale;
    for (i = first; i < n / 4; i += stride) ((float*)dst)[i] = ((const float*)src)[i] * f;
    return;
  }
  if (b->kind == COLLECTIVES_COPY_FLOAT64) {
    for (i = first; i < n / 8; i += stride) ((double*)dst)[i] = ((const double*)src)[i] * b->scale;
    return;
  }
  const unsigned long long align = (unsigned long long)src | (unsigned long long)dst;
  unsigned long long done = 0;
  if ((align & 15) == 0) {
    for (i = first; i < n / 16; i += stride) ((CollectivesVec16*)dst)[i] = ((const CollectivesVec16*)src)[i];
    done = n / 16 * 16;
  } else if ((align & 3) == 0) {
    for (i = first; i < n / 4; i += stride) ((unsigned int*)dst)[i] = ((const unsigned int*)src)[i];
    done = n / 4 * 4;
  }
  for (i = done + first; i < n; i += stride) dst[i] = src[i]; /* the tail, or everything unaligned */
}

#endif /* COLLECTIVES_GPU_COPY_BATCH_H_ */
