// What watches the engine and the calls on it that the Python boundary reaches through
// Engine::monitoring(): the monitors (monitors.h: timeline, watchdog, autotuner, stage timing) with
// the engine's hooks into the autotuner (engine_autotune.h) and the watchdog (engine_watchdog.h);
// and the calls: the timeline started or stopped, the autotuner's state, the hierarchical switch,
// the GPU and its launch count (benchmarks, collectives/autotune.py).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "backends/mpi/job_layout.h"
#include "common/status.h"
#include "core/engine_autotune.h"
#include "core/engine_config.h"
#include "core/engine_shared.h"
#include "core/engine_watchdog.h"
#include "execution/executor.h"
#include "monitor/monitors.h"

namespace collectives {

class EngineMonitoring {
 public:
  // All the engine's, outliving this; only references are kept (some objects are not built yet).
  EngineMonitoring(EngineConfig& config, const JobLayout& job, Executor& executor, const ProcessSetTable& sets,
                   EngineShared& shared, CompletionSink& sink, CycleDriver& driver, Wakeups& wakeups)
      : job_(job),
        executor_(executor),
        gpu_device_(shared.gpu_device),
        autotune_(config, executor, monitors_, job, shared.mu, shared.lifetime),
        watchdog_(config, job, monitors_, sets, shared.mu, shared.lifetime, sink, driver, wakeups) {}

  // Rank 0 writes the timeline for everyone: elsewhere starting it does nothing.
  Status StartTimeline(const std::string& path, bool mark_cycles);
  void StopTimeline() { monitors_.timeline.Stop(); }
  // Turns the hierarchical algorithms (hierarchical.h) on or off from the next operation on. Every
  // rank must make the same change at the same point of its sequence of operations, with none in
  // flight (e.g. right after a barrier), or ranks would run different algorithms and never meet.
  void SetHierarchical(bool allreduce, bool allgather) { executor_.SetHierarchical(allreduce, allgather); }
  // The autotuner's parameters in force and whether it is still tuning (any thread).
  AutotuneState autotune_state() const { return monitors_.autotune.state(); }
  // The GPU this process uses (-1 until a GPU tensor is submitted).
  int gpu_device() const { return gpu_device_; }
  // NCCL allreduce launches so far (how well GPU gradients fused).
  int64_t gpu_allreduce_launches() const { return executor_.device().AllreduceLaunches(); }

  // For the engine's wiring, setup and teardown.
  Monitors& monitors() { return monitors_; }
  EngineAutotune& autotune() { return autotune_; }
  EngineWatchdog& watchdog() { return watchdog_; }

 private:
  const JobLayout& job_;
  Executor& executor_;
  const std::atomic<int>& gpu_device_;
  Monitors monitors_;  // declared before the hooks, which refer to it
  EngineAutotune autotune_;
  EngineWatchdog watchdog_;
};

}  // namespace collectives
