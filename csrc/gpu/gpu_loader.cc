#include "gpu/gpu_loader.h"

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

// Every member of the tables is in its entry-point list (a member missing from the list
// would stay null and crash when called).
#define COLLECTIVES_COUNT(member, symbol, required) +1
static_assert(sizeof(CudaApi) == (0 COLLECTIVES_CUDA_ENTRY_POINTS(COLLECTIVES_COUNT)) * sizeof(void*),
              "CudaApi and COLLECTIVES_CUDA_ENTRY_POINTS differ");
static_assert(sizeof(NcclApi) == (0 COLLECTIVES_NCCL_ENTRY_POINTS(COLLECTIVES_COUNT)) * sizeof(void*),
              "NcclApi and COLLECTIVES_NCCL_ENTRY_POINTS differ");
#undef COLLECTIVES_COUNT

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
#define COLLECTIVES_RESOLVE(member, symbol, required) Resolve(lib, #symbol, &api.member, required, &missing);
  COLLECTIVES_CUDA_ENTRY_POINTS(COLLECTIVES_RESOLVE)
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
  COLLECTIVES_NCCL_ENTRY_POINTS(COLLECTIVES_RESOLVE)
#undef COLLECTIVES_RESOLVE
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
