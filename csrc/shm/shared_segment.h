// Memory shared by the ranks of one communicator on one host: a POSIX shared-memory object that
// rank 0 creates, the others open, and rank 0 unlinks as soon as every rank has mapped it (or given
// up), so nothing is left in /dev/shm whatever happens later. Unmapping is local: no collective
// call that a dead rank could block. Used by the shared-memory allreduce (its slots and barrier
// counters) and by the waiting policy (the count of the host's waiting threads).
#pragma once
#include <mpi.h>

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "common/status.h"

namespace collectives {

// Maps `bytes` (zero-filled) shared by every rank of `comm`, which must all be on this host.
// Collective over `comm`. On success *mapped is the mapping (munmap it with `bytes`); when some
// rank could not map it, *mapped is null on every rank and *why says why (not an error: the
// callers fall back). An error only when MPI itself fails.
Status MapSharedSegment(MPI_Comm comm, size_t bytes, const char* what, void** mapped, std::string* why);

// The segment of a path that serves a job whose ranks all run on this host (the shared-memory
// allreduce, the negotiation's exchange). Collective over `comm`. *mapped stays null, and
// *blocker says why, when the path is not `enabled` (turned off by `knob`), the job has one rank,
// some rank is on another host (`local_size` < the job's size: the same answer on every rank) or
// the mapping failed somewhere. When mapped, *pids holds every rank's process id. An error only
// when MPI fails.
Status MapJobSegment(MPI_Comm comm, int local_size, bool enabled, const char* knob, size_t bytes, const char* what,
                     void** mapped, std::vector<pid_t>* pids, std::string* blocker);

// Whether the process `pid` of this host has exited (gone, or a zombie its launcher has not yet
// reaped): how a rank waiting on a host peer in shared memory tells a dead peer from a slow one.
bool ProcessGone(pid_t pid);

}  // namespace collectives
