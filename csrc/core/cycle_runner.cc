// One cycle on the engine's side (cycle_runner.h): the queue's new submissions go to the
// negotiator (negotiator.h), which returns what every rank runs next; the executor runs it
// (executor.h), reporting to the completion sink (completion_sink.h); then the autotuner's
// decision point, and whether the engine stops.
#include "core/cycle_runner.h"
#include "common/log.h"

namespace collectives {

bool CycleRunner::Run(bool* active, bool* declined) {
  const auto now = Clock::now();
  // The queue's vector and this one trade places each cycle, so neither allocates again: a small
  // allreduce's whole cycle takes a few microseconds, and every allocation counts.
  std::vector<Pending>& fresh = fresh_;
  fresh.clear();
  bool shutdown_local;
  {
    std::lock_guard<std::mutex> lock(in_.mu);
    // A caller's cycle (engine_inline.cc) runs no GPU work. A GPU submission sets the engine's
    // gpu_device before it enters the queue, so checking here, where the queue is taken, misses none.
    if (declined && in_.gpu_device >= 0) {
      *declined = true;
      return true;
    }
    in_.queue.TakeAll(&fresh);
    shutdown_local = in_.lifetime.stop_request_locked().asked();
  }
  in_.driver.CycleStarted(now);  // whatever was held goes into this cycle
  in_.monitors.timeline.MarkCycle();
  if (in_.monitors.stages_on)
    for (Pending& p : fresh) p.picked = now;

  const NegotiationContext ctx{in_.process_sets.sets(), in_.monitors.timeline, in_.monitors.watchdog,
                               in_.executor,           in_.sink,               in_.monitors.stages_on};
  Negotiation n;
  const Status st = in_.negotiator.Negotiate(std::move(fresh), shutdown_local, now, ctx, &n);
  if (n.carried_bit >= 0 && in_.monitors.autotune.tuning())
    in_.autotune.Count(in_.negotiator.cache().Get(n.carried_bit));
  if (!st.ok()) {
    if (n.failed_first) {
      std::lock_guard<std::mutex> lock(in_.mu);
      if (in_.lifetime.abandoned()) return false;  // a caller's wait gave up after the watchdog fired: its reason stays
      Log(LogLevel::ERROR, st.message + "; stopping the engine");
      in_.lifetime.set_stopped_status_locked(st);
      return false;
    }
    Log(LogLevel::ERROR, st.message + "; stopping the engine");
    std::lock_guard<std::mutex> lock(in_.mu);
    in_.lifetime.set_stopped_status_locked(st);
    return false;
  }

  ExecuteAll(n);
  if (in_.monitors.autotune.tuning() && !in_.autotune.AfterCycle(n.responses, now)) return false;
  in_.negotiator.EndCycle(n);
  *active = n.active;

  if (n.stall_shutdown) {
    Log(LogLevel::ERROR, "shutting down after a stall: " + n.stall_reason);
    std::lock_guard<std::mutex> lock(in_.mu);
    in_.lifetime.set_stopped_status_locked(
        Status::Error(StatusCode::TIMEOUT, "collectives shut down after a stall: " + n.stall_reason));
    return false;
  }
  if (n.shutdown) {
    std::lock_guard<std::mutex> lock(in_.mu);
    if (!shutdown_local)
      in_.lifetime.set_stopped_status_locked(
          Status::Error(StatusCode::SHUT_DOWN, "collectives was shut down: another rank called shutdown() or exited"));
    return false;
  }
  return true;
}

void CycleRunner::ExecuteAll(const Negotiation& n) {
  if (n.responses.empty()) return;
  CyclePlan plan;
  in_.negotiator.Plan(n.responses, in_.process_sets.sets(), &plan);
  const ExecutionContext ctx{in_.process_sets.sets(),         in_.monitors.timeline,
                             in_.monitors.watchdog,            in_.sink,
                             in_.negotiator.join().joined,     in_.negotiator.join().join_mode,
                             in_.config.fusion_threshold,      in_.gpu_device};
  in_.executor.Execute(plan, ctx);
  in_.negotiator.EndExecution(n.cache_bits, in_.sink, &plan);
}

}  // namespace collectives
