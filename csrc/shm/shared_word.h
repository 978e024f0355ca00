// A 32-bit counter in memory shared by the ranks of one host that one rank advances and the
// others wait on: first looking (spin, then yield, as wait_policy.h says), then asleep on the word
// as a futex, which the advancing rank wakes. While asleep, a waiter looks every 20 ms whether the
// process it waits for still exists and whether the watchdog aborted its wait (mpi_wait.h), so a
// dead peer is an error, never a hang. Used by the negotiation's exchange (shared_exchange.h) and
// the cross-memory allreduce (cross_memory_allreduce.h).
#pragma once
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "wait/wait_policy.h"

namespace collectives {

// Wrapping counters: whether `value` has reached `target` (they never drift 2^31 apart).
inline bool Reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

// One cache line pair of its own: the word, and how many waiters sleep on it.
struct alignas(128) SharedWord {
  std::atomic<uint32_t> value{0};
  std::atomic<uint32_t> sleepers{0};

  // Stores `v` and wakes the sleepers.
  void Publish(uint32_t v);
  // Adds `n` and wakes the sleepers; returns the new value.
  uint32_t Add(uint32_t n);
  // Until value reaches `target`. `phases` must have sleep = false (the futex is the sleep).
  // `pids`: the host's ranks' processes, any of which (but `self`) may be the one to advance the
  // word; `during` completes "rank R (pid P) exited during ..." in the error.
  Status WaitReached(uint32_t target, const WaitPhases& phases, const std::vector<pid_t>& pids, int self,
                     const char* during);
};

}  // namespace collectives
