// The submissions that no cycle has taken yet, and the names in flight (submitted, not yet
// completed). No lock of its own: the engine's lock guards it, the lock under which an enqueue
// also checks that the engine runs, so that a submission and the engine's stop never cross.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "operation/pending.h"

namespace collectives {

class SubmissionQueue {
 public:
  // A data operation under `name` is in flight: another one under it must wait for its end.
  bool InFlight(const std::string& name) const { return in_flight_.count(name) > 0; }
  // Queues a submission under a new handle, which it returns; its name is in flight from now on.
  int64_t Add(Pending&& p);
  // Queues an error submission (no handle: its caller already has the exception). Its name is
  // not blocked: a new request under it waits in the negotiator (PendingTable::Hold) instead.
  void AddAnnounced(Pending&& p);
  // Queues error submissions of these requests (request.failure set to `reason`), but for names
  // already in flight here (this rank's own earlier request, which goes on) and requests that
  // cannot match anything the other ranks submit. Whether any was queued (then the engine rings).
  bool AnnounceLocked(std::vector<Request>&& requests, const std::string& reason, Clock::time_point now);

  // The last `n` entries are a waiting caller's, which runs the cycle for them itself
  // (engine_inline.cc): the engine thread does not start one for them.
  void Claim(size_t n) { claimed_ += n; }
  // No entry is claimed any more: the caller runs the cycle, cannot, or a cycle took them.
  void Unclaim() { claimed_ = 0; }
  // Some entry waits that no caller runs a cycle for.
  bool HasUnclaimed() const { return queued_.size() > claimed_; }
  // The unclaimed entries, for the GPU hold (engine_wake.cc).
  struct Unclaimed {
    bool all_gpu = true;  // every one is in GPU memory
    Clock::time_point oldest = Clock::time_point::max();  // the earliest enqueue
    int64_t bytes = 0;
  };
  Unclaimed DescribeUnclaimed() const;

  // A cycle takes every entry: `into` (empty) and the queue trade vectors, so neither allocates
  // again (a small allreduce's whole cycle takes microseconds).
  void TakeAll(std::vector<Pending>* into) {
    into->swap(queued_);
    claimed_ = 0;
  }
  // An operation ended: its name may be submitted again (or its error submission is resolved).
  void Release(const Pending& p);
  void ReleaseName(const std::string& name) { in_flight_.erase(name); }
  // The engine fails everything: after TakeAll, no name stays in flight.
  void ForgetNames() {
    in_flight_.clear();
    announced_.clear();
  }

 private:
  std::vector<Pending> queued_;
  // How many of queued_'s last entries a waiting caller will run the cycle for (Claim).
  size_t claimed_ = 0;
  std::unordered_set<std::string> in_flight_;
  // Names of this rank's error submissions not yet resolved (a count: the same bad call may be
  // repeated).
  std::unordered_map<std::string, int> announced_;
  int64_t next_handle_ = 1;
};

}  // namespace collectives
