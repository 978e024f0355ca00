// The messages that start a cycle on idle peers on other hosts (peers on this host are rung
// through shared memory instead, doorbell.h): each names the cycle its sender is entering, so
// that a late one for a cycle already past is told apart and ignored.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <utility>

namespace collectives {

class WakeMessages {
 public:
  // The MPI tag of the wake messages, on the engine's own communicator.
  static constexpr int kTag = 7477;

  // Posts the receive for the first message.
  void Start(MPI_Comm comm);
  // Non-blocking: true when a message for `cycle` or later arrived since the last look (the
  // look consumes it). Also completes the sends that are done.
  bool Poll(uint64_t cycle);
  void Send(int peer, uint64_t cycle);
  // Once no message can be in flight any more (after a collective that every rank enters after
  // its last send): receives what arrived and completes every send, so that the communicator
  // may be freed.
  void Drain();

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int64_t received_ = 0;
  MPI_Request receive_ = MPI_REQUEST_NULL;
  std::deque<std::pair<std::unique_ptr<int64_t>, MPI_Request>> sends_;  // each with its value
};

}  // namespace collectives
