// The process sets' registration, lookup and removal (process_set_table.h).
#include "core/process_set_table.h"

#include "execution/executor.h"
#include "monitor/watchdog.h"
#include "negotiation/negotiator.h"

namespace collectives {

void ProcessSetTable::AddWholeJob(const JobLayout& job) {
  ProcessSet everyone;
  everyone.comm = job.comm;
  everyone.set_rank = job.rank;
  for (int r = 0; r < job.size; ++r) everyone.ranks.push_back(r);
  {
    std::lock_guard<std::mutex> lock(members_mu_);
    members_[0] = everyone.ranks;
  }
  sets_.emplace(0, std::move(everyone));
}

Status ProcessSetTable::Add(const Response& r, const JobLayout& job, Negotiator& negotiator, Watchdog& watchdog,
                            int32_t* id) {
  std::vector<int> ranks(r.split_matrix.begin(), r.split_matrix.end());
  // Every rank runs the same checks on the same table, so they agree on the outcome.
  for (const auto& kv : sets_)
    if (kv.second.ranks == ranks)
      return Status::Error(StatusCode::INVALID_ARGUMENT, "a process set with ranks " + ShapeString(r.split_matrix) +
                                                             " already exists (id " + std::to_string(kv.first) + ")");
  ProcessSet ps;
  ps.id = next_id_++;
  ps.ranks = ranks;
  ps.set_rank = ps.IndexOf(job.rank);
  // Collective over the whole job: every rank executes this response at this point.
  if (watchdog.Watch(BackendCall::PROCESS_SET_SPLIT, 0, [&] {
        return MPI_Comm_split(job.comm, ps.includes_me() ? 0 : MPI_UNDEFINED, job.rank, &ps.comm);
      }) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "MPI_Comm_split for a new process set failed");
  if (ps.comm != MPI_COMM_NULL) MPI_Comm_set_errhandler(ps.comm, MPI_ERRORS_RETURN);
  negotiator.AddProcessSet(ps.id, ranks);  // rank 0's coordinator learns its members
  watchdog.AddSet(ps.id, ranks);
  {
    std::lock_guard<std::mutex> lock(members_mu_);
    members_[ps.id] = ranks;
  }
  *id = ps.id;
  sets_.emplace(ps.id, std::move(ps));
  return Status::Ok();
}

Status ProcessSetTable::Remove(int32_t id, Negotiator& negotiator, Executor& executor, Watchdog& watchdog,
                               std::vector<std::string>* orphans) {
  auto it = sets_.find(id);
  if (id == 0 || it == sets_.end())
    return Status::Error(StatusCode::INVALID_ARGUMENT, id == 0 ? "the global process set cannot be removed"
                                                               : "process set " + std::to_string(id) + " does not exist");
  {
    std::lock_guard<std::mutex> lock(members_mu_);
    members_.erase(id);
  }
  // Its cached responses go on every rank alike; its waiting requests fail; the coordinator
  // forgets it.
  negotiator.RemoveProcessSet(id, orphans);
  executor.ReleaseSet(id);  // its NCCL communicator goes once its GPU work is done
  if (it->second.comm != MPI_COMM_NULL) MPI_Comm_free(&it->second.comm);
  sets_.erase(it);
  watchdog.RemoveSet(id);
  return Status::Ok();
}

void ProcessSetTable::FreeAll() {
  for (auto& kv : sets_)
    if (kv.first != 0 && kv.second.comm != MPI_COMM_NULL) MPI_Comm_free(&kv.second.comm);
  sets_.clear();
}

}  // namespace collectives
