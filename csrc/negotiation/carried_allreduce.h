// The negotiation's first phase (negotiator.cc says what it carries): the allreduce(BAND) of
// the bit vector, through the negotiation message (fused_negotiation.h) which also carries a
// small cached allreduce of the whole job when one is ready here, and that allreduce's
// completion when every rank carried it. Engine thread (the engine's cycle_mu_).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "negotiation/fused_negotiation.h"
#include "negotiation/negotiation_context.h"
#include "negotiation/pending_table.h"
#include "negotiation/response_cache.h"

namespace collectives {

class CarriedAllreduce {
 public:
  // The message for a vector of `words` (collective over `comm`; shared memory when `shm` and
  // every rank is on this host). Without Init, Exchange is a plain MPI allreduce.
  Status Init(int words, MPI_Comm comm, int local_size, bool shm);
  void Free() { message_.Free(); }

  // Allreduces `v` over `comm`, carrying an entry of `table` when `may_carry` (this rank has not
  // joined, nor has any other); *carried: the entry it carried, *agreed: whether every rank
  // carried the same. An MPI error code.
  int Exchange(const NegotiationContext& ctx, MPI_Comm comm, PendingTable& table, bool may_carry,
               std::vector<uint64_t>* v, Pending** carried, bool* agreed);
  // The carried entry `p`, cached at `bit`, is complete everywhere: its result into its output,
  // its handle completed, and it leaves the table.
  void Finish(const NegotiationContext& ctx, PendingTable& table, ResponseCache& cache, Pending* p, int bit);
  // It was carried but not complete everywhere: it runs like any other.
  void Discard() { ++discarded_; }

  const FusedNegotiation& message() const { return message_; }
  uint64_t done() const { return done_; }  // for the stage report
  uint64_t discarded() const { return discarded_; }

 private:
  Pending* Candidate(const NegotiationContext& ctx, PendingTable& table, bool may_carry);

  FusedNegotiation message_;  // whole job, size > 1
  uint64_t done_ = 0, discarded_ = 0;
};

}  // namespace collectives
