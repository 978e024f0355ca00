#include "core/wake_messages.h"

namespace collectives {

void WakeMessages::Start(MPI_Comm comm) {
  comm_ = comm;
  MPI_Irecv(&received_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kTag, comm_, &receive_);
}

bool WakeMessages::Poll(uint64_t cycle) {
  bool woke = false;
  while (receive_ != MPI_REQUEST_NULL) {
    int flag = 0;
    MPI_Test(&receive_, &flag, MPI_STATUS_IGNORE);
    if (!flag) break;
    if (received_ >= static_cast<int64_t>(cycle)) woke = true;  // an older one is stale
    MPI_Irecv(&received_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kTag, comm_, &receive_);
  }
  while (!sends_.empty()) {
    int flag = 0;
    MPI_Test(&sends_.front().second, &flag, MPI_STATUS_IGNORE);
    if (!flag) break;
    sends_.pop_front();
  }
  return woke;
}

void WakeMessages::Send(int peer, uint64_t cycle) {
  std::unique_ptr<int64_t> value(new int64_t(static_cast<int64_t>(cycle)));
  MPI_Request req;
  MPI_Isend(value.get(), 1, MPI_INT64_T, peer, kTag, comm_, &req);
  sends_.emplace_back(std::move(value), req);
}

void WakeMessages::Drain() {
  if (receive_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&receive_);
    MPI_Wait(&receive_, MPI_STATUS_IGNORE);
  }
  for (int flag = 1; flag && comm_ != MPI_COMM_NULL;) {
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kTag, comm_, &flag, &status);
    if (flag) {
      int64_t sink;
      MPI_Recv(&sink, 1, MPI_INT64_T, status.MPI_SOURCE, kTag, comm_, MPI_STATUS_IGNORE);
    }
  }
  for (auto& s : sends_) MPI_Wait(&s.second, MPI_STATUS_IGNORE);
  sends_.clear();
  comm_ = MPI_COMM_NULL;
}

}  // namespace collectives
