// The host algorithms of a job and the order in which the executor tries them (host_algorithm.h
// says what each offers). The lists are made once, at Init, from what the job's layout allows;
// each call then goes to the first algorithm that takes it.
#pragma once
#include <mpi.h>

#include <atomic>
#include <vector>

#include "algorithms/adasum.h"
#include "algorithms/cross_memory_allreduce.h"
#include "algorithms/hierarchical.h"
#include "algorithms/host_algorithm.h"
#include "algorithms/mpi_collectives.h"
#include "algorithms/shm_allreduce.h"
#include "common/status.h"

namespace collectives {

// Which algorithms the job asked for (the engine's configuration); each still needs the layout.
struct HostAlgorithmSettings {
  int local_size = 1;
  bool hierarchical_allreduce = false;
  bool hierarchical_allgather = false;
  bool shm_allreduce = true;
  bool cma_allreduce = true;
};

class HostAlgorithms {
 public:
  // Collective over `comm` (the whole job); `local`, `cross` as Hierarchy::Init takes them.
  // `step`: what setup waits for, for the init timeout's message.
  Status Init(MPI_Comm comm, MPI_Comm local, MPI_Comm cross, const HostAlgorithmSettings& settings,
              std::atomic<const char*>* step);
  void Release();  // frees their resources (no collective)

  // The first algorithm of the list that takes the call (MPI's, last, takes every one).
  HostAllreduceAlgorithm& ForAllreduce(const AllreduceFacts& facts) const;
  HostAllgatherAlgorithm& ForAllgather(int32_t process_set) const;

  // The hierarchical algorithms' knobs and what the layout allows of them (the autotuner's).
  Hierarchy& hierarchy() { return hierarchy_; }
  const Hierarchy& hierarchy() const { return hierarchy_; }

 private:
  Adasum adasum_;
  Hierarchy hierarchy_;
  HierarchicalAllreduce hierarchical_allreduce_{hierarchy_};
  HierarchicalAllgather hierarchical_allgather_{hierarchy_};
  CrossMemoryAllreduce cma_;  // large allreduces on one host
  ShmAllreduce shm_;          // smaller ones on one host
  MpiAllreduce mpi_allreduce_;
  MpiAllgather mpi_allgather_;
  // In order of preference, those available; MPI's, last, takes every call (before Init too).
  std::vector<HostAllreduceAlgorithm*> allreduce_{&mpi_allreduce_};
  std::vector<HostAllgatherAlgorithm*> allgather_{&mpi_allgather_};
};

}  // namespace collectives
