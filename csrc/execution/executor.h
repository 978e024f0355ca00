// Execution: running one cycle's negotiated responses on the data backends, the same list in
// the same order on every rank. The executor owns what only execution uses -- the MPI backend,
// the host algorithms (hierarchical, shared memory, cross-memory attach), the NCCL backend and
// the host fusion buffer -- and takes everything else it needs per cycle: from the negotiator a
// CyclePlan (cycle_plan.h: the responses and this rank's entries; the negotiator alone changes its
// table and its response cache), from the engine an ExecutionContext (the process sets, the
// timeline, the watchdog, and the engine's side of each outcome: ExecutionListener).
//
// Files: executor.cc (fusion, host execution), device_executor.cc (tensors in GPU memory);
// the engine's side is core/completion_sink.cc.
#pragma once
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/buffer_pool.h"
#include "operation/handle_table.h"
#include "operation/message.h"
#include "backends/mpi/mpi_backend.h"
#include "execution/device_executor.h"
#include "execution/execution_context.h"
#include "execution/execution_listener.h"
#include "execution/host_algorithms.h"
#include "operation/pending.h"
#include "operation/process_set.h"
#include "negotiation/cycle_plan.h"
#include "negotiation/negotiator.h"
#include "common/status.h"

namespace collectives {

// What execution keeps from the engine's setup.
struct ExecutorConfig {
  int rank = 0;
  int local_rank = 0;
  int local_size = 1;
  bool spin = false;  // short spins before sleeping (every rank on this machine has a core)
  bool hierarchical_allreduce = false;
  bool hierarchical_allgather = false;
  bool shm_allreduce = true;
  bool cma_allreduce = true;
  double stall_check_s = 60.0;       // a GPU wait is reported after this...
  double stall_shutdown_s = 1800.0;  // ...and aborted after this (0: never)
};

class Executor final : public AllreduceRouting, private StagedHostPath {
 public:
  // The host backends and algorithms, on the engine's communicators (collective over `comm`).
  // `step`: what setup waits for, for the init timeout's message.
  Status Init(MPI_Comm comm, MPI_Comm local, MPI_Comm cross, const ExecutorConfig& config,
              std::atomic<const char*>* step);
  // Tensors in GPU memory: the NCCL backend, its loading, its shutdown (device_executor.h).
  DeviceExecutor& device() { return device_; }
  const DeviceExecutor& device() const { return device_; }
  // Frees the host backends' resources (no collective).
  void Release();

  // Runs one cycle's responses as the negotiator planned them for this rank (cycle_plan.h: the
  // responses and this rank's entries), and reports back in the plan which entries ran and which
  // requests a removed process set left waiting; the negotiator finishes the cycle with that.
  void Execute(CyclePlan& plan, const ExecutionContext& ctx);
  // A removed process set's NCCL communicator goes once its GPU work is done.
  void ReleaseSet(int32_t process_set) { device_.ReleaseSet(process_set); }

  // Whether the algorithm that takes an allreduce of the whole job keeps it off the negotiation
  // (negotiator.h): the hierarchical one.
  bool RunsOwnAlgorithm(DataType dtype, ReduceOp op, int64_t elements) const override {
    return algorithms_.ForAllreduce({0, elements, dtype, op}).KeepsOffNegotiation();
  }

  // The hierarchical algorithms and whether each call uses them.
  const Hierarchy& hierarchy() const { return algorithms_.hierarchy(); }
  // Turns them on or off from the next operation on (EngineMonitoring::SetHierarchical).
  void SetHierarchical(bool allreduce, bool allgather) {
    algorithms_.hierarchy().allreduce_enabled = allreduce;
    algorithms_.hierarchy().allgather_enabled = allgather;
  }

 private:
  // executor.cc
  // entries[i] is null on a joined rank, which contributes zeros.
  Status ExecuteFused(const ExecutionContext& ctx, const ProcessSet& ps, const std::vector<const Response*>& group,
                      const std::vector<Pending*>& entries);
  Status ExecuteOne(const ExecutionContext& ctx, const ProcessSet& ps, const Response& resp, Pending& p,
                    Result* result);
  Status ExecuteJoinedAllreduce(const ExecutionContext& ctx, const ProcessSet& ps, const Response& resp);
  // segments: element counts of the tensors of a fused buffer (Adasum combines each on its own).
  Status Allreduce(const ProcessSet& ps, const Response& resp, const void* input, void* output, int64_t count,
                   const std::vector<int64_t>* segments = nullptr);
  std::vector<std::vector<size_t>> PlanFusion(const std::vector<Response>& responses, int64_t fusion_threshold) const;
  int64_t MaxFusedBytes(const Response& r, int64_t fusion_threshold) const;
  void* FusionBuffer(int64_t bytes);
  // The scaling after a reduction (Average's division, the postscale).
  static void PostReduce(const ProcessSet& ps, const Response& resp, void* buf, int64_t count);

  // The device executor's staged reductions (StagedHostPath): ExecuteOne, or on a joined rank
  // (null `p`) ExecuteJoinedAllreduce.
  Status RunOnHost(const ExecutionContext& ctx, const ProcessSet& ps, const Response& resp, Pending* p,
                   Result* result) override;

  ExecutorConfig config_;
  MpiBackend backend_;
  HostAlgorithms algorithms_;  // which host algorithm runs each allreduce and allgather
  DeviceExecutor device_;  // GPU tensors
  std::unique_ptr<HostBuffer> fusion_;
};

}  // namespace collectives
