// Process sets: subsets of the job's ranks that run collectives among themselves. Set 0 is
// the whole job. Sets are created and removed by negotiated control operations, so every
// rank assigns the same ids in the same order.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace collectives {

struct ProcessSet {
  int32_t id = 0;
  std::vector<int> ranks;         // global ranks, ascending
  MPI_Comm comm = MPI_COMM_NULL;  // the members' communicator; MPI_COMM_NULL outside the set
  int set_rank = -1;              // this rank's position in `ranks`; -1 outside the set

  int size() const { return static_cast<int>(ranks.size()); }
  bool includes_me() const { return set_rank >= 0; }
  // Position of a global rank in the set, -1 if it is not a member.
  int IndexOf(int global_rank) const {
    auto it = std::lower_bound(ranks.begin(), ranks.end(), global_rank);
    return it != ranks.end() && *it == global_rank ? static_cast<int>(it - ranks.begin()) : -1;
  }
};

}  // namespace collectives
