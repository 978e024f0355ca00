// Rank 0's view of negotiation: which ranks have submitted which names, validation that
// they agree, the order in which ready tensors are executed, and stall detection.
#pragma once
#include <chrono>
#include <string>
#include <unordered_map>
#include <vector>

#include "message.h"

namespace collectives {

using Clock = std::chrono::steady_clock;

class Coordinator {
 public:
  Coordinator(int size, double stall_check_s, double stall_shutdown_s);

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
    std::vector<Request> by_rank;
    std::vector<bool> have;
    int count = 0;
    Clock::time_point first_seen;
    Clock::time_point last_warned;
    bool warned = false;
  };
  struct GroupState {
    std::vector<Response> ready;
    std::string first_error;
  };

  Response Validate(const std::string& name, const Entry& e) const;
  void Emit(Response&& r);

  int size_;
  Clock::duration stall_check_;
  Clock::duration stall_shutdown_;
  std::unordered_map<std::string, Entry> table_;
  std::unordered_map<std::string, GroupState> groups_;
  std::vector<Response> ready_;
};

}  // namespace collectives
