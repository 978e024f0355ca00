// How a rank's cycle-starting threads sleep between cycles, and how they are woken: by this
// process's own submissions, and by the ranks on the same host that start a cycle (which the
// sleepers must join). A futex word per local rank, in memory shared by the host's ranks.
//
// Why not poll for the peers' MPI wake messages: the engine thread then woke every 100 us while
// any rank had work in flight, and during a backward pass (gradients arrive over tens of
// milliseconds, at different times on each rank) each of those wake-ups took a core from the
// ranks' compute threads. On the 2-core VM the CNN step of the peer kit spent ~170 voluntary
// context switches per step in the engine thread and its data-parallel overhead grew from 1.9 ms
// (round 1's build, fewer polls) to 6-8 ms. A futex wait costs no wake-up until someone rings.
// Ranks on other hosts still wake us with MPI messages, which have to be polled for.
#pragma once
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace collectives {

class Doorbell {
 public:
  Doorbell();
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  // Collective over `comm` (the engine's) and `local_comm` (its ranks on this host). Maps one
  // bell per local rank in shared memory; when that cannot be done every rank of the host keeps a
  // bell of its own only (peers then wake it with MPI messages). An error only when MPI fails.
  Status Init(MPI_Comm comm, MPI_Comm local_comm);

  // Whether `rank` (of the engine's communicator) is rung here rather than sent an MPI message.
  bool RingsPeer(int rank) const;
  // Whether some peer can only wake us by an MPI message (it is on another host, or shared memory
  // failed): the sleeping thread then has to poll for those.
  bool HasMpiPeers() const { return mpi_peers_; }

  // The bell's count, to read before looking at the conditions a sleeper waits for; Sleep returns
  // at once when it has changed since.
  uint32_t Seen() const;
  // Sleeps until someone rings (the count differs from `seen`) or `until` passes. A sleeper that
  // does not `hear_peers` is woken only by RingOwn: the engine thread while its process's callers
  // answer the peers (engine_wake.cc).
  void Sleep(uint32_t seen, std::chrono::steady_clock::time_point until, bool hear_peers);
  // Wakes this process's sleepers (a submission, a shutdown, the watchdog).
  void RingOwn();
  // Wakes `rank`'s sleepers, telling them that a cycle numbered `cycle` is starting.
  void RingPeer(int rank, uint64_t cycle);
  // Whether a peer on this host announced a cycle numbered `cycle` or later (an earlier one is
  // stale: this rank ran it already).
  bool PeerStarted(uint64_t cycle) const;

 private:
  struct alignas(64) Bell {
    std::atomic<uint32_t> count;      // the futex word: bumped by each ring
    std::atomic<uint32_t> sleepers;   // threads in Sleep: a ring with none makes no system call
    std::atomic<uint32_t> listeners;  // those of them that hear the peers' rings (the same, for those)
    std::atomic<uint64_t> announced;  // the highest cycle a peer said it is starting
  };
  static void Ring(Bell* bell, uint32_t wakes, const std::atomic<uint32_t>& waiting);

  Bell own_{};                  // used when the host's bells could not be mapped
  Bell* bells_ = nullptr;       // one per local rank, in shared memory; null: none
  Bell* mine_ = &own_;
  std::vector<int> local_index_;  // per rank of the engine's communicator: its bell, or -1
  bool mpi_peers_ = false;
};

}  // namespace collectives
