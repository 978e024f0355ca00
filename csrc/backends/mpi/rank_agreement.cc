#include "backends/mpi/rank_agreement.h"

#include <string>

namespace collectives {

Status AgreeAcrossRanks(MPI_Comm comm, const std::vector<int64_t>& values, std::vector<bool>* agree) {
  // One MAX over {v, -v}: the largest value and minus the smallest, so v agrees everywhere
  // exactly when max(v) == min(v).
  const size_t n = values.size();
  std::vector<int64_t> both(2 * n), extremes(2 * n, 0);
  for (size_t i = 0; i < n; ++i) {
    both[i] = values[i];
    both[n + i] = -values[i];
  }
  const int rc = MPI_Allreduce(both.data(), extremes.data(), static_cast<int>(2 * n), MPI_INT64_T, MPI_MAX, comm);
  if (rc != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL,
                         "MPI_Allreduce checking that the ranks agree on " + std::to_string(n) + " values failed");
  agree->assign(n, false);
  for (size_t i = 0; i < n; ++i) (*agree)[i] = extremes[i] == -extremes[n + i];
  return Status::Ok();
}

Status AllRanksAgree(MPI_Comm comm, const std::vector<int64_t>& values, bool* agree) {
  std::vector<bool> each;
  Status st = AgreeAcrossRanks(comm, values, &each);
  if (!st.ok()) return st;
  *agree = true;
  for (bool a : each) *agree = *agree && a;
  return Status::Ok();
}

}  // namespace collectives
