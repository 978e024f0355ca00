// MPI's own allreduce and allgather on the process set's communicator: the last entries of the
// executor's lists (host_algorithm.h), which take every call the others leave.
#pragma once
#include "algorithms/host_algorithm.h"

namespace collectives {

class MpiAllreduce final : public HostAllreduceAlgorithm {
 public:
  const char* name() const override { return "MPI"; }
  bool Available() const override { return true; }
  bool Applies(const AllreduceFacts&) const override { return true; }
  Status Run(const HostAllreduce& c) override {  // scaled after the call
    Status st = c.mpi.Allreduce(c.comm, c.input, c.output, c.facts.count, c.facts.dtype, c.facts.op);
    if (st.ok()) c.scale(c.output, c.facts.count);
    return st;
  }
};

class MpiAllgather final : public HostAllgatherAlgorithm {
 public:
  bool Applies(int32_t) const override { return true; }
  Status Run(const HostAllgather& c) override {
    std::vector<int64_t> displs(c.counts.size(), 0);
    for (size_t i = 1; i < c.counts.size(); ++i) displs[i] = displs[i - 1] + c.counts[i - 1];
    return c.mpi.Allgatherv(c.comm, c.send, c.send_bytes, c.recv, c.counts, displs);
  }
};

}  // namespace collectives
