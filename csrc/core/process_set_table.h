// The process sets by id (operation/process_set.h): their members and communicators, created and
// removed by the negotiated control operations (PROCESS_SET_ADD, PROCESS_SET_REMOVE), which every
// rank executes at the same point of its cycles, so ids agree everywhere.
//
// Locking: two views of the same sets, because two kinds of threads read them.
// - The sets themselves (communicators included) belong to whoever runs a cycle, under the
//   engine's cycle_mu_: negotiation, execution, the watchdog's start and teardown read them, and
//   only control operations, which execute inside a cycle, add and remove them. No lock of their own.
// - Their members, for the checks at enqueue, are read by submitting threads under the engine's
//   mu_ (MembersLocked). The table holds a reference to that mutex (given at construction, the
//   engine's) and takes it whenever it changes the members, exactly where the engine took it before.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/mpi/job_layout.h"
#include "common/status.h"
#include "operation/message.h"
#include "operation/process_set.h"

namespace collectives {

class Executor;
class Negotiator;
class Watchdog;

class ProcessSetTable {
 public:
  // `members_mu`: the engine's lock, which guards the members' view.
  explicit ProcessSetTable(std::mutex& members_mu) : members_mu_(members_mu) {}

  // Setup: set 0, the whole job on job.comm.
  void AddWholeJob(const JobLayout& job);
  // Under cycle_mu_ (whoever runs a cycle).
  const std::map<int32_t, ProcessSet>& sets() const { return sets_; }
  const ProcessSet& whole_job() const { return sets_.at(0); }
  // Under the engine's lock: a set's members, null when there is no such set.
  const std::vector<int>* MembersLocked(int32_t id) const {
    auto it = members_.find(id);
    return it == members_.end() ? nullptr : &it->second;
  }

  // The control operations, inside a cycle (cycle_mu_), collective over the whole job. Add
  // creates the set `r` names (its ranks in r.split_matrix) and returns its id; the negotiator's
  // coordinator and the watchdog learn its members. Remove fails its waiting requests (`orphans`),
  // releases its NCCL communicator once its GPU work is done, and frees its communicator.
  Status Add(const Response& r, const JobLayout& job, Negotiator& negotiator, Watchdog& watchdog, int32_t* id);
  Status Remove(int32_t id, Negotiator& negotiator, Executor& executor, Watchdog& watchdog,
                std::vector<std::string>* orphans);
  // Teardown: frees every set's communicator but the job's (the job layout owns it), and forgets them.
  void FreeAll();

 private:
  std::mutex& members_mu_;
  std::map<int32_t, ProcessSet> sets_;  // 0: the whole job, on job.comm
  int32_t next_id_ = 1;                 // ids are assigned in execution order, so agree everywhere
  std::unordered_map<int32_t, std::vector<int>> members_;  // under members_mu_
};

}  // namespace collectives
