// The negotiation's second phase (negotiator.cc says when it runs): every rank sends rank 0 the
// requests the response cache does not cover (from its PendingTable), rank 0's Coordinator
// (coordinator.h) validates and orders them, checks for stalls, and broadcasts its responses.
// Engine thread (the engine's cycle_mu_).
#pragma once
#include <mpi.h>

#include <memory>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "negotiation/coordinator.h"
#include "negotiation/negotiation_context.h"
#include "negotiation/pending_table.h"
#include "operation/message.h"

namespace collectives {

class CoordinatorExchange {
 public:
  // Over the engine's `comm`; rank 0 makes the coordinator.
  void Init(MPI_Comm comm, int rank, int size, double stall_check_s, double stall_shutdown_s);
  // Rank 0: a stall check is due, so this cycle must include the exchange.
  bool StallCheckDue(Clock::time_point now) const { return coordinator_ && coordinator_->StallCheckDue(now); }
  // One exchange, the same on every rank: this rank's reports out of `table`, the responses
  // (and a stall shutdown) in *list.
  Status Run(const NegotiationContext& ctx, PendingTable& table, bool stall_check_due, ResponseList* list);
  // Rank 0's coordinator learns a process set's members, or forgets them.
  void AddProcessSet(int32_t id, const std::vector<int>& ranks) {
    if (coordinator_) coordinator_->AddProcessSet(id, ranks);
  }
  void RemoveProcessSet(int32_t id) {
    if (coordinator_) coordinator_->RemoveProcessSet(id);
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;  // the engine's
  int rank_ = 0, size_ = 1;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0
};

}  // namespace collectives
