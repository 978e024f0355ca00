/* A stand-in for the CUDA driver (libcuda.so.1) for tests on machines without a GPU.
 * "Device memory" is host memory and every operation completes at once, so the engine's
 * whole GPU path (device resolution, events, the engine stream, fusion copies, staging,
 * engine-owned outputs, the completion thread) runs and its results can be read back.
 * Like the real driver, it answers pointer queries for the null pointer with
 * CUDA_ERROR_INVALID_VALUE and keeps a current context per thread.
 * Knobs (environment, read on each call):
 *   FAKE_CUDA_INIT_ERROR=N             cuInit returns N (100: CUDA_ERROR_NO_DEVICE)
 *   FAKE_CUDA_DEVICES=N                devices reported (default 1)
 *   FAKE_CUDA_POINTER_DEVICE=N         the device every pointer lives on (default 0)
 *   FAKE_CUDA_POINTER_NEEDS_CONTEXT=1  pointer queries without a current context fail (201)
 *   FAKE_CUDA_NOT_READY_POLLS=N        the first N cuEventQuery calls answer "not ready"
 *   FAKE_CUDA_EVENT_US=N               an event answers "not ready" until N microseconds after
 *                                      its record (GPU work that takes that long)
 *   FAKE_CUDA_OOM=1                    allocations fail with CUDA_ERROR_OUT_OF_MEMORY
 *   FAKE_CUDA_NO_MODULES=1             cuModuleLoadData refuses every image (no kernels)
 * Kernels: the engine's batched copy kernel runs here on the host, through the same
 * per-thread function the GPU runs (csrc/gpu/gpu_copy_batch.h), for every block and thread of
 * the grid the engine launched. Compile with -I csrc.
 * Counters for the tests: fake_cuda_count("retained0"), ... (see fake_cuda_count).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/gpu_copy_batch.h"

typedef unsigned long long CUdeviceptr;

static int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

static int live_allocations = 0;
static int not_ready_answered = 0;
static int events_recorded = 0;
static int stream_waits = 0;
static int retained[8];
static int ctx_syncs = 0;
static int dtod_copies = 0;
static int module_loads = 0;
static int kernel_launches = 0;
static int kernel_copies = 0;
static long long last_free_stream = -2; /* -1: cuMemFree; else the stream of cuMemFreeAsync */
static __thread void* current_ctx = 0;
static __thread void* ctx_stack[16];
static __thread int ctx_depth = 0;

int fake_cuda_live_allocations(void) { return live_allocations; }
int fake_cuda_events_recorded(void) { return events_recorded; }
int fake_cuda_stream_waits(void) { return stream_waits; }
long long fake_cuda_last_free_stream(void) { return last_free_stream; }
int fake_cuda_count(const char* what) {
  if (!strncmp(what, "retained", 8)) return retained[atoi(what + 8) & 7];
  if (!strcmp(what, "ctx_syncs")) return ctx_syncs;
  if (!strcmp(what, "dtod_copies")) return dtod_copies;
  if (!strcmp(what, "module_loads")) return module_loads;
  if (!strcmp(what, "kernel_launches")) return kernel_launches;
  if (!strcmp(what, "kernel_copies")) return kernel_copies;
  return -1;
}

int cuInit(unsigned flags) { (void)flags; return env_int("FAKE_CUDA_INIT_ERROR", 0); }
int cuDriverGetVersion(int* v) { *v = 12040; return 0; }
int cuDeviceGetCount(int* c) { *c = env_int("FAKE_CUDA_DEVICES", 1); return 0; }
int cuDeviceGet(int* d, int ordinal) { *d = ordinal; return 0; }
int cuDevicePrimaryCtxRetain(void** ctx, int dev) {
  ++retained[dev & 7];
  *ctx = (void*)(uintptr_t)(0x1000 + dev);
  return 0;
}
int cuCtxSetCurrent(void* ctx) { current_ctx = ctx; return 0; }
int cuCtxGetCurrent(void** ctx) { *ctx = current_ctx; return 0; }
int cuCtxPushCurrent_v2(void* ctx) {
  if (ctx_depth < 16) ctx_stack[ctx_depth++] = current_ctx;
  current_ctx = ctx;
  return 0;
}
int cuCtxPopCurrent_v2(void** ctx) {
  if (ctx) *ctx = current_ctx;
  current_ctx = ctx_depth > 0 ? ctx_stack[--ctx_depth] : 0;
  return 0;
}
int cuCtxSynchronize(void) { ++ctx_syncs; return 0; }
int cuCtxGetStreamPriorityRange(int* least, int* greatest) { *least = 0; *greatest = -5; return 0; }
int cuStreamCreateWithPriority(void** s, unsigned flags, int priority) { (void)flags; (void)priority; *s = malloc(8); return 0; }
int cuStreamDestroy_v2(void* s) { free(s); return 0; }
int cuStreamSynchronize(void* s) { (void)s; return 0; }
int cuStreamWaitEvent(void* s, void* e, unsigned flags) { (void)s; (void)e; (void)flags; ++stream_waits; return 0; }
int cuEventCreate(void** e, unsigned flags) { (void)flags; *e = calloc(1, sizeof(long long)); return 0; }
int cuEventDestroy_v2(void* e) { free(e); return 0; }
static long long now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}
int cuEventRecord(void* e, void* s) { (void)s; ++events_recorded; *(long long*)e = now_us(); return 0; }
int cuEventQuery(void* e) {
  if (not_ready_answered < env_int("FAKE_CUDA_NOT_READY_POLLS", 0)) { ++not_ready_answered; return 600; }
  if (now_us() < *(long long*)e + env_int("FAKE_CUDA_EVENT_US", 0)) return 600;
  return 0;
}
int cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  if (env_int("FAKE_CUDA_OOM", 0)) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  void* m = malloc(n ? n : 1);
  if (!m) return 2;
  *p = (CUdeviceptr)(uintptr_t)m;
  ++live_allocations;
  return 0;
}
int cuMemFree_v2(CUdeviceptr p) { free((void*)(uintptr_t)p); --live_allocations; last_free_stream = -1; return 0; }
int cuMemAllocAsync(CUdeviceptr* p, size_t n, void* s) { (void)s; return cuMemAlloc_v2(p, n); }
int cuMemFreeAsync(CUdeviceptr p, void* s) {
  free((void*)(uintptr_t)p);
  --live_allocations;
  last_free_stream = (long long)(uintptr_t)s;
  return 0;
}
int cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void* st) {
  (void)st; ++dtod_copies; memmove((void*)(uintptr_t)d, (const void*)(uintptr_t)s, n); return 0;
}
int cuMemcpyDtoHAsync_v2(void* d, CUdeviceptr s, size_t n, void* st) { (void)st; memcpy(d, (const void*)(uintptr_t)s, n); return 0; }
int cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* s, size_t n, void* st) { (void)st; memcpy((void*)(uintptr_t)d, s, n); return 0; }
int cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void* st) { (void)st; memset((void*)(uintptr_t)d, v, n); return 0; }
int cuPointerGetAttribute(void* data, int attribute, CUdeviceptr p) {
  if (attribute != 9) return 1; /* CUDA_ERROR_INVALID_VALUE */
  if (!p) return 1;             /* the null pointer is nobody's memory */
  if (env_int("FAKE_CUDA_POINTER_NEEDS_CONTEXT", 0) && !current_ctx) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
  *(int*)data = env_int("FAKE_CUDA_POINTER_DEVICE", 0);
  return 0;
}
int cuGetErrorName(int e, const char** s) {
  switch (e) {
    case 100: *s = "CUDA_ERROR_NO_DEVICE"; break;
    case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case 1: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    default: *s = "CUDA_ERROR_UNKNOWN"; break;
  }
  return 0;
}
int cuGetErrorString(int e, const char** s) { (void)e; *s = "fake driver error"; return 0; }

/* Modules: only the engine's PTX (its text names the kernel) "loads". */
static int the_function;
int cuModuleLoadData(void** module, const void* image) {
  if (env_int("FAKE_CUDA_NO_MODULES", 0)) return 209; /* CUDA_ERROR_NO_BINARY_FOR_GPU */
  if (!image || !strstr((const char*)image, ".entry " COLLECTIVES_COPY_KERNEL)) return 218; /* INVALID_PTX */
  ++module_loads;
  *module = &the_function;
  return 0;
}
int cuModuleGetFunction(void** f, void* module, const char* name) {
  if (module != &the_function || strcmp(name, COLLECTIVES_COPY_KERNEL)) return 500; /* CUDA_ERROR_NOT_FOUND */
  *f = &the_function;
  return 0;
}
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void* stream, void** params, void** extra) {
  (void)stream;
  if (f != &the_function || gz != 1 || by != 1 || bz != 1 || bx != COLLECTIVES_COPY_THREADS || shared || extra)
    return 1; /* CUDA_ERROR_INVALID_VALUE: not how the engine launches it */
  const CollectivesCopyBatch* batch = (const CollectivesCopyBatch*)params[0];
  if (batch->count < 1 || batch->count > COLLECTIVES_COPY_BATCH || gy != (unsigned)batch->count) return 1;
  for (unsigned copy = 0; copy < gy; ++copy)
    for (unsigned block = 0; block < gx; ++block)
      for (unsigned thread = 0; thread < bx; ++thread) collectives_copy_part(batch, copy, block, gx, thread);
  ++kernel_launches;
  kernel_copies += batch->count;
  return 0;
}
