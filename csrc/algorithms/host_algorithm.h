// What every host collective algorithm offers the executor: whether it takes a call, and running
// it. The executor keeps the allreduce algorithms that the job's layout allows in one ordered list
// (executor.cc, Executor::Init) and runs each allreduce on the first that takes it; a new
// algorithm is a class implementing HostAllreduceAlgorithm and one line in that list. Allgather
// has its own, shorter list (the hierarchical one, then MPI's).
//
// Applies() reads only what every rank knows alike of a call (the job's layout, the process set,
// the reduction, the size), so every rank picks the same algorithm and the ranks meet.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "backends/mpi/mpi_backend.h"
#include "common/status.h"
#include "common/types.h"

namespace collectives {

// What every rank knows alike of one allreduce: the algorithm is chosen from this alone.
struct AllreduceFacts {
  int32_t process_set = 0;  // 0: the whole job
  int64_t count = 0;        // elements
  DataType dtype = DataType::FLOAT32;
  ReduceOp op = ReduceOp::SUM;
  int64_t bytes() const { return count * DataTypeSize(dtype); }
};

// Scales `count` reduced elements at `data` (Average's division, the postscale): every algorithm
// runs it once on every element of the result, where that suits it (after the call, per shard,
// per chunk).
using ScaleReducedFn = std::function<void(void* data, int64_t count)>;

// One allreduce of host memory, prescaled already; input == output for in place.
struct HostAllreduce {
  AllreduceFacts facts;
  MpiBackend& mpi;
  MPI_Comm comm;  // the process set's
  const void* input;
  void* output;
  const std::vector<int64_t>* segments;  // a fused buffer's tensors (element counts); null: one tensor
  const ScaleReducedFn& scale;
};

class HostAllreduceAlgorithm {
 public:
  virtual ~HostAllreduceAlgorithm() = default;
  // For the log line that lists a job's algorithms.
  virtual const char* name() const = 0;
  // Whether the job's layout and settings, as learned at Init, let it take any call at all. An
  // algorithm that cannot is left out of the list once (its Init logs why at --log-level info).
  virtual bool Available() const = 0;
  // Whether it takes this call: the same answer on every rank.
  virtual bool Applies(const AllreduceFacts& facts) const = 0;
  virtual Status Run(const HostAllreduce& call) = 0;
  // An allreduce it takes never rides along the negotiation (fused_negotiation.h), which would
  // reduce it otherwise: the job asked for this algorithm by name.
  virtual bool KeepsOffNegotiation() const { return false; }
};

// One allgather of host memory: every rank's bytes (counts[r] for rank r of the set), concatenated
// in rank order into recv.
struct HostAllgather {
  int32_t process_set;
  MpiBackend& mpi;
  MPI_Comm comm;  // the process set's
  const void* send;
  int64_t send_bytes;
  void* recv;
  const std::vector<int64_t>& counts;
};

class HostAllgatherAlgorithm {
 public:
  virtual ~HostAllgatherAlgorithm() = default;
  virtual bool Applies(int32_t process_set) const = 0;
  virtual Status Run(const HostAllgather& call) = 0;
};

}  // namespace collectives
