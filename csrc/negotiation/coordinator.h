// Rank 0's view of negotiation: which ranks have submitted which names, validation that
// they agree, the order in which ready tensors are executed, and stall detection. It also
// tracks joined ranks (JoinTracker: a name is ready once every member that has not joined
// submitted it) and the members of each process set (SetMembers), both in join_tracker.h.
#pragma once
#include <chrono>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "negotiation/join_tracker.h"
#include "operation/message.h"

namespace collectives {

class Coordinator {
 public:
  Coordinator(int size, double stall_check_s, double stall_shutdown_s);

  // Membership of process sets other than 0 (the whole job), kept in step with the engine.
  void AddProcessSet(int32_t id, const std::vector<int>& ranks) { members_.Add(id, ranks); }
  void RemoveProcessSet(int32_t id) { members_.Remove(id); }

  // Requests received from the ranks this cycle.
  void Add(std::vector<Request>&& reqs, Clock::time_point now);

  // Responses that became ready (all ranks submitted; whole groups), in execution order.
  std::vector<Response> TakeReady();

  // True when a stall check is due, so the cycle must include the coordinator phase.
  bool StallCheckDue(Clock::time_point now) const;

  // Warnings for names some ranks submitted and others did not for longer than the stall
  // check time. Sets *shutdown (with a reason) past the stall shutdown time.
  void CheckStalls(Clock::time_point now, std::vector<std::string>* warnings, bool* shutdown,
                   std::string* reason);

  size_t pending() const { return table_.size(); }

 private:
  struct Entry {
    int32_t process_set = 0;
    std::vector<Request> by_rank;
    std::vector<bool> have;
    int count = 0;
    std::string group;  // grouped requests: the group's name
    Clock::time_point first_seen;
    Clock::time_point last_warned;
    bool warned = false;
  };
  struct GroupState {
    std::vector<Response> ready;
    std::string first_error;
  };
  // What each rank said about a group in flight: how many members it has, and how many of
  // them arrived. Ranks disagreeing about the size fail the whole group at once (waiting for
  // the larger count would wait forever on the ranks that have fewer).
  struct GroupTrack {
    std::vector<int32_t> declared;  // per rank; 0: nothing seen from that rank yet
    std::vector<int32_t> seen;
    std::string error;              // non-empty once the ranks disagreed
  };

  bool Ready(const Entry& e) const;
  void Complete(const std::string& name);
  Response Validate(const std::string& name, const Entry& e) const;
  void Emit(Response&& r);
  // Records a grouped request; returns the group's error once ranks disagree on its size.
  std::string TrackGroup(const Request& q);
  // Fails every member of `group` held so far (in the table or waiting for the rest of the group).
  void FailGroup(const std::string& group, const std::string& error);
  Response ErrorResponse(const Request& q, const std::string& error) const;

  int size_;
  SetMembers members_;
  JoinTracker joins_;  // ranks that called join() since the last completed join
  Clock::duration stall_check_;
  Clock::duration stall_shutdown_;
  std::unordered_map<std::string, Entry> table_;
  std::unordered_map<std::string, GroupState> groups_;
  std::unordered_map<std::string, GroupTrack> group_tracks_;
  std::vector<Response> ready_;
};

}  // namespace collectives
