// One cycle on the engine's side: the queue's new submissions go to the negotiator
// (negotiator.h), which returns what every rank runs next; the executor runs it (executor.h),
// reporting to the completion sink (completion_sink.h); then the autotuner's decision point, and whether the engine stops.
#include "core/engine.h"
#include "common/log.h"

namespace collectives {

bool Engine::RunCycle(bool* active, bool* declined) {
  const auto now = Clock::now();
  // The queue's vector and this one trade places each cycle, so neither allocates again: a small
  // allreduce's whole cycle takes a few microseconds, and every allocation counts.
  std::vector<Pending>& fresh = fresh_;
  fresh.clear();
  bool shutdown_local;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A caller's cycle (engine_inline.cc) runs no GPU work. A GPU submission sets gpu_device_
    // before it enters the queue, so checking here, where the queue is taken, misses none.
    if (declined && gpu_device_ >= 0) {
      *declined = true;
      return true;
    }
    queue_.TakeAll(&fresh);
    shutdown_local = lifetime_.stop_request_locked().asked();
  }
  driver_.CycleStarted(now);  // whatever was held goes into this cycle
  monitors_.timeline.MarkCycle();
  if (monitors_.stages_on)
    for (Pending& p : fresh) p.picked = now;

  const NegotiationContext ctx{process_sets_.sets(), monitors_.timeline, monitors_.watchdog, executor_, sink_, monitors_.stages_on};
  Negotiation n;
  const Status st = negotiator_.Negotiate(std::move(fresh), shutdown_local, now, ctx, &n);
  if (n.carried_bit >= 0 && monitors_.autotune.tuning()) autotune_.Count(negotiator_.cache().Get(n.carried_bit));
  if (!st.ok()) {
    if (n.failed_first) {
      std::lock_guard<std::mutex> lock(mu_);
      if (lifetime_.abandoned()) return false;  // a caller's wait gave up after the watchdog fired: its reason stays
      Log(LogLevel::ERROR, st.message + "; stopping the engine");
      lifetime_.set_stopped_status_locked(st);
      return false;
    }
    Log(LogLevel::ERROR, st.message + "; stopping the engine");
    std::lock_guard<std::mutex> lock(mu_);
    lifetime_.set_stopped_status_locked(st);
    return false;
  }

  ExecuteAll(n);
  if (monitors_.autotune.tuning() && !autotune_.AfterCycle(n.responses, now)) return false;
  negotiator_.EndCycle(n);
  *active = n.active;

  if (n.stall_shutdown) {
    Log(LogLevel::ERROR, "shutting down after a stall: " + n.stall_reason);
    std::lock_guard<std::mutex> lock(mu_);
    lifetime_.set_stopped_status_locked(
        Status::Error(StatusCode::TIMEOUT, "collectives shut down after a stall: " + n.stall_reason));
    return false;
  }
  if (n.shutdown) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!shutdown_local)
      lifetime_.set_stopped_status_locked(
          Status::Error(StatusCode::SHUT_DOWN, "collectives was shut down: another rank called shutdown() or exited"));
    return false;
  }
  return true;
}

void Engine::ExecuteAll(const Negotiation& n) {
  if (n.responses.empty()) return;
  CyclePlan plan;
  negotiator_.Plan(n.responses, process_sets_.sets(), &plan);
  const ExecutionContext ctx{process_sets_.sets(), monitors_.timeline, monitors_.watchdog, sink_, negotiator_.join().joined,
                             negotiator_.join().join_mode, config_.fusion_threshold, gpu_device_};
  executor_.Execute(plan, ctx);
  negotiator_.EndExecution(n.cache_bits, sink_, &plan);
}

}  // namespace collectives
