// Between cycles: waiting for work (our own submissions or a peer's wake message), and waking
// the peers when our own work starts a cycle.
#include "engine.h"
#include "spin.h"

namespace collectives {
namespace {

// How often a waiting engine thread checks for a peer's wake message. Active: some rank
// has work in flight, so answer quickly. Idle: nothing anywhere; a peer's wake matters only
// when that peer is ahead of us, and our own submissions wake us at once.
constexpr auto kActivePoll = std::chrono::microseconds(100);
constexpr auto kIdlePoll = std::chrono::milliseconds(2);

}  // namespace

void Engine::WaitForCycle(std::unique_lock<std::mutex>& cycle, Clock::time_point until) {
  const bool caller = until != Clock::time_point::max();  // engine_inline.cc; else the engine thread
  bool local = false;
  while (!cycles_over_) {
    // Computed afresh each time: a caller may have run cycles while this thread slept.
    const bool active = active_;
    const auto deadline =
        active ? last_cycle_start_ + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double, std::milli>(config_.cycle_time_ms))
               : Clock::time_point::max();
    const auto poll = active ? Clock::duration(kActivePoll) : Clock::duration(kIdlePoll);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (incoming_.size() > claimed_ || shutdown_requested_) {
        local = true;
        break;
      }
    }
    if (PollWake()) {
      // A peer started the cycle; our own submission is often microseconds behind. Give it
      // a moment so that it joins this cycle instead of needing the next one.
      if (spin_) {
        const uint64_t seen = submissions_.load();
        SpinFor([&] { return submissions_.load() != seen; });
      }
      break;
    }
    const auto now = Clock::now();
    if (now >= deadline || now >= until) break;
    if (caller && spin_ && active) {
      // A caller waiting for a peer (engine_inline.cc) has nothing else to do: watch for the
      // peer's wake for a moment rather than sleep a poll interval past it.
      bool woke = false;
      const uint64_t seen = submissions_.load();
      SpinFor([&] {
        woke = PollWake();
        return woke || submissions_.load() != seen;
      });
      if (woke) break;
    }
    // Not holding the cycle while waiting lets a caller run it (engine_inline.cc). While callers
    // run the cycles, this thread neither spins nor polls for wakes between cycles (its own
    // callers answer them): it would take a core from them at every submission.
    const bool callers = caller_ran_last_ && !caller;
    cycle.unlock();
    bool submitted = false;
    if (spin_ && active && !caller && !callers) {
      const uint64_t seen = submissions_.load();
      submitted = SpinFor([&] { return submissions_.load() != seen; });
    }
    if (!submitted) {
      std::unique_lock<std::mutex> lock(mu_);
      auto wake_at = (deadline - now < poll || (callers && active)) ? deadline : now + poll;
      if (until < wake_at) wake_at = until;
      work_cv_.wait_until(lock, wake_at, [this] { return incoming_.size() > claimed_ || shutdown_requested_; });
    }
    cycle.lock();
  }
  // Our own work starts the cycle: tell the others, who may be idle, to join it now.
  if (local && !cycles_over_) SendWake();
}

bool Engine::PollWake() {
  bool woke = false;
  while (wake_recv_ != MPI_REQUEST_NULL) {
    int flag = 0;
    MPI_Test(&wake_recv_, &flag, MPI_STATUS_IGNORE);
    if (!flag) break;
    // A wake names the cycle its sender is entering; an older one is stale.
    if (wake_buf_ >= static_cast<int64_t>(cycle_)) woke = true;
    MPI_Irecv(&wake_buf_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kWakeTag, comm_, &wake_recv_);
  }
  while (!wake_sends_.empty()) {
    int flag = 0;
    MPI_Test(&wake_sends_.front().second, &flag, MPI_STATUS_IGNORE);
    if (!flag) break;
    wake_sends_.pop_front();
  }
  return woke;
}

void Engine::SendWake() {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    std::unique_ptr<int64_t> value(new int64_t(static_cast<int64_t>(cycle_)));
    MPI_Request req;
    MPI_Isend(value.get(), 1, MPI_INT64_T, peer, kWakeTag, comm_, &req);
    wake_sends_.emplace_back(std::move(value), req);
  }
}

}  // namespace collectives
