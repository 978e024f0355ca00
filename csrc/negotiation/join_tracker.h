// Rank 0's record of join() (coordinator.h): which ranks have joined since the last completed
// join, the last one (join() returns it), and the warning that joined ranks wait for the others.
// A name is ready once every member that has not joined submitted it. Engine thread.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "operation/message.h"

namespace collectives {

class JoinTracker {
 public:
  explicit JoinTracker(int size) : joined_(static_cast<size_t>(size), false) {}

  // A rank's JOIN request; a second one from the same rank counts once.
  void Add(const Request& q, Clock::time_point now);
  bool joined(int rank) const { return joined_[static_cast<size_t>(rank)]; }
  int count() const { return count_; }
  // Every rank has joined: the JOIN response for every rank, and the record starts over.
  bool TakeCompleted(Response* done);
  // join(): "ranks [..] have joined and are waiting for ranks [..] for N s.", every
  // `stall_check` while some rank has joined (no shutdown: they wait by design).
  bool WarningDue(Clock::time_point now, Clock::duration stall_check) const {
    return count_ > 0 && now - warned_ >= stall_check;
  }
  std::string TakeWarning(Clock::time_point now);

 private:
  std::vector<bool> joined_;
  int count_ = 0;
  int last_ = -1;
  std::string name_;
  Clock::time_point first_;   // the first join since the last completed one
  Clock::time_point warned_;  // the last warning (or the first join)
};

// Rank 0's members of each process set (0: the whole job), kept in step with the engine.
class SetMembers {
 public:
  explicit SetMembers(int size) {
    for (int r = 0; r < size; ++r) all_.push_back(r);
  }
  void Add(int32_t id, const std::vector<int>& ranks) { sets_[id] = ranks; }
  void Remove(int32_t id) { sets_.erase(id); }
  // Global ranks of a process set; nullptr for an unknown set.
  const std::vector<int>* Of(int32_t process_set) const {
    if (process_set == 0) return &all_;
    auto it = sets_.find(process_set);
    return it == sets_.end() ? nullptr : &it->second;
  }
  const std::vector<int>& all() const { return all_; }

 private:
  std::vector<int> all_;
  std::map<int32_t, std::vector<int>> sets_;
};

}  // namespace collectives
