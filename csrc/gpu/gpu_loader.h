// Loading the CUDA driver and NCCL at run time. Python finds the libraries
// (collectives/gpu_libs.py: $COLLECTIVES_NCCL_LIBRARY, the nvidia-nccl wheel, the system) and
// passes their paths in the engine configuration; this file dlopens them and resolves the
// entry points of gpu_api.h. Nothing here touches a GPU: cuInit waits for the first GPU
// tensor (gpu_runtime.cc), so init() costs nothing on machines without one.
//
// The libraries stay loaded for the life of the process (never dlclose'd): engine-allocated
// GPU outputs handed to frameworks may be freed after the engine has shut down.
#pragma once
#include <atomic>
#include <mutex>
#include <string>

#include "gpu/gpu_api.h"

namespace collectives {
namespace gpu {

class Libraries {
 public:
  static Libraries& Get();

  // Loads both libraries unless already loaded. `nccl_path` empty: NCCL was not found, and
  // `nccl_problem` says why (Python's search report). Thread-safe; a failed load is retried
  // by the next call (a later init() may be given a better path).
  void Load(const std::string& driver_path, const std::string& nccl_path, const std::string& nccl_problem);

  // Non-null once loaded; the tables never change afterwards.
  const CudaApi* cuda() const { return cuda_ok_ ? &cuda_ : nullptr; }
  const NcclApi* nccl() const { return nccl_ok_ ? &nccl_ : nullptr; }
  bool available() const { return cuda_ok_ && nccl_ok_; }
  int nccl_version() const { return nccl_version_; }    // 22105 for 2.21.5; 0 when not loaded
  int driver_version() const { return driver_version_; }  // 12040 for 12.4; 0 when not loaded
  std::string nccl_path() const;
  // Why GPU tensors cannot be used; empty when they can (as far as libraries go).
  std::string problem() const;

 private:
  Libraries() = default;
  std::string LoadCuda(const std::string& path);
  std::string LoadNccl(const std::string& path);

  mutable std::mutex mu_;
  CudaApi cuda_{};
  NcclApi nccl_{};
  // Set once, after the table is filled; read without the lock.
  std::atomic<bool> cuda_ok_{false};
  std::atomic<bool> nccl_ok_{false};
  int nccl_version_ = 0;
  int driver_version_ = 0;
  std::string nccl_path_;
  std::string cuda_problem_ = "the CUDA driver has not been looked for (collectives.init() not called)";
  std::string nccl_problem_ = "NCCL has not been looked for (collectives.init() not called)";
};

}  // namespace gpu
}  // namespace collectives
