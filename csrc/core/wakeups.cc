// Waking the peers that start a cycle, and hearing them (wakeups.h).
#include "core/wakeups.h"

namespace collectives {

Status Wakeups::Init(const JobLayout& job, bool spin) {
  rank_ = job.rank;
  size_ = job.size;
  spin_ = spin;
  return bell_.Init(job.comm, job.local_comm);
}

bool Wakeups::PeerStarted(uint64_t cycle) {
  // Both, always, where some peer is reached by messages: PollWake also completes our own wake
  // sends. Where none is, nothing is sent or received, and an MPI_Test (which runs MPICH's
  // progress engine) per look would be wasted.
  const bool by_message = bell_.HasMpiPeers() && PollWake(cycle);
  return bell_.PeerStarted(cycle) || by_message;
}

void Wakeups::SendWake(uint64_t cycle) {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    if (bell_.RingsPeer(peer)) {
      bell_.RingPeer(peer, cycle);
      continue;
    }
    wake_messages_.Send(peer, cycle);
  }
}

}  // namespace collectives
