// The few CUDA driver and NCCL declarations the engine uses, written out here so that the
// engine builds without any CUDA or NCCL header and loads both libraries at run time
// (gpu_loader.cc). One build then serves machines with and without GPUs.
//
// Values and signatures follow cuda.h (driver API, CUDA >= 11.2) and nccl.h (NCCL >= 2.11).
// tests/gpu/test_gpu_api_headers.py compiles tests/gpu/gpu_api_check.cc, which static_asserts every
// function type, constant and struct size below against the real headers wherever they are
// installed. Every enum is passed as int: C enums are int-sized in the x86-64 and AArch64
// ABIs, and NCCL keeps ncclRedOp_t int-sized on purpose.
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
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;
constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;
constexpr int CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;
// Special stream handles, numerically the same as DLPack's and __cuda_array_interface__'s
// stream conventions (1: the legacy default stream, 2: the calling thread's default stream).
inline CUstream StreamFromHandle(uintptr_t h) { return reinterpret_cast<CUstream>(h); }
constexpr uintptr_t kLegacyStream = 0x1;
constexpr uintptr_t kPerThreadStream = 0x2;

// Entry points. COLLECTIVES_CUDA_ENTRY_POINTS lists each member with the name it is
// resolved under (dlsym) and whether the engine needs it: gpu_loader.cc resolves from this
// list and the header check compares each member's type with that symbol's declaration.
// The _v2 names are what cuda.h's macros select for 64-bit sizes and pointers.
struct CudaApi {
  CUresult (*Init)(unsigned flags);
  CUresult (*DriverGetVersion)(int* version);
  CUresult (*DeviceGetCount)(int* count);
  CUresult (*DeviceGet)(CUdevice* device, int ordinal);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext* ctx, CUdevice dev);
  CUresult (*CtxSetCurrent)(CUcontext ctx);
  CUresult (*CtxGetCurrent)(CUcontext* ctx);
  CUresult (*CtxPushCurrent)(CUcontext ctx);
  CUresult (*CtxPopCurrent)(CUcontext* ctx);
  CUresult (*CtxSynchronize)();
  CUresult (*CtxGetStreamPriorityRange)(int* least, int* greatest);
  CUresult (*StreamCreateWithPriority)(CUstream* s, unsigned flags, int priority);
  CUresult (*StreamDestroy)(CUstream s);
  CUresult (*StreamSynchronize)(CUstream s);
  CUresult (*StreamWaitEvent)(CUstream s, CUevent e, unsigned flags);
  CUresult (*EventCreate)(CUevent* e, unsigned flags);
  CUresult (*EventDestroy)(CUevent e);
  CUresult (*EventRecord)(CUevent e, CUstream s);
  CUresult (*EventQuery)(CUevent e);
  CUresult (*MemAlloc)(CUdeviceptr* p, size_t bytes);
  CUresult (*MemFree)(CUdeviceptr p);
  CUresult (*MemAllocAsync)(CUdeviceptr* p, size_t bytes, CUstream s);  // optional (CUDA 11.2)
  CUresult (*MemFreeAsync)(CUdeviceptr p, CUstream s);                  // optional (CUDA 11.2)
  CUresult (*MemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s);
  CUresult (*MemcpyDtoHAsync)(void* dst, CUdeviceptr src, size_t bytes, CUstream s);
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr dst, const void* src, size_t bytes, CUstream s);
  CUresult (*MemsetD8Async)(CUdeviceptr dst, unsigned char value, size_t n, CUstream s);
  CUresult (*PointerGetAttribute)(void* data, int attribute, CUdeviceptr p);
  CUresult (*GetErrorName)(CUresult error, const char** name);
  CUresult (*GetErrorString)(CUresult error, const char** text);
  // The batched copy kernel (gpu_kernels.cc): optional, the copies above are the fallback.
  CUresult (*ModuleLoadData)(CUmodule* module, const void* image);
  CUresult (*ModuleGetFunction)(CUfunction* f, CUmodule module, const char* name);
  CUresult (*LaunchKernel)(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                           unsigned block_y, unsigned block_z, unsigned shared_bytes, CUstream s, void** params,
                           void** extra);
};

// X(member, symbol, required)
#define COLLECTIVES_CUDA_ENTRY_POINTS(X)                              \
  X(Init, cuInit, true)                                               \
  X(DriverGetVersion, cuDriverGetVersion, true)                       \
  X(DeviceGetCount, cuDeviceGetCount, true)                           \
  X(DeviceGet, cuDeviceGet, true)                                     \
  X(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, true)           \
  X(CtxSetCurrent, cuCtxSetCurrent, true)                             \
  X(CtxGetCurrent, cuCtxGetCurrent, true)                             \
  X(CtxPushCurrent, cuCtxPushCurrent_v2, true)                        \
  X(CtxPopCurrent, cuCtxPopCurrent_v2, true)                          \
  X(CtxSynchronize, cuCtxSynchronize, true)                           \
  X(CtxGetStreamPriorityRange, cuCtxGetStreamPriorityRange, true)     \
  X(StreamCreateWithPriority, cuStreamCreateWithPriority, true)       \
  X(StreamDestroy, cuStreamDestroy_v2, true)                          \
  X(StreamSynchronize, cuStreamSynchronize, true)                     \
  X(StreamWaitEvent, cuStreamWaitEvent, true)                         \
  X(EventCreate, cuEventCreate, true)                                 \
  X(EventDestroy, cuEventDestroy_v2, true)                            \
  X(EventRecord, cuEventRecord, true)                                 \
  X(EventQuery, cuEventQuery, true)                                   \
  X(MemAlloc, cuMemAlloc_v2, true)                                    \
  X(MemFree, cuMemFree_v2, true)                                      \
  X(MemAllocAsync, cuMemAllocAsync, false)                            \
  X(MemFreeAsync, cuMemFreeAsync, false)                              \
  X(MemcpyDtoDAsync, cuMemcpyDtoDAsync_v2, true)                      \
  X(MemcpyDtoHAsync, cuMemcpyDtoHAsync_v2, true)                      \
  X(MemcpyHtoDAsync, cuMemcpyHtoDAsync_v2, true)                      \
  X(MemsetD8Async, cuMemsetD8Async, true)                             \
  X(PointerGetAttribute, cuPointerGetAttribute, true)                 \
  X(GetErrorName, cuGetErrorName, true)                               \
  X(GetErrorString, cuGetErrorString, true)                           \
  X(ModuleLoadData, cuModuleLoadData, false)                          \
  X(ModuleGetFunction, cuModuleGetFunction, false)                    \
  X(LaunchKernel, cuLaunchKernel, false)

// ---------------------------------------------------------------- NCCL

using ncclResult = int;
using ncclComm = struct ncclComm_opaque*;  // NCCL's struct ncclComm*
constexpr size_t kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct ncclUniqueId {
  char internal[kNcclUniqueIdBytes];  // passed by value to ncclCommInitRank
};

constexpr ncclResult ncclSuccess = 0;
constexpr ncclResult ncclInProgress = 7;  // non-blocking communicators: poll ncclCommGetAsyncError

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

// X(member, symbol, required)
#define COLLECTIVES_NCCL_ENTRY_POINTS(X)                    \
  X(GetVersion, ncclGetVersion, true)                       \
  X(GetUniqueId, ncclGetUniqueId, true)                     \
  X(CommInitRank, ncclCommInitRank, true)                   \
  X(CommDestroy, ncclCommDestroy, true)                     \
  X(CommAbort, ncclCommAbort, true)                         \
  X(CommGetAsyncError, ncclCommGetAsyncError, true)         \
  X(GetErrorString, ncclGetErrorString, true)               \
  X(GetLastError, ncclGetLastError, false)                  \
  X(AllReduce, ncclAllReduce, true)                         \
  X(Broadcast, ncclBroadcast, true)                         \
  X(Reduce, ncclReduce, true)                               \
  X(AllGather, ncclAllGather, true)                         \
  X(ReduceScatter, ncclReduceScatter, true)                 \
  X(Send, ncclSend, true)                                   \
  X(Recv, ncclRecv, true)                                   \
  X(GroupStart, ncclGroupStart, true)                       \
  X(GroupEnd, ncclGroupEnd, true)                           \
  X(RedOpCreatePreMulSum, ncclRedOpCreatePreMulSum, true)   \
  X(RedOpDestroy, ncclRedOpDestroy, true)

}  // namespace gpu
}  // namespace collectives
