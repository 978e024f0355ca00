// The Adasum reduction (Horovod's op=Adasum) for host memory over MPI.
//
// Adasum combines two gradients a and b as
//     a * (1 - a.b / (2 |a|^2)) + b * (1 - a.b / (2 |b|^2))
// (orthogonal vectors add up, parallel ones average), and the ranks' vectors pairwise in a
// binary tree over the ranks: level 1 combines ranks (0,1), (2,3), ...; level 2 combines
// those results pairwise, and so on. As in Horovod's CPU path it runs as recursive vector
// halving with distance doubling: at each level a rank trades half of the slice it holds with
// its partner (rank ^ level) and combines the half it keeps. The dot products and norms are
// those of whole tensors, so each rank's partial sums are added up among the ranks that share
// the vector at that level (the aligned block of 2 * level ranks). A reverse pass of exchanges
// (distance halving) then gives every rank the whole result.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "algorithms/host_algorithm.h"
#include "operation/message.h"
#include "common/status.h"
#include "common/types.h"

namespace collectives {

// The checks Adasum adds at enqueue to those of every allreduce; `set_size` is the number of
// ranks in the request's process set. Horovod's limits: the global process set only, a
// power-of-two number of ranks, float16/float32/float64, host memory.
Status ValidateAdasum(const Request& q, int set_size);

// Reduces `buf` in place over every rank of `comm`, whose size must be a power of two. The
// buffer holds tensors back to back, `segments[i]` elements each (a fused group; one tensor:
// {count}); each tensor is combined with its own dot products and norms. Every rank of `comm`
// must call it with the same segments and dtype.
Status AdasumAllreduce(MPI_Comm comm, void* buf, const std::vector<int64_t>& segments, DataType dtype);

// Adasum in the executor's list (host_algorithm.h): first, taking every allreduce with op=Adasum
// (enqueue checked the rest), in place, each fused tensor on its own; scaled after the call.
class Adasum final : public HostAllreduceAlgorithm {
 public:
  const char* name() const override { return "Adasum"; }
  bool Available() const override { return true; }
  bool Applies(const AllreduceFacts& f) const override { return f.op == ReduceOp::ADASUM; }
  Status Run(const HostAllreduce& call) override;
};

}  // namespace collectives
