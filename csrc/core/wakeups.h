// How the threads that start cycles wake each other: our own submissions ring this process's
// doorbell, a peer on this host that starts a cycle rings ours (shm/doorbell.h), a peer on another
// host sends a wake message (wake_messages.h). Also whether waiting threads spin briefly first.
//
// Locking: none of its own, and none needed. The doorbell and the submission count are atomic;
// a ring comes after the state it announces changed (under the engine's lock, or atomically), so a
// sleeper that read Seen() before looking misses none. The wake messages are MPI calls made by
// whoever runs or waits for a cycle (the engine's cycle_mu_), and at teardown.
#pragma once
#include <mpi.h>

#include <atomic>
#include <cstdint>

#include "backends/mpi/job_layout.h"
#include "common/clock.h"
#include "common/status.h"
#include "core/wake_messages.h"
#include "shm/doorbell.h"

namespace collectives {

class Wakeups {
 public:
  // Setup: the doorbells in shared memory (collective over the job and the host). `spin`: every
  // rank on this machine has a core, so short spins before sleeping are worth it.
  Status Init(const JobLayout& job, bool spin);
  // Setup's end: the receive for the first wake message (on job.comm).
  void StartMessages(MPI_Comm comm) { wake_messages_.Start(comm); }
  // Teardown, once no wake message can be in flight: receives what arrived, completes the sends.
  void Drain() { wake_messages_.Drain(); }

  bool spin() const { return spin_; }
  // Wakes this process's sleeper (the engine thread, or a caller waiting for a cycle).
  void Ring() { bell_.RingOwn(); }
  // A submission (or an error submission) entered the queue; a spinning waiter watches the count.
  void Submitted() { submissions_.fetch_add(1); }
  uint64_t submissions() const { return submissions_.load(); }

  // The doorbell's side of a sleep (doorbell.h): read Seen() before looking, sleep unless it changed.
  uint32_t Seen() const { return bell_.Seen(); }
  void Sleep(uint32_t seen, Clock::time_point until, bool hear_peers) { bell_.Sleep(seen, until, hear_peers); }
  // Some peer is reached by messages only (another host), so waiting threads poll for them.
  bool HasMpiPeers() const { return bell_.HasMpiPeers(); }

  // A peer started the cycle we are to run next (`cycle`): its ring, or its wake message.
  bool PeerStarted(uint64_t cycle);
  // A wake message for `cycle` or later arrived (the look consumes it); completes our sends too.
  bool PollWake(uint64_t cycle) { return wake_messages_.Poll(cycle); }
  // This rank starts `cycle`: rings the peers on this host, sends the others a message.
  void SendWake(uint64_t cycle);

 private:
  int rank_ = 0;
  int size_ = 1;
  // Short spins before sleeping save the wake-up latency of a condition variable (tens of
  // microseconds on a VM) when a core is free for it; off when ranks oversubscribe the cores.
  bool spin_ = false;
  std::atomic<uint64_t> submissions_{0};  // bumped by Enqueue
  // Where the threads that start cycles sleep between them, woken by our own submissions and by
  // the peers on this host that start a cycle (doorbell.h). Rung after the state it announces
  // changed (under mu_ or atomically), so a sleeper that read Seen() before looking misses none.
  Doorbell bell_;
  WakeMessages wake_messages_;  // to and from peers on other hosts
};

}  // namespace collectives
