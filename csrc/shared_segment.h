// Memory shared by the ranks of one communicator on one host: a POSIX shared-memory object that
// rank 0 creates, the others open, and rank 0 unlinks as soon as every rank has mapped it (or given
// up), so nothing is left in /dev/shm whatever happens later. Unmapping is local: no collective
// call that a dead rank could block. Used by the shared-memory allreduce (its slots and barrier
// counters) and by the waiting policy (the count of the host's waiting threads).
#pragma once
#include <mpi.h>

#include <cstddef>
#include <string>

#include "status.h"

namespace collectives {

// Maps `bytes` (zero-filled) shared by every rank of `comm`, which must all be on this host.
// Collective over `comm`. On success *mapped is the mapping (munmap it with `bytes`); when some
// rank could not map it, *mapped is null on every rank and *why says why (not an error: the
// callers fall back). An error only when MPI itself fails.
Status MapSharedSegment(MPI_Comm comm, size_t bytes, const char* what, void** mapped, std::string* why);

}  // namespace collectives
