// The execution of tensors in GPU memory (device_executor.cc says how): the NCCL backend, the
// GPU libraries' loading, and the few reductions staged through host memory, which run on the
// host path that the executor (executor.h) lends as a StagedHostPath.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/nccl/nccl_backend.h"
#include "common/status.h"
#include "execution/execution_context.h"
#include "operation/message.h"
#include "operation/pending.h"
#include "operation/process_set.h"

namespace collectives {

// The host path, for the reductions NCCL cannot do (int16, scaled Min/Max/Product, scaled
// integers): `p` in host memory, or null on a joined rank, which contributes zeros.
class StagedHostPath {
 public:
  virtual Status RunOnHost(const ExecutionContext& ctx, const ProcessSet& ps, const Response& resp, Pending* p,
                           Result* result) = 0;

 protected:
  ~StagedHostPath() = default;
};

// What the device execution keeps from the engine's setup.
struct DeviceSettings {
  int local_rank = 0;
  bool spin = false;
  double stall_check_s = 60.0;       // a GPU wait is reported after this...
  double stall_shutdown_s = 1800.0;  // ...and aborted after this (0: never)
};

class DeviceExecutor {
 public:
  void Configure(const DeviceSettings& settings) { settings_ = settings; }
  // Loads the GPU libraries that Python found (collectives/gpu_libs.py; `nccl_problem`: why NCCL
  // was not) and makes the NCCL backend, whose stream starts at the first GPU tensor.
  void Load(const std::string& cuda_driver_library, const std::string& nccl_library, const std::string& nccl_problem);
  // GPU work launched and not finished yet; `idle` runs (on the completion thread) whenever the
  // last of it finishes.
  bool Busy() const { return nccl_ && nccl_->completion().Busy(); }
  int64_t AllreduceLaunches() const { return nccl_ ? nccl_->allreduce_launches() : 0; }
  void OnIdle(std::function<void()> idle) { nccl_->completion().OnIdle(std::move(idle)); }
  // GPU work already launched finishes (or is aborted after a grace period) and completes its
  // handles; then the NCCL communicators go.
  void Shutdown(const Status& why);
  // A removed process set's NCCL communicator goes once its GPU work is done.
  void ReleaseSet(int32_t process_set) {
    if (nccl_) nccl_->Release(process_set);
  }

  // One fusion group of GPU tensors (entries[i] null on a joined rank); its handles complete
  // from the backend's completion thread once the GPU has finished.
  void ExecuteGroup(const ExecutionContext& ctx, StagedHostPath& host, const ProcessSet& ps,
                    const std::vector<const Response*>& group, const std::vector<Pending*>& entries);

 private:
  Status RunGroup(const ExecutionContext& ctx, StagedHostPath& host, const ProcessSet& ps,
                  const std::vector<const Response*>& group, const std::vector<Pending*>& entries,
                  std::vector<Result>* results, std::vector<std::shared_ptr<void>>* keep);
  Status RunStaged(const ExecutionContext& ctx, StagedHostPath& host, const ProcessSet& ps, const Response& r,
                   Pending* p, Result* result, std::vector<std::shared_ptr<void>>* keep);

  DeviceSettings settings_;
  std::unique_ptr<NcclBackend> nccl_;  // GPU tensors; its stream starts at the first one
};

}  // namespace collectives
