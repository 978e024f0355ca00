// Who runs the cycles, and when. Between cycles a thread waits here for work: our own
// submissions, a peer that starts a cycle (wakeups.h), or the next periodic cycle while some rank
// has work in flight. GPU work may be held back while the GPU still runs earlier collectives, so
// that it fuses (the GPU hold). The engine thread runs the cycles, except while a caller waiting
// for its own result runs them itself (RunCyclesInline; the engine thread is idle then).
//
// Locking: whoever runs a cycle holds cycle_mu(): the engine thread from Setup to Teardown except
// while it waits here, or a caller in RunCyclesInline. The cycle state below (active, cycles over,
// the last cycle's start, who ran it) is under it. The submission queue and the shutdown request
// are read under the engine's lock, given at construction in CycleInputs, exactly where the engine
// read them before. The GPU hold and the callers' abort are atomic (the NCCL completion thread and
// the watchdog's thread set them).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>

#include "common/clock.h"
#include "core/engine_config.h"
#include "core/engine_lifetime.h"
#include "core/submission_queue.h"
#include "core/wakeups.h"
#include "monitor/monitors.h"
#include "negotiation/negotiator.h"
#include "operation/handle_table.h"

namespace collectives {

class Executor;

// What the driver reads of the engine's state and the cycle it runs; the engine's, outliving it.
struct CycleInputs {
  std::mutex& mu;                   // the engine's lock: guards the queue and the shutdown request
  SubmissionQueue& queue;
  const EngineLifetime& lifetime;   // whether shutdown was asked for (under mu)
  const EngineConfig& config;       // the cycle time and fusion threshold as the autotuner leaves them
  const Executor& executor;         // whether the GPU is busy
  const Negotiator& negotiator;     // the cycle count, quiet cycles, whether entries are left
  const std::atomic<int>& gpu_device;  // this process's GPU (-1 until a GPU tensor is submitted)
  Monitors& monitors;               // counts the callers' cycles
  Wakeups& wakeups;
  // One cycle (CycleRunner::Run): false when the engine must stop; `declined` (a caller's cycle):
  // set when it was not run because it might include GPU work, which only the engine thread runs.
  std::function<bool(bool* active, bool* declined)> run_cycle;
};

class CycleDriver {
 public:
  explicit CycleDriver(CycleInputs in) : in_(std::move(in)) {}

  std::mutex& cycle_mu() { return cycle_mu_; }
  // The engine thread's cycles, until one decides that the engine stops; `cycle` (cycle_mu())
  // is held on entry and on return.
  void RunCycles(std::unique_lock<std::mutex>& cycle);
  // Runs cycles on the calling thread until `handle` completes or `until` passes, if no other
  // thread is running one; true when the handle is done.
  bool RunCyclesInline(HandleTable& handles, int64_t handle, Clock::time_point until);

  // Setup's end: the first cycle's interval counts from here.
  void Start() { last_cycle_start_ = Clock::now(); }
  // A cycle starts (CycleRunner::Run, cycle_mu() held): whatever was held goes into it.
  void CycleStarted(Clock::time_point now) {
    last_cycle_start_ = now;
    gpu_hold_.store(false);
  }
  // The GPU finished its work (NCCL completion thread): held GPU work may go now.
  void GpuIdle() {
    if (gpu_hold_.exchange(false)) in_.wakeups.Ring();
  }
  // Whether a caller waiting for its result may run the cycles itself: callers' cycles are on,
  // no GPU tensor was submitted (GPU work runs on the engine thread), the engine is not abandoned.
  bool CallerMayRunCycles() const {
    return in_.config.caller_cycles && in_.gpu_device < 0 && !in_.lifetime.abandoned();
  }
  // The watchdog fired: a caller running cycles stops waiting inside MPI and raises.
  void AbortCallers() { abort_inline_ = true; }

 private:
  // Returns when the next cycle is due; `cycle` (cycle_mu_) is held on entry and on return and
  // released while it sleeps. `until`: a caller running cycles gives up then.
  void WaitForCycle(std::unique_lock<std::mutex>& cycle, Clock::time_point until = Clock::time_point::max());
  // Under mu: whether the queued work (all of it for the GPU) waits, and until when, because
  // the GPU still runs earlier collectives.
  bool HoldForGpuFusion(Clock::time_point now, Clock::time_point* until);
  Clock::duration CycleTime() const;
  Clock::duration NextCycleInterval() const;  // from the last cycle's start to the next's, while active

  CycleInputs in_;
  std::mutex cycle_mu_;
  bool active_ = false;        // some rank has work in flight: the next cycle is due soon
  bool cycles_over_ = false;   // a cycle decided that the engine stops: the engine thread tears down
  bool caller_ran_last_ = false;  // the last cycle was a caller's: the engine thread stays asleep
  std::atomic<bool> abort_inline_{false};  // the watchdog fired: a caller stops waiting inside MPI
  std::atomic<bool> gpu_hold_{false};  // GPU work waits for the GPU to finish earlier work: ring when it has
  // After cycles in a row in which nothing happened anywhere (CycleCounts::quiet, negotiator.h), the next
  // cycle is due after 2^min(that count, kQuietDoublings) cycle times.
  static constexpr int kQuietDoublings = 5;
  Clock::time_point last_cycle_start_;
};

}  // namespace collectives
