// The few CUDA driver and NCCL declarations the engine uses, written out here so that the
// engine builds without any CUDA or NCCL header and loads both libraries at run time
// (gpu_loader.cc). One build then serves machines with and without GPUs.
//
// Values and signatures follow cuda.h (driver API, CUDA >= 11.2) and nccl.h (NCCL >= 2.11);
// tests/test_gpu_loader.py checks the CUDA ones against cuda.h when a toolkit is installed.
// Every enum is passed as int: C enums are int-sized in the x86-64 and AArch64 ABIs, and
// NCCL keeps ncclRedOp_t int-sized on purpose.
#pragma once
#include <cstddef>
#include <cstdint>

namespace collectives {
namespace gpu {

// ---------------------------------------------------------------- CUDA driver API

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;
constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;
constexpr int CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;
// Special stream handles, numerically the same as DLPack's and __cuda_array_interface__'s
// stream conventions (1: the legacy default stream, 2: the calling thread's default stream).
inline CUstream StreamFromHandle(uintptr_t h) { return reinterpret_cast<CUstream>(h); }
constexpr uintptr_t kLegacyStream = 0x1;

// Entry points, resolved with dlsym under the names in the comments (the _v2 names are
// what cuda.h's macros select for 64-bit sizes and pointers).
struct CudaApi {
  CUresult (*Init)(unsigned flags);                                  // cuInit
  CUresult (*DriverGetVersion)(int* version);                        // cuDriverGetVersion
  CUresult (*DeviceGetCount)(int* count);                            // cuDeviceGetCount
  CUresult (*DeviceGet)(CUdevice* device, int ordinal);              // cuDeviceGet
  CUresult (*DevicePrimaryCtxRetain)(CUcontext* ctx, CUdevice dev);  // cuDevicePrimaryCtxRetain
  CUresult (*CtxSetCurrent)(CUcontext ctx);                          // cuCtxSetCurrent
  CUresult (*CtxPushCurrent)(CUcontext ctx);                         // cuCtxPushCurrent_v2
  CUresult (*CtxPopCurrent)(CUcontext* ctx);                         // cuCtxPopCurrent_v2
  CUresult (*CtxGetStreamPriorityRange)(int* least, int* greatest);  // cuCtxGetStreamPriorityRange
  CUresult (*StreamCreateWithPriority)(CUstream* s, unsigned flags, int priority);
  CUresult (*StreamDestroy)(CUstream s);                             // cuStreamDestroy_v2
  CUresult (*StreamSynchronize)(CUstream s);
  CUresult (*StreamWaitEvent)(CUstream s, CUevent e, unsigned flags);
  CUresult (*EventCreate)(CUevent* e, unsigned flags);
  CUresult (*EventDestroy)(CUevent e);                               // cuEventDestroy_v2
  CUresult (*EventRecord)(CUevent e, CUstream s);
  CUresult (*EventQuery)(CUevent e);
  CUresult (*MemAlloc)(CUdeviceptr* p, size_t bytes);                // cuMemAlloc_v2
  CUresult (*MemFree)(CUdeviceptr p);                                // cuMemFree_v2
  CUresult (*MemAllocAsync)(CUdeviceptr* p, size_t bytes, CUstream s);  // optional (CUDA 11.2)
  CUresult (*MemFreeAsync)(CUdeviceptr p, CUstream s);                  // optional (CUDA 11.2)
  CUresult (*MemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s);  // _v2
  CUresult (*MemcpyDtoHAsync)(void* dst, CUdeviceptr src, size_t bytes, CUstream s);        // _v2
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr dst, const void* src, size_t bytes, CUstream s);  // _v2
  CUresult (*MemsetD8Async)(CUdeviceptr dst, unsigned char value, size_t n, CUstream s);
  CUresult (*PointerGetAttribute)(void* data, int attribute, CUdeviceptr p);
  CUresult (*GetErrorName)(CUresult error, const char** name);
  CUresult (*GetErrorString)(CUresult error, const char** text);
};

// ---------------------------------------------------------------- NCCL

using ncclResult = int;
using ncclComm = struct ncclComm_opaque*;  // NCCL's struct ncclComm*
struct ncclUniqueId {
  char internal[128];  // NCCL_UNIQUE_ID_BYTES; passed by value to ncclCommInitRank
};

constexpr ncclResult ncclSuccess = 0;
constexpr ncclResult ncclInProgress = 7;

enum NcclDataType : int {
  ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
  ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9,
};
enum NcclRedOp : int { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };
constexpr int ncclScalarHostImmediate = 1;  // ncclScalarResidence_t

struct NcclApi {
  ncclResult (*GetVersion)(int* version);
  ncclResult (*GetUniqueId)(ncclUniqueId* id);
  ncclResult (*CommInitRank)(ncclComm* comm, int nranks, ncclUniqueId id, int rank);
  ncclResult (*CommDestroy)(ncclComm comm);
  ncclResult (*CommAbort)(ncclComm comm);
  ncclResult (*CommGetAsyncError)(ncclComm comm, ncclResult* async_error);
  const char* (*GetErrorString)(ncclResult result);
  const char* (*GetLastError)(ncclComm comm);  // optional (NCCL 2.13)
  ncclResult (*AllReduce)(const void* send, void* recv, size_t count, int dtype, int op, ncclComm comm, CUstream s);
  ncclResult (*Broadcast)(const void* send, void* recv, size_t count, int dtype, int root, ncclComm comm, CUstream s);
  ncclResult (*Reduce)(const void* send, void* recv, size_t count, int dtype, int op, int root, ncclComm comm,
                       CUstream s);
  ncclResult (*AllGather)(const void* send, void* recv, size_t send_count, int dtype, ncclComm comm, CUstream s);
  ncclResult (*ReduceScatter)(const void* send, void* recv, size_t recv_count, int dtype, int op, ncclComm comm,
                              CUstream s);
  ncclResult (*Send)(const void* send, size_t count, int dtype, int peer, ncclComm comm, CUstream s);
  ncclResult (*Recv)(void* recv, size_t count, int dtype, int peer, ncclComm comm, CUstream s);
  ncclResult (*GroupStart)();
  ncclResult (*GroupEnd)();
  ncclResult (*RedOpCreatePreMulSum)(int* op, void* scalar, int dtype, int residence, ncclComm comm);
  ncclResult (*RedOpDestroy)(int op, ncclComm comm);
};

}  // namespace gpu
}  // namespace collectives
