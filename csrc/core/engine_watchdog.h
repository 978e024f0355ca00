// The engine's side of the watchdog (monitor/watchdog.h): the ranks' hosts, learned at Setup so
// that a report can name them, and what a backend call that never returns does to this process:
// the engine is abandoned (engine_lifetime.h), every waiting handle fails, a caller running the
// cycle stops waiting inside MPI.
#pragma once
#include <atomic>
#include <mutex>
#include <string>

#include "backends/mpi/job_layout.h"
#include "common/status.h"
#include "core/completion_sink.h"
#include "core/cycle_driver.h"
#include "core/engine_config.h"
#include "core/engine_lifetime.h"
#include "core/process_set_table.h"
#include "core/wakeups.h"
#include "monitor/monitors.h"

namespace collectives {

class EngineWatchdog {
 public:
  EngineWatchdog(const EngineConfig& config, const JobLayout& job, Monitors& monitors, const ProcessSetTable& sets,
                 std::mutex& mu, EngineLifetime& lifetime, CompletionSink& sink, CycleDriver& driver,
                 Wakeups& wakeups)
      : config_(config), job_(job), monitors_(monitors), sets_(sets), mu_(mu), lifetime_(lifetime), sink_(sink),
        driver_(driver), wakeups_(wakeups) {}

  // At Setup (collective: the host names): starts the watchdog when the stall shutdown time is
  // set. `step`: what setup waits for, for the init timeout's message.
  Status Start(std::atomic<const char*>* step);

 private:
  // On the watchdog's thread, while the engine thread is stuck in MPI for good.
  void OnBackendStall(const std::string& message);

  const EngineConfig& config_;
  const JobLayout& job_;
  Monitors& monitors_;
  const ProcessSetTable& sets_;
  std::mutex& mu_;  // the engine's: the lifetime's lock
  EngineLifetime& lifetime_;
  CompletionSink& sink_;
  CycleDriver& driver_;
  Wakeups& wakeups_;
};

}  // namespace collectives
