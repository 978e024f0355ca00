// The negotiation's second phase (coordinator_exchange.h).
#include "negotiation/coordinator_exchange.h"

#include <string>

#include "common/log.h"

namespace collectives {

void CoordinatorExchange::Init(MPI_Comm comm, int rank, int size, double stall_check_s, double stall_shutdown_s) {
  comm_ = comm;
  rank_ = rank;
  size_ = size;
  if (rank == 0) coordinator_.reset(new Coordinator(size, stall_check_s, stall_shutdown_s));
}

Status CoordinatorExchange::Run(const NegotiationContext& ctx, PendingTable& table, bool coordinator_due,
                                ResponseList* list) {
  const auto now = Clock::now();
  const std::vector<Request> reqs = table.TakeReports(rank_, now);
  const std::string mine = EncodeRequests(reqs);

  int64_t len = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lens(rank_ == 0 ? static_cast<size_t>(size_) : 0);
  if (ctx.watchdog.Watch(BackendCall::NEGOTIATION_GATHER, 0, [&] {
        return MPI_Gather(&len, 1, MPI_INT64_T, lens.data(), 1, MPI_INT64_T, 0, comm_);
      }) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "negotiation gather failed");
  std::vector<int> counts, displs;
  std::string all;
  if (rank_ == 0) {
    int64_t total = 0;
    for (int64_t l : lens) {
      counts.push_back(static_cast<int>(l));
      displs.push_back(static_cast<int>(total));
      total += l;
    }
    all.resize(static_cast<size_t>(total));
  }
  if (ctx.watchdog.Watch(BackendCall::NEGOTIATION_GATHER, 0, [&] {
        return MPI_Gatherv(mine.data(), static_cast<int>(len), MPI_BYTE, &all[0], counts.data(), displs.data(),
                           MPI_BYTE, 0, comm_);
      }) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "negotiation gatherv failed");

  std::string encoded;
  if (rank_ == 0) {
    for (int r = 0; r < size_; ++r) {
      std::vector<Request> from_rank;
      if (!DecodeRequests(all.data() + displs[static_cast<size_t>(r)], static_cast<size_t>(counts[static_cast<size_t>(r)]),
                          &from_rank))
        return Status::Error(StatusCode::INTERNAL, "corrupt negotiation message from rank " + std::to_string(r));
      coordinator_->Add(std::move(from_rank), now);
    }
    if (coordinator_due || coordinator_->StallCheckDue(now)) {
      std::vector<std::string> warnings;
      coordinator_->CheckStalls(now, &warnings, &list->shutdown, &list->shutdown_reason);
      for (const std::string& w : warnings) Log(LogLevel::WARNING, w);
    }
    list->responses = coordinator_->TakeReady();
    encoded = EncodeResponseList(*list);
  }
  int64_t out_len = static_cast<int64_t>(encoded.size());
  if (ctx.watchdog.Watch(BackendCall::NEGOTIATION_BCAST, 0,
                         [&] { return MPI_Bcast(&out_len, 1, MPI_INT64_T, 0, comm_); }) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "negotiation broadcast failed");
  encoded.resize(static_cast<size_t>(out_len));
  if (out_len > 0 && ctx.watchdog.Watch(BackendCall::NEGOTIATION_BCAST, 0, [&] {
        return MPI_Bcast(&encoded[0], static_cast<int>(out_len), MPI_BYTE, 0, comm_);
      }) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "negotiation broadcast failed");
  if (rank_ != 0 && !DecodeResponseList(encoded.data(), encoded.size(), list))
    return Status::Error(StatusCode::INTERNAL, "corrupt negotiation response from rank 0");
  return Status::Ok();
}

}  // namespace collectives
