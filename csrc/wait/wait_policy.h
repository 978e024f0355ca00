// How a waiting thread treats its core: the one answer used by every wait in the engine that
// polls (the shared-memory barrier, MPI requests completed by mpi_wait.h, the short hand-off waits
// of spin.h). A wait goes through up to three phases, each looking at its condition between
// pauses:
//   spin   poll without giving the core away (a peer that is already there answers within
//          microseconds). Only where every local rank has a core (SetWaitSpinAllowed) and the
//          kernel's count of ready threads leaves one free.
//   yield  sched_yield between looks: the core goes to any thread that is ready to run there,
//          and the wait costs nothing to wake when none is.
//   sleep  block in the kernel between looks, the sleep doubling up to a bound.
// When the machine is oversubscribed (the threads ready to run, besides the waiting one, fill
// every core), a yield loop still takes a contended core: Linux's fair scheduler picks a
// yielding thread again soon, and a yield moves no thread from another core's queue. With 3
// ranks on 2 cores, yield loops made a soak of 6,000 small ops spend 6.7 min of system time in
// 5 min of wall clock (tests/engine/test_memory.py). So an oversubscribed wait skips the spin and has
// its own, short, yield phase before it sleeps.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>

namespace collectives {

// Once, at engine setup: whether waits may spin (false when the ranks on this machine outnumber
// its cores).
void SetWaitSpinAllowed(bool allowed);

// True when the threads ready to run, besides the caller and the threads of this host's ranks
// that are only waiting (in a spin or yield phase), fill every core: the kernel's instantaneous
// count (the 4th field of /proc/loadavg) minus the host's waiting threads. Without that
// subtraction our own waits made a quiet machine look full: 2 ranks each with a yielding thread
// besides the one reducing count 4 on 2 cores, and the waits then slept early, which slowed the
// 161 ResNet-50 gradients from 0.96-1.0x raw MPI's time to 1.15-1.19x. Cached for 20 ms: a read
// costs microseconds.
bool MachineOversubscribed();

// Once, at engine setup: the count of this host's waiting threads, in memory shared by the
// host's ranks (shared_segment.h); null: this process's own only. The memory is never unmapped
// (a thread of the process may be inside a wait when the engine stops; a re-init maps another).
void SetHostWaiters(std::atomic<int32_t>* counter);

struct WaitPhases {
  std::chrono::nanoseconds spin{0};                  // pure polling, where allowed
  std::chrono::nanoseconds yield{0};                 // then yielding between looks
  std::chrono::nanoseconds yield_oversubscribed{0};  // the yield phase on an oversubscribed machine
  // Then: sleeping between looks, from first_sleep doubling to longest_sleep; or, without
  // sleep, the wait is over (the caller blocks on something of its own, a condition variable).
  bool sleep = true;
  std::chrono::nanoseconds first_sleep{std::chrono::microseconds(20)};
  std::chrono::nanoseconds longest_sleep{std::chrono::microseconds(250)};
};

// One wait under a WaitPhases: the caller looks at its condition, then calls Pause(), and so on.
//   Waiter w(phases);
//   while (!done()) if (!w.Pause()) break;
class Waiter {
 public:
  explicit Waiter(const WaitPhases& phases);
  ~Waiter();
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;
  // Gives the core away as the current phase says. False when the phases are over (a policy
  // without sleep): the caller should block another way.
  bool Pause();

 private:
  using Clock = std::chrono::steady_clock;
  const WaitPhases phases_;
  Clock::time_point spin_until_, yield_until_;
  Clock::duration sleep_;
  unsigned pauses_ = 0;
  bool spinning_ = false;
  bool sleeping_ = false;
  std::atomic<int32_t>* counted_ = nullptr;  // the host's waiters, while this one spins or yields

  void Uncount();
};

}  // namespace collectives
