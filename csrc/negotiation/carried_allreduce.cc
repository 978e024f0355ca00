// The negotiation's first phase and the small allreduce it carries (carried_allreduce.h).
#include "negotiation/carried_allreduce.h"

#include <string>

#include "backends/mpi/mpi_wait.h"
#include "host_math/buffer_math.h"

namespace collectives {

Status CarriedAllreduce::Init(int words, MPI_Comm comm, int local_size, bool shm) {
  return message_.Init(words, comm, local_size, shm);
}

// The pending entry to carry in this cycle, if any.
Pending* CarriedAllreduce::Candidate(const NegotiationContext& ctx, PendingTable& table, bool may_carry) {
  if (!message_.initialized() || !may_carry || ctx.timeline.active()) return nullptr;
  Pending* best = nullptr;
  for (auto& kv : table.entries()) {
    Pending& p = kv.second;
    const Request& q = p.request;
    if (p.cache_bit < 0 || p.cache_bit >= 0xFFFFE || p.stall_flagged || p.handle == 0 || !q.failure.empty() ||
        q.op != OpType::ALLREDUCE || q.device != -1 || q.process_set != 0 || !q.group.empty() || !p.input ||
        !p.output)
      continue;
    const int64_t n = NumElements(q.shape);
    if (!CarriedPayload::Eligible(q.dtype, q.reduce_op, n) || ctx.routing.RunsOwnAlgorithm(q.dtype, q.reduce_op, n)) continue;
    if (!best || p.cache_bit < best->cache_bit) best = &p;  // the lowest bit: ranks tend to pick alike
  }
  return best;
}

int CarriedAllreduce::Exchange(const NegotiationContext& ctx, MPI_Comm comm, PendingTable& table, bool may_carry,
                               std::vector<uint64_t>* v, Pending** carried, bool* agreed) {
  if (!message_.initialized())
    return AllreduceWaiting(MPI_IN_PLACE, v->data(), static_cast<int>(v->size()), MPI_UINT64_T, MPI_BAND, comm);
  Pending* p = Candidate(ctx, table, may_carry);
  uint64_t descriptor = 0;
  const void* payload = nullptr;
  int64_t bytes = 0;
  uint64_t scaled[CarriedPayload::kMaxBytes / 8];
  if (p) {
    const Request& q = p->request;
    const int64_t n = NumElements(q.shape);
    bytes = n * DataTypeSize(q.dtype);
    message_.Announce(bytes);
    if (message_.Fits(bytes)) {
      descriptor = CarriedPayload::Describe(p->cache_bit, q.dtype, q.reduce_op, n);
      payload = p->input;
      if (q.prescale != 1.0) {  // as Executor::Allreduce scales before reducing
        ScaledCopy(scaled, p->input, n, q.dtype, q.prescale);
        payload = scaled;
      }
    } else {
      p = nullptr;  // this cycle's capacity is smaller: the ordinary path
    }
  }
  uint64_t got = 0;
  const int rc = message_.Run(comm, v->data(), descriptor, payload, bytes, &got);
  if (rc == MPI_SUCCESS && p) {
    *carried = p;
    *agreed = got == descriptor;
  }
  return rc;
}

void CarriedAllreduce::Finish(const NegotiationContext& ctx, PendingTable& table, ResponseCache& cache, Pending* p,
                              int bit) {
  const Response& r = cache.Get(bit);
  message_.ReduceInto(p->output);
  ScaleReduced(p->output, NumElements(r.shape), r.dtype, r.reduce_op, r.postscale, ctx.sets.at(0).size());
  const std::string name = p->request.name;
  ctx.engine.Finish(*p, Result());
  table.Erase(name);
  cache.Touch(bit);  // as execution does for a cached response
  ++done_;
}

}  // namespace collectives
