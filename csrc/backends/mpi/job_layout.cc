#include "backends/mpi/job_layout.h"

#include "backends/mpi/rank_agreement.h"

namespace collectives {

Status JobLayout::Init(MPI_Comm world, std::atomic<const char*>* step) {
  *step = "MPI_Comm_dup of the communicator given to init()";
  if (MPI_Comm_dup(world, &comm) != MPI_SUCCESS) return Status::Error(StatusCode::INTERNAL, "MPI_Comm_dup failed");
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  *step = "MPI_Comm_split_type / MPI_Comm_split (the local and cross communicators)";
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local_comm);
  MPI_Comm_rank(local_comm, &local_rank);
  MPI_Comm_size(local_comm, &local_size);
  MPI_Comm_split(comm, local_rank, rank, &cross_comm);
  MPI_Comm_rank(cross_comm, &cross_rank);
  MPI_Comm_size(cross_comm, &cross_size);
  // Learned here, so that the query is local and the Python layer needs no collective at init.
  return AllRanksAgree(comm, {local_size}, &homogeneous);
}

void JobLayout::Free() {
  for (MPI_Comm* c : {&cross_comm, &local_comm, &comm})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

}  // namespace collectives
