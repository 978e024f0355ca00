// Between cycles: waiting for work (our own submissions, or a peer that starts a cycle: its ring
// on the doorbell from this host, its wake message from another), and waking the peers when our
// own work (or the deadline) starts a cycle (cycle_driver.h). Who runs the cycles: the engine
// thread, or a caller waiting for its own result (RunCyclesInline, below).
#include "core/cycle_driver.h"

#include "backends/mpi/mpi_wait.h"
#include "execution/executor.h"
#include "wait/spin.h"

namespace collectives {
namespace {

// A knob's milliseconds (a double: fractions count) as the engine's clock duration.
Clock::duration Milliseconds(double ms) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
}

// How often a waiting thread checks for the wake messages of peers on other hosts (the doorbell
// needs no polling). Active: some rank has work in flight, so answer quickly. Idle: nothing
// anywhere; a peer's wake matters only when that peer is ahead of us, and our own submissions
// wake us at once. kIdlePoll is also how often the engine thread looks while its callers run the
// cycles.
constexpr auto kActivePoll = std::chrono::microseconds(100);
constexpr auto kIdlePoll = std::chrono::milliseconds(2);
// Sleeps on the doorbell end at least this often, as a safety net.
constexpr auto kLongestSleep = std::chrono::milliseconds(100);

}  // namespace

void CycleDriver::WaitForCycle(std::unique_lock<std::mutex>& cycle, Clock::time_point until) {
  const bool caller = until != Clock::time_point::max();  // RunCyclesInline; else the engine thread
  bool start_others = false;  // this rank starts the cycle: ring the others, who may be asleep
  while (!cycles_over_) {
    // Read before looking at anything a ring announces (doorbell.h): a ring after this look
    // ends the sleep below at once.
    const uint32_t seen = in_.wakeups.Seen();
    // Computed afresh each time: a caller may have run cycles while this thread slept.
    const bool active = active_;
    auto deadline = active ? last_cycle_start_ + NextCycleInterval() : Clock::time_point::max();
    {
      std::lock_guard<std::mutex> lock(in_.mu);
      Clock::time_point held_until;
      if (in_.lifetime.stop_request_locked().asked() ||
          (in_.queue.HasUnclaimed() && !HoldForGpuFusion(Clock::now(), &held_until))) {
        gpu_hold_.store(false);
        start_others = true;
        break;
      }
      // Held: the periodic cycles wait too (one would take the held work with it). A peer's
      // cycle still starts ours (PeerStarted), and the GPU going idle rings (GpuIdle).
      if (in_.queue.HasUnclaimed()) deadline = held_until;
    }
    if (in_.wakeups.PeerStarted(in_.negotiator.cycles().completed)) {
      // A peer started the cycle; our own submission is often microseconds behind. Give it
      // a moment so that it joins this cycle instead of needing the next one.
      if (in_.wakeups.spin()) {
        const uint64_t submitted = in_.wakeups.submissions();
        SpinFor([&] { return in_.wakeups.submissions() != submitted; });
      }
      break;
    }
    const auto now = Clock::now();
    if (now >= until) break;
    if (now >= deadline) {
      start_others = true;
      break;
    }
    if (caller && in_.wakeups.spin() && active) {
      // A caller waiting for a peer (RunCyclesInline) has nothing else to do: watch for the
      // peer's start for a moment rather than sleep past it.
      // A wake message is consumed by the look that finds it: act on it here (the loop's next
      // look would not see it again). A ring is looked at again at the loop's top.
      bool by_message = false;
      const uint64_t submitted = in_.wakeups.submissions();
      SpinFor([&] {
        by_message = in_.wakeups.HasMpiPeers() && in_.wakeups.PollWake(in_.negotiator.cycles().completed);
        return by_message || in_.wakeups.Seen() != seen || in_.wakeups.submissions() != submitted;
      });
      if (by_message) break;
      if (in_.wakeups.Seen() != seen) continue;
    }
    // Not holding the cycle while waiting lets a caller run it (RunCyclesInline). While callers
    // run the cycles, this thread neither spins nor listens for the peers between cycles (its own
    // callers answer them): it would take a core from them at every submission. It still looks
    // after a poll interval, and when nobody rang in that interval (no caller is running cycles
    // any more) it listens again, so that an idle rank does not wake every poll interval.
    const bool callers = caller_ran_last_ && !caller;
    cycle.unlock();
    bool submitted = false;
    if (in_.wakeups.spin() && active && !caller && !callers) {
      const uint64_t before = in_.wakeups.submissions();
      submitted = SpinFor([&] { return in_.wakeups.submissions() != before; });
    }
    if (!submitted) {
      auto wake_at = std::min(deadline, until);
      if (callers)
        wake_at = std::min(wake_at, now + (active ? CycleTime() : Clock::duration(kIdlePoll)));
      else if (in_.wakeups.HasMpiPeers())  // peers on other hosts wake us only by messages: poll for them
        wake_at = std::min(wake_at, now + (active ? Clock::duration(kActivePoll) : Clock::duration(kIdlePoll)));
      in_.wakeups.Sleep(seen, std::min(wake_at, now + kLongestSleep), /*hear_peers=*/!callers);
    }
    cycle.lock();
    if (callers && in_.wakeups.Seen() == seen) caller_ran_last_ = false;
  }
  if (start_others && !cycles_over_) in_.wakeups.SendWake(in_.negotiator.cycles().completed);
}

bool CycleDriver::HoldForGpuFusion(Clock::time_point now, Clock::time_point* until) {
  // GPU collectives run one after another on the engine stream, so work that arrives while the
  // GPU still runs earlier collectives could not start sooner anyway. Negotiated at once, each
  // of a burst of gradients (a backward pass hands them over one by one) would be an NCCL call
  // of its own, each paying NCCL's latency: 161 ResNet-50 gradients took 12 times one call of
  // their total size on an H200 (two ranks, NCCL over sockets). Waiting until the GPU is done,
  // at most COLLECTIVES_GPU_FUSION_WAIT_MS after the oldest of them arrived, lets them fuse.
  // Host work, and GPU work that finds the GPU idle (a lone allreduce, a synchronous loop),
  // starts at once, and so does a fusion buffer's worth: it is as fused as it gets.
  if (!in_.config.gpu_fusion_wait || !in_.executor.device().Busy()) return false;
  const SubmissionQueue::Unclaimed waiting = in_.queue.DescribeUnclaimed();
  if (!waiting.all_gpu || waiting.bytes >= in_.config.fusion_threshold) return false;
  const Clock::time_point release = waiting.oldest + Milliseconds(in_.config.gpu_fusion_wait_ms);
  if (now >= release) return false;
  gpu_hold_.store(true);
  // The GPU may have finished between the first look and the flag, whose ring would be missed.
  if (!in_.executor.device().Busy()) return false;
  *until = release;
  return true;
}

auto CycleDriver::CycleTime() const -> Clock::duration {
  return Milliseconds(in_.config.cycle_time_ms);
}

auto CycleDriver::NextCycleInterval() const -> Clock::duration {
  // After cycles in which nothing happened anywhere (some rank waits for the others' submissions,
  // which will start a cycle themselves), the next one is due later and later: 2, 4 ... 32 cycle
  // times. Such cycles only look for stalls and anything a submission did not announce.
  return CycleTime() * (1 << std::min(in_.negotiator.cycles().quiet, kQuietDoublings));
}

void CycleDriver::RunCycles(std::unique_lock<std::mutex>& cycle) {
  while (true) {
    WaitForCycle(cycle);
    if (cycles_over_) break;  // a caller's cycle decided to stop
    caller_ran_last_ = false;
    if (!in_.run_cycle(&active_, nullptr)) break;
  }
  cycles_over_ = true;
}

// A caller waiting for its own result runs the negotiation cycles itself while the engine thread
// is idle (engine_inline.cc says why). Not for GPU tensors: the CUDA context and the NCCL
// completion logic belong to the engine thread.
bool CycleDriver::RunCyclesInline(HandleTable& handles, int64_t handle, Clock::time_point until) {
  std::unique_lock<std::mutex> cycle(cycle_mu_, std::try_to_lock);
  if (!cycle.owns_lock()) return false;  // the engine thread is in a cycle: it will finish ours
  {
    std::lock_guard<std::mutex> lock(in_.mu);
    in_.queue.Unclaim();  // ours now: this thread's WaitForCycle sees them as local work
  }
  SetWaitAbort(&abort_inline_);
  while (!cycles_over_ && !abort_inline_ && !handles.Poll(handle) && Clock::now() < until) {
    WaitForCycle(cycle, until);
    if (cycles_over_ || Clock::now() >= until) break;
    bool declined = false;
    const bool go_on = in_.run_cycle(&active_, &declined);
    if (declined) break;  // GPU work: the engine thread's
    ++in_.monitors.inline_cycles;
    caller_ran_last_ = true;
    if (!go_on) cycles_over_ = true;  // the engine thread tears down
  }
  SetWaitAbort(nullptr);
  // Work left here (other threads' submissions, or the engine's end) is the engine thread's again:
  // wake it rather than leave it to its next poll.
  bool left = cycles_over_ || in_.negotiator.has_work() || in_.gpu_device >= 0;
  {
    std::lock_guard<std::mutex> lock(in_.mu);
    left = left || in_.queue.HasUnclaimed();
  }
  cycle.unlock();
  if (left) in_.wakeups.Ring();
  return handles.Poll(handle);
}

}  // namespace collectives
