// The engine's side of autotuning (engine_autotune.h): starting the tuner, reporting each cycle's
// executed work, and applying the parameters that every rank receives at a decision point.
#include "core/engine_autotune.h"

#include "execution/executor.h"
#include "common/log.h"
#include "backends/mpi/rank_agreement.h"

namespace collectives {

Status EngineAutotune::Start() {
  TunedParams initial;
  initial.fusion_threshold = config_.fusion_threshold;
  initial.cycle_time_ms = config_.cycle_time_ms;
  const Hierarchy& hierarchy = executor_.hierarchy();
  initial.hierarchical_allreduce = hierarchy.allreduce_enabled;  // as the ranks agreed on them
  initial.hierarchical_allgather = hierarchy.allgather_enabled;
  AutotuneSettings settings = config_.autotune;
  settings.cache_enabled = config_.cache_capacity > 0;
  Status st = monitors_.autotune.Start(settings, initial, job_.rank, hierarchy.allreduce_blocker().empty(),
                              hierarchy.allgather_blocker().empty());
  if (!st.ok()) return st;
  // Every rank must reach the same decision points, so the knobs that place them must agree (a
  // variable set on some ranks only): otherwise autotuning is off everywhere, as Hierarchy::Init
  // does for its knobs. One small allreduce at init, whether autotuning is on or not.
  bool agree = false;
  st = AllRanksAgree(job_.comm, {monitors_.autotune.tuning() ? 1 : 0, settings.warmup_samples, settings.steps_per_sample}, &agree);
  if (!st.ok()) return st;
  if (!agree) {
    if (job_.rank == 0)
      Log(LogLevel::WARNING, "COLLECTIVES_AUTOTUNE and its sample knobs (or the knobs left to tune) differ between "
                             "ranks; autotuning is off");
    monitors_.autotune.Cancel();
  }
  return Status::Ok();
}

void EngineAutotune::Count(const Response& r) {
  if (IsDataOp(r.op) && r.error.empty()) monitors_.autotune.Count(r.name, NumElements(r.shape) * DataTypeSize(r.dtype));
}

bool EngineAutotune::AfterCycle(const std::vector<Response>& responses, Clock::time_point start) {
  for (const Response& r : responses) Count(r);
  if (!monitors_.autotune.EndCycle(start, Clock::now())) return true;
  // A decision point, reached in this same cycle by every rank (autotune.h): rank 0's choice
  // reaches everyone before the next cycle, so every rank fuses, paces and picks algorithms alike.
  double packed[Autotuner::kPackedSize] = {0};
  if (job_.rank == 0) monitors_.autotune.Decide(packed);
  if (monitors_.watchdog.Watch(BackendCall::NEGOTIATION_BCAST, 0, [&] {
        return MPI_Bcast(packed, Autotuner::kPackedSize, MPI_DOUBLE, 0, job_.comm);
      }) != MPI_SUCCESS) {
    Log(LogLevel::ERROR, "broadcast of the autotuned parameters failed; stopping the engine");
    std::lock_guard<std::mutex> lock(mu_);
    lifetime_.set_stopped_status_locked(
        Status::Error(StatusCode::INTERNAL, "MPI failure while broadcasting autotuned parameters"));
    return false;
  }
  const TunedParams p = monitors_.autotune.Apply(packed);
  config_.fusion_threshold = p.fusion_threshold;
  config_.cycle_time_ms = p.cycle_time_ms;
  executor_.SetHierarchical(p.hierarchical_allreduce, p.hierarchical_allgather);  // no operation is in flight between cycles
  return true;
}

}  // namespace collectives
