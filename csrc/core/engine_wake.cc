// Between cycles: waiting for work (our own submissions, or a peer that starts a cycle: its ring
// on the doorbell from this host, its wake message from another), and waking the peers when our
// own work (or the deadline) starts a cycle.
#include "core/engine.h"
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

void Engine::WaitForCycle(std::unique_lock<std::mutex>& cycle, Clock::time_point until) {
  const bool caller = until != Clock::time_point::max();  // engine_inline.cc; else the engine thread
  bool start_others = false;  // this rank starts the cycle: ring the others, who may be asleep
  while (!cycles_over_) {
    // Read before looking at anything a ring announces (doorbell.h): a ring after this look
    // ends the sleep below at once.
    const uint32_t seen = bell_.Seen();
    // Computed afresh each time: a caller may have run cycles while this thread slept.
    const bool active = active_;
    auto deadline = active ? last_cycle_start_ + NextCycleInterval() : Clock::time_point::max();
    {
      std::lock_guard<std::mutex> lock(mu_);
      Clock::time_point held_until;
      if (shutdown_requested_ || (queue_.HasUnclaimed() && !HoldForGpuFusion(Clock::now(), &held_until))) {
        gpu_hold_.store(false);
        start_others = true;
        break;
      }
      // Held: the periodic cycles wait too (one would take the held work with it). A peer's
      // cycle still starts ours (PeerStarted), and the GPU going idle rings (engine.cc).
      if (queue_.HasUnclaimed()) deadline = held_until;
    }
    if (PeerStarted()) {
      // A peer started the cycle; our own submission is often microseconds behind. Give it
      // a moment so that it joins this cycle instead of needing the next one.
      if (spin_) {
        const uint64_t submitted = submissions_.load();
        SpinFor([&] { return submissions_.load() != submitted; });
      }
      break;
    }
    const auto now = Clock::now();
    if (now >= until) break;
    if (now >= deadline) {
      start_others = true;
      break;
    }
    if (caller && spin_ && active) {
      // A caller waiting for a peer (engine_inline.cc) has nothing else to do: watch for the
      // peer's start for a moment rather than sleep past it.
      // A wake message is consumed by the look that finds it: act on it here (the loop's next
      // look would not see it again). A ring is looked at again at the loop's top.
      bool by_message = false;
      const uint64_t submitted = submissions_.load();
      SpinFor([&] {
        by_message = bell_.HasMpiPeers() && PollWake();
        return by_message || bell_.Seen() != seen || submissions_.load() != submitted;
      });
      if (by_message) break;
      if (bell_.Seen() != seen) continue;
    }
    // Not holding the cycle while waiting lets a caller run it (engine_inline.cc). While callers
    // run the cycles, this thread neither spins nor listens for the peers between cycles (its own
    // callers answer them): it would take a core from them at every submission. It still looks
    // after a poll interval, and when nobody rang in that interval (no caller is running cycles
    // any more) it listens again, so that an idle rank does not wake every poll interval.
    const bool callers = caller_ran_last_ && !caller;
    cycle.unlock();
    bool submitted = false;
    if (spin_ && active && !caller && !callers) {
      const uint64_t before = submissions_.load();
      submitted = SpinFor([&] { return submissions_.load() != before; });
    }
    if (!submitted) {
      auto wake_at = std::min(deadline, until);
      if (callers)
        wake_at = std::min(wake_at, now + (active ? CycleTime() : Clock::duration(kIdlePoll)));
      else if (bell_.HasMpiPeers())  // peers on other hosts wake us only by messages: poll for them
        wake_at = std::min(wake_at, now + (active ? Clock::duration(kActivePoll) : Clock::duration(kIdlePoll)));
      bell_.Sleep(seen, std::min(wake_at, now + kLongestSleep), /*hear_peers=*/!callers);
    }
    cycle.lock();
    if (callers && bell_.Seen() == seen) caller_ran_last_ = false;
  }
  if (start_others && !cycles_over_) SendWake();
}

bool Engine::HoldForGpuFusion(Clock::time_point now, Clock::time_point* until) {
  // GPU collectives run one after another on the engine stream, so work that arrives while the
  // GPU still runs earlier collectives could not start sooner anyway. Negotiated at once, each
  // of a burst of gradients (a backward pass hands them over one by one) would be an NCCL call
  // of its own, each paying NCCL's latency: 161 ResNet-50 gradients took 12 times one call of
  // their total size on an H200 (two ranks, NCCL over sockets). Waiting until the GPU is done,
  // at most COLLECTIVES_GPU_FUSION_WAIT_MS after the oldest of them arrived, lets them fuse.
  // Host work, and GPU work that finds the GPU idle (a lone allreduce, a synchronous loop),
  // starts at once, and so does a fusion buffer's worth: it is as fused as it gets.
  if (!config_.gpu_fusion_wait || !executor_.GpuBusy()) return false;
  const SubmissionQueue::Unclaimed waiting = queue_.DescribeUnclaimed();
  if (!waiting.all_gpu || waiting.bytes >= config_.fusion_threshold) return false;
  const Clock::time_point release = waiting.oldest + Milliseconds(config_.gpu_fusion_wait_ms);
  if (now >= release) return false;
  gpu_hold_.store(true);
  // The GPU may have finished between the first look and the flag, whose ring would be missed.
  if (!executor_.GpuBusy()) return false;
  *until = release;
  return true;
}

bool Engine::PeerStarted() {
  // Both, always, where some peer is reached by messages: PollWake also completes our own wake
  // sends. Where none is, nothing is sent or received, and an MPI_Test (which runs MPICH's
  // progress engine) per look would be wasted.
  const bool by_message = bell_.HasMpiPeers() && PollWake();
  return bell_.PeerStarted(negotiator_.cycle()) || by_message;
}

auto Engine::CycleTime() const -> Clock::duration {
  return Milliseconds(config_.cycle_time_ms);
}

auto Engine::NextCycleInterval() const -> Clock::duration {
  // After cycles in which nothing happened anywhere (some rank waits for the others' submissions,
  // which will start a cycle themselves), the next one is due later and later: 2, 4 ... 32 cycle
  // times. Such cycles only look for stalls and anything a submission did not announce.
  return CycleTime() * (1 << std::min(negotiator_.quiet_cycles(), kQuietDoublings));
}

bool Engine::PollWake() { return wake_messages_.Poll(negotiator_.cycle()); }

void Engine::SendWake() {
  for (int peer = 0; peer < job_.size; ++peer) {
    if (peer == job_.rank) continue;
    if (bell_.RingsPeer(peer)) {
      bell_.RingPeer(peer, negotiator_.cycle());
      continue;
    }
    wake_messages_.Send(peer, negotiator_.cycle());
  }
}

}  // namespace collectives
