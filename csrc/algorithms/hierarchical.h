// Hierarchical allreduce and allgather for host memory (Horovod's HOROVOD_HIERARCHICAL_*):
// the ranks of one host combine their data over shared memory, only the host's share crosses
// the network, and the result is spread within the host again. On hosts joined by a slow
// link each host sends what the wire bound requires (allreduce: 2(H-1)/H x the tensor for H
// hosts) and the link does not wait for the work within the host, which is pipelined with it.
//
// Allreduce: each local rank owns one shard of the tensor; a local reduce-scatter gives it
// the host's sum of its shard, the ranks of equal local rank allreduce their shards across
// hosts (all local ranks in parallel, each over its own connection), and a local allgather
// puts the shards back together. Large tensors go in pieces, pipelined so that earlier
// pieces cross the network while the next is reduced within the host.
//
// Allgather: the host's ranks gather their rows on the host's first rank, the first ranks
// exchange the hosts' blocks, and each broadcasts the whole result within its host.
//
// The engine asks Use*() per call; the answers depend only on the job's layout, the call's
// process set and the tensor's size, which every rank has alike, so every rank picks the same
// algorithm. Where the hierarchical algorithm cannot apply (*_blocker() says why for the
// job's layout) the engine runs the flat one.
#pragma once
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/host_algorithm.h"
#include "common/buffer_pool.h"
#include "backends/mpi/mpi_backend.h"
#include "common/status.h"
#include "common/types.h"

namespace collectives {

class Hierarchy {
 public:
  // Collective over `comm` (the whole job): learns which ranks share a host and whether the
  // ranks agree on the knobs. `local`: the ranks of this host; `cross`: the ranks of equal
  // local rank, one per host (both ordered by global rank). A knob set on some ranks only is
  // turned off everywhere (with a warning), since ranks running different algorithms would
  // never meet.
  Status Init(MPI_Comm comm, MPI_Comm local, MPI_Comm cross, bool want_allreduce, bool want_allgather);
  void Release();  // frees the scratch buffers (at the engine's teardown)

  // The knobs as agreed by all ranks. EngineMonitoring::SetHierarchical flips them between calls (the
  // benchmark; later the autotuner), identically on every rank.
  std::atomic<bool> allreduce_enabled{false};
  std::atomic<bool> allgather_enabled{false};

  // Why the job's layout rules the algorithm out ("" when it can run).
  const std::string& allreduce_blocker() const { return allreduce_blocker_; }
  const std::string& allgather_blocker() const { return allgather_blocker_; }

  // Whether this call runs hierarchically: the knob is on, the layout allows it, the call is
  // on the whole job (process set 0), and (allreduce) every local rank gets at least one element.
  bool UseForAllreduce(int32_t process_set, int64_t count) const;
  bool UseForAllgather(int32_t process_set) const;

  // In place when input == output; op as MpiBackend::Allreduce takes it (Average reduces as
  // Sum). `on_shard(shard, n)` runs once on every reduced element, on the rank that owns it,
  // before the local allgather: the caller's post-scaling, done once per element job-wide.
  Status Allreduce(MpiBackend& mpi, const void* input, void* output, int64_t count, DataType dtype, ReduceOp op,
                   const std::function<void(void*, int64_t)>& on_shard);
  // Every rank's bytes (counts[r] for global rank r) concatenated by global rank into recv.
  Status Allgatherv(MpiBackend& mpi, const void* send, void* recv, const std::vector<int64_t>& counts);

 private:
  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Comm cross_ = MPI_COMM_NULL;  // among the hosts' first ranks for the allgather, equal local ranks for the allreduce
  int local_rank_ = 0, local_size_ = 1, num_hosts_ = 1, my_host_ = 0;
  std::vector<std::vector<int>> host_ranks_;  // by host (ordered by their first rank): global ranks ascending
  bool host_major_ = true;  // the hosts' ranks are consecutive in host order: the gathered blocks need no reordering
  std::string allreduce_blocker_, allgather_blocker_;
  // The allreduce's pipeline: a shard buffer for each outstanding allreduce across hosts.
  static constexpr int kInFlight = 3;
  std::unique_ptr<HostBuffer> shards_[kInFlight];
  std::unique_ptr<HostBuffer> staging_;    // the allgather's blocks in host order, when they need reordering
};

// The hierarchical allreduce in the executor's list (host_algorithm.h): present when the job's
// layout allows it, taking calls while its knob is on; scaled once per element, by the rank owning
// its shard. The job asked for it by name, so what it takes stays off the negotiation.
class HierarchicalAllreduce final : public HostAllreduceAlgorithm {
 public:
  explicit HierarchicalAllreduce(Hierarchy& hierarchy) : hierarchy_(hierarchy) {}
  const char* name() const override { return "hierarchical"; }
  bool Available() const override { return hierarchy_.allreduce_blocker().empty(); }
  bool Applies(const AllreduceFacts& f) const override { return hierarchy_.UseForAllreduce(f.process_set, f.count); }
  Status Run(const HostAllreduce& c) override {
    return hierarchy_.Allreduce(c.mpi, c.input, c.output, c.facts.count, c.facts.dtype, c.facts.op, c.scale);
  }
  bool KeepsOffNegotiation() const override { return true; }

 private:
  Hierarchy& hierarchy_;
};

// The hierarchical allgather in the executor's list, ahead of MPI's.
class HierarchicalAllgather final : public HostAllgatherAlgorithm {
 public:
  explicit HierarchicalAllgather(Hierarchy& hierarchy) : hierarchy_(hierarchy) {}
  bool Applies(int32_t process_set) const override { return hierarchy_.UseForAllgather(process_set); }
  Status Run(const HostAllgather& c) override { return hierarchy_.Allgatherv(c.mpi, c.send, c.recv, c.counts); }

 private:
  Hierarchy& hierarchy_;
};

}  // namespace collectives
