/* A stand-in for the CUDA driver (libcuda.so.1) for tests on machines without a GPU.
 * "Device memory" is host memory and every operation completes at once, so the engine's
 * whole GPU path (device resolution, events, the engine stream, fusion copies, staging,
 * engine-owned outputs, the completion thread) runs and its results can be read back.
 * Knobs (environment, read on each call):
 *   FAKE_CUDA_INIT_ERROR=N        cuInit returns N (100: CUDA_ERROR_NO_DEVICE)
 *   FAKE_CUDA_DEVICES=N           devices reported (default 1)
 *   FAKE_CUDA_POINTER_DEVICE=N    the device every pointer lives on (default 0)
 *   FAKE_CUDA_NOT_READY_POLLS=N   the first N cuEventQuery calls answer "not ready"
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long CUdeviceptr;

static int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

static int live_allocations = 0;
static int not_ready_answered = 0;
static int events_recorded = 0;
static int stream_waits = 0;

int fake_cuda_live_allocations(void) { return live_allocations; }
int fake_cuda_events_recorded(void) { return events_recorded; }
int fake_cuda_stream_waits(void) { return stream_waits; }

int cuInit(unsigned flags) { (void)flags; return env_int("FAKE_CUDA_INIT_ERROR", 0); }
int cuDriverGetVersion(int* v) { *v = 12040; return 0; }
int cuDeviceGetCount(int* c) { *c = env_int("FAKE_CUDA_DEVICES", 1); return 0; }
int cuDeviceGet(int* d, int ordinal) { *d = ordinal; return 0; }
int cuDevicePrimaryCtxRetain(void** ctx, int dev) { *ctx = (void*)(uintptr_t)(0x1000 + dev); return 0; }
int cuCtxSetCurrent(void* ctx) { (void)ctx; return 0; }
int cuCtxPushCurrent_v2(void* ctx) { (void)ctx; return 0; }
int cuCtxPopCurrent_v2(void** ctx) { if (ctx) *ctx = 0; return 0; }
int cuCtxGetStreamPriorityRange(int* least, int* greatest) { *least = 0; *greatest = -5; return 0; }
int cuStreamCreateWithPriority(void** s, unsigned flags, int priority) { (void)flags; (void)priority; *s = malloc(8); return 0; }
int cuStreamDestroy_v2(void* s) { free(s); return 0; }
int cuStreamSynchronize(void* s) { (void)s; return 0; }
int cuStreamWaitEvent(void* s, void* e, unsigned flags) { (void)s; (void)e; (void)flags; ++stream_waits; return 0; }
int cuEventCreate(void** e, unsigned flags) { (void)flags; *e = malloc(8); return 0; }
int cuEventDestroy_v2(void* e) { free(e); return 0; }
int cuEventRecord(void* e, void* s) { (void)e; (void)s; ++events_recorded; return 0; }
int cuEventQuery(void* e) {
  (void)e;
  if (not_ready_answered < env_int("FAKE_CUDA_NOT_READY_POLLS", 0)) { ++not_ready_answered; return 600; }
  return 0;
}
int cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  void* m = malloc(n ? n : 1);
  if (!m) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  *p = (CUdeviceptr)(uintptr_t)m;
  ++live_allocations;
  return 0;
}
int cuMemFree_v2(CUdeviceptr p) { free((void*)(uintptr_t)p); --live_allocations; return 0; }
int cuMemAllocAsync(CUdeviceptr* p, size_t n, void* s) { (void)s; return cuMemAlloc_v2(p, n); }
int cuMemFreeAsync(CUdeviceptr p, void* s) { (void)s; return cuMemFree_v2(p); }
int cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void* st) {
  (void)st; memmove((void*)(uintptr_t)d, (const void*)(uintptr_t)s, n); return 0;
}
int cuMemcpyDtoHAsync_v2(void* d, CUdeviceptr s, size_t n, void* st) { (void)st; memcpy(d, (const void*)(uintptr_t)s, n); return 0; }
int cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* s, size_t n, void* st) { (void)st; memcpy((void*)(uintptr_t)d, s, n); return 0; }
int cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void* st) { (void)st; memset((void*)(uintptr_t)d, v, n); return 0; }
int cuPointerGetAttribute(void* data, int attribute, CUdeviceptr p) {
  (void)p;
  if (attribute != 9) return 1; /* CUDA_ERROR_INVALID_VALUE */
  *(int*)data = env_int("FAKE_CUDA_POINTER_DEVICE", 0);
  return 0;
}
int cuGetErrorName(int e, const char** s) {
  switch (e) {
    case 100: *s = "CUDA_ERROR_NO_DEVICE"; break;
    case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    default: *s = "CUDA_ERROR_UNKNOWN"; break;
  }
  return 0;
}
int cuGetErrorString(int e, const char** s) { (void)e; *s = "fake driver error"; return 0; }
