// Whether every rank of a communicator holds the same values: knobs read from each rank's own
// environment (a variable set on some ranks only) and facts about the layout (ranks per host)
// must agree before every rank may take a path that needs all of them.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace collectives {

// Collective over `comm` (one small allreduce). (*agree)[i]: every rank passed the same values[i];
// every rank receives the same answers. `values` must have the same length on every rank.
Status AgreeAcrossRanks(MPI_Comm comm, const std::vector<int64_t>& values, std::vector<bool>* agree);

// The same, one answer for all the values together.
Status AllRanksAgree(MPI_Comm comm, const std::vector<int64_t>& values, bool* agree);

}  // namespace collectives
