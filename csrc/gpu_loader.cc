#include "gpu_loader.h"

#include <dlfcn.h>

namespace collectives {
namespace gpu {
namespace {

std::string DlError() {
  const char* e = dlerror();
  return e ? e : "unknown error";
}

// Resolves `name` into *slot; records the first missing required symbol in *missing.
template <typename Fn>
void Resolve(void* lib, const char* name, Fn* slot, bool required, std::string* missing) {
  *slot = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!*slot && required && missing->empty()) *missing = name;
}

std::string NcclVersionString(int code) {
  // ncclGetVersion's encoding: major*10000 + minor*100 + patch since 2.9, major*1000 + ... before.
  if (code >= 10000)
    return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
  return std::to_string(code / 1000) + "." + std::to_string(code / 100 % 10) + "." + std::to_string(code % 100);
}

}  // namespace

Libraries& Libraries::Get() {
  static Libraries* libs = new Libraries();  // never destroyed: see the header
  return *libs;
}

void Libraries::Load(const std::string& driver_path, const std::string& nccl_path, const std::string& nccl_problem) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!cuda_ok_) cuda_problem_ = LoadCuda(driver_path.empty() ? "libcuda.so.1" : driver_path);
  if (!nccl_ok_) {
    if (nccl_path.empty())
      nccl_problem_ = "libnccl.so.2 " + (nccl_problem.empty() ? std::string("was not found") : nccl_problem);
    else
      nccl_problem_ = LoadNccl(nccl_path);
  }
}

std::string Libraries::LoadCuda(const std::string& path) {
  dlerror();
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) return "the CUDA driver (" + path + ") could not be loaded: " + DlError();
  CudaApi api{};
  std::string missing;
  Resolve(lib, "cuInit", &api.Init, true, &missing);
  Resolve(lib, "cuDriverGetVersion", &api.DriverGetVersion, true, &missing);
  Resolve(lib, "cuDeviceGetCount", &api.DeviceGetCount, true, &missing);
  Resolve(lib, "cuDeviceGet", &api.DeviceGet, true, &missing);
  Resolve(lib, "cuDevicePrimaryCtxRetain", &api.DevicePrimaryCtxRetain, true, &missing);
  Resolve(lib, "cuCtxSetCurrent", &api.CtxSetCurrent, true, &missing);
  Resolve(lib, "cuCtxPushCurrent_v2", &api.CtxPushCurrent, true, &missing);
  Resolve(lib, "cuCtxPopCurrent_v2", &api.CtxPopCurrent, true, &missing);
  Resolve(lib, "cuCtxGetStreamPriorityRange", &api.CtxGetStreamPriorityRange, true, &missing);
  Resolve(lib, "cuStreamCreateWithPriority", &api.StreamCreateWithPriority, true, &missing);
  Resolve(lib, "cuStreamDestroy_v2", &api.StreamDestroy, true, &missing);
  Resolve(lib, "cuStreamSynchronize", &api.StreamSynchronize, true, &missing);
  Resolve(lib, "cuStreamWaitEvent", &api.StreamWaitEvent, true, &missing);
  Resolve(lib, "cuEventCreate", &api.EventCreate, true, &missing);
  Resolve(lib, "cuEventDestroy_v2", &api.EventDestroy, true, &missing);
  Resolve(lib, "cuEventRecord", &api.EventRecord, true, &missing);
  Resolve(lib, "cuEventQuery", &api.EventQuery, true, &missing);
  Resolve(lib, "cuMemAlloc_v2", &api.MemAlloc, true, &missing);
  Resolve(lib, "cuMemFree_v2", &api.MemFree, true, &missing);
  Resolve(lib, "cuMemAllocAsync", &api.MemAllocAsync, false, &missing);
  Resolve(lib, "cuMemFreeAsync", &api.MemFreeAsync, false, &missing);
  Resolve(lib, "cuMemcpyDtoDAsync_v2", &api.MemcpyDtoDAsync, true, &missing);
  Resolve(lib, "cuMemcpyDtoHAsync_v2", &api.MemcpyDtoHAsync, true, &missing);
  Resolve(lib, "cuMemcpyHtoDAsync_v2", &api.MemcpyHtoDAsync, true, &missing);
  Resolve(lib, "cuMemsetD8Async", &api.MemsetD8Async, true, &missing);
  Resolve(lib, "cuPointerGetAttribute", &api.PointerGetAttribute, true, &missing);
  Resolve(lib, "cuGetErrorName", &api.GetErrorName, true, &missing);
  Resolve(lib, "cuGetErrorString", &api.GetErrorString, true, &missing);
  if (!missing.empty()) return "the CUDA driver (" + path + ") lacks " + missing + " (too old, or not the driver)";
  int version = 0;
  if (api.DriverGetVersion(&version) != CUDA_SUCCESS) return "cuDriverGetVersion failed in " + path;
  cuda_ = api;
  driver_version_ = version;
  cuda_ok_ = true;
  return "";
}

std::string Libraries::LoadNccl(const std::string& path) {
  dlerror();
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) return "NCCL (" + path + ") could not be loaded: " + DlError();
  NcclApi api{};
  std::string missing;
  Resolve(lib, "ncclGetVersion", &api.GetVersion, true, &missing);
  Resolve(lib, "ncclGetUniqueId", &api.GetUniqueId, true, &missing);
  Resolve(lib, "ncclCommInitRank", &api.CommInitRank, true, &missing);
  Resolve(lib, "ncclCommDestroy", &api.CommDestroy, true, &missing);
  Resolve(lib, "ncclCommAbort", &api.CommAbort, true, &missing);
  Resolve(lib, "ncclCommGetAsyncError", &api.CommGetAsyncError, true, &missing);
  Resolve(lib, "ncclGetErrorString", &api.GetErrorString, true, &missing);
  Resolve(lib, "ncclGetLastError", &api.GetLastError, false, &missing);
  Resolve(lib, "ncclAllReduce", &api.AllReduce, true, &missing);
  Resolve(lib, "ncclBroadcast", &api.Broadcast, true, &missing);
  Resolve(lib, "ncclReduce", &api.Reduce, true, &missing);
  Resolve(lib, "ncclAllGather", &api.AllGather, true, &missing);
  Resolve(lib, "ncclReduceScatter", &api.ReduceScatter, true, &missing);
  Resolve(lib, "ncclSend", &api.Send, true, &missing);
  Resolve(lib, "ncclRecv", &api.Recv, true, &missing);
  Resolve(lib, "ncclGroupStart", &api.GroupStart, true, &missing);
  Resolve(lib, "ncclGroupEnd", &api.GroupEnd, true, &missing);
  Resolve(lib, "ncclRedOpCreatePreMulSum", &api.RedOpCreatePreMulSum, true, &missing);
  Resolve(lib, "ncclRedOpDestroy", &api.RedOpDestroy, true, &missing);
  int version = 0;
  if (api.GetVersion && api.GetVersion(&version) != ncclSuccess) version = 0;
  if (!missing.empty())
    return "NCCL " + (version ? NcclVersionString(version) + " " : std::string()) + "(" + path + ") lacks " + missing +
           " (NCCL 2.11 or newer is needed)";
  nccl_ = api;
  nccl_version_ = version;
  nccl_path_ = path;
  nccl_ok_ = true;
  return "";
}

std::string Libraries::nccl_path() const {
  std::lock_guard<std::mutex> lock(mu_);
  return nccl_path_;
}

std::string Libraries::problem() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  if (!cuda_ok_) out = cuda_problem_;
  if (!nccl_ok_) out += (out.empty() ? "" : "; ") + nccl_problem_;
  return out;
}

}  // namespace gpu
}  // namespace collectives
