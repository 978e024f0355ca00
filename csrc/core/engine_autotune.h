// The engine's side of autotuning (monitor/autotune.h): starting the tuner, reporting each cycle's
// executed work, and applying the parameters that every rank receives at a decision point to the
// engine's settings (fusion threshold, cycle time) and the executor's hierarchical switches.
//
// Locking: Start runs in Setup, Count and AfterCycle on whoever runs a cycle (the cycle driver's
// cycle_mu), between cycles, where no operation is in flight; the settings it changes are read by
// the cycle runner too. A failed broadcast records the engine's stop reason under the engine's
// lock (given at construction), as the engine did.
#pragma once
#include <mutex>
#include <vector>

#include "backends/mpi/job_layout.h"
#include "common/clock.h"
#include "common/status.h"
#include "core/engine_config.h"
#include "core/engine_lifetime.h"
#include "monitor/monitors.h"
#include "operation/message.h"

namespace collectives {

class Executor;

class EngineAutotune {
 public:
  // All the engine's, outliving this. `mu`: the engine's lock, which guards `lifetime`'s stop reason.
  EngineAutotune(EngineConfig& config, Executor& executor, Monitors& monitors, const JobLayout& job, std::mutex& mu,
                 EngineLifetime& lifetime)
      : config_(config), executor_(executor), monitors_(monitors), job_(job), mu_(mu), lifetime_(lifetime) {}

  // Setup: starts the tuner, and turns it off everywhere unless every rank's knobs agree
  // (one small allreduce, whether autotuning is on or not).
  Status Start();
  // Counts an executed data response's bytes toward the current sample.
  void Count(const Response& r);
  // After a cycle's execution; at a decision point every rank receives and applies rank 0's
  // choice. False when the engine must stop (the broadcast failed).
  bool AfterCycle(const std::vector<Response>& responses, Clock::time_point start);

 private:
  EngineConfig& config_;
  Executor& executor_;
  Monitors& monitors_;
  const JobLayout& job_;
  std::mutex& mu_;
  EngineLifetime& lifetime_;
};

}  // namespace collectives
