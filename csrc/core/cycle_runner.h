// One cycle of the engine (cycle_runner.cc): this rank's share of the submission queue to the
// negotiator (negotiator.h), which returns what every rank runs next; the negotiator plans this
// rank's part (cycle_plan.h), the executor runs it (executor.h) and reports each outcome to the
// completion sink; the autotuner's hooks; and the decision whether the engine stops. Run by
// whoever holds the cycle driver's cycle_mu (cycle_driver.h): the engine thread, or a caller
// waiting for its own result while the engine thread is idle.
#pragma once
#include <atomic>
#include <mutex>
#include <vector>

#include "core/completion_sink.h"
#include "core/cycle_driver.h"
#include "core/engine_autotune.h"
#include "core/engine_config.h"
#include "core/engine_lifetime.h"
#include "core/process_set_table.h"
#include "core/submission_queue.h"
#include "execution/executor.h"
#include "monitor/monitors.h"
#include "negotiation/negotiator.h"
#include "operation/pending.h"

namespace collectives {

// What a cycle uses of the engine's objects.
struct CycleParts {
  std::mutex& mu;  // the engine's: the queue, the lifetime
  SubmissionQueue& queue;
  EngineLifetime& lifetime;
  const EngineConfig& config;
  const std::atomic<int>& gpu_device;
  Monitors& monitors;
  EngineAutotune& autotune;
  Negotiator& negotiator;
  ProcessSetTable& process_sets;
  Executor& executor;
  CompletionSink& sink;
  CycleDriver& driver;
};

class CycleRunner {
 public:
  explicit CycleRunner(CycleParts parts) : in_(parts) {}

  // One cycle; returns false when the engine must stop. `declined`: given by a caller running
  // the cycle (engine_inline.cc), set when the cycle was not run because it might include GPU
  // work, which only the engine thread runs.
  bool Run(bool* active, bool* declined = nullptr);

 private:
  // Runs a negotiation's responses: the negotiator plans this rank's part (cycle_plan.h), the
  // executor runs it with what it needs of the engine's state and reports each outcome to the
  // completion sink, and the negotiator finishes the cycle (its table, its cache).
  void ExecuteAll(const Negotiation& n);

  CycleParts in_;
  // A cycle's share of the queue; under the cycle driver's cycle_mu.
  std::vector<Pending> fresh_;
};

}  // namespace collectives
