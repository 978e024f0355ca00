// Where this process sits in the job: a duplicate of the communicator given to init(), the ranks
// of its host (local), one rank per host at its local index (cross), and its places in them.
// Learned once, collectively, when the engine starts; every query afterwards is local.
#pragma once
#include <mpi.h>

#include <atomic>

#include "common/status.h"

namespace collectives {

struct JobLayout {
  MPI_Comm comm = MPI_COMM_NULL;        // the job, errors returned rather than fatal
  MPI_Comm local_comm = MPI_COMM_NULL;  // this host's ranks
  MPI_Comm cross_comm = MPI_COMM_NULL;  // the ranks with this one's local rank, one per host
  int rank = 0, size = 1, local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
  bool homogeneous = true;  // every host runs as many ranks as every other (Horovod's is_homogeneous)
  int thread_level = 0;     // MPI's thread support (MPI_Query_thread), set by the engine's setup

  // Collective over `world`. `step` names the call being waited for, for the init timeout's
  // message. On failure the communicators made so far stay set, for Free.
  Status Init(MPI_Comm world, std::atomic<const char*>* step);
  // Local: frees the communicators (after the last call on them).
  void Free();
};

}  // namespace collectives
