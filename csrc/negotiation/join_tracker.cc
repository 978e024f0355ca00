// join()'s record on rank 0 (join_tracker.h).
#include "negotiation/join_tracker.h"

#include <sstream>

#include "common/rank_list.h"

namespace collectives {

void JoinTracker::Add(const Request& q, Clock::time_point now) {
  const size_t r = static_cast<size_t>(q.rank);
  if (r >= joined_.size() || joined_[r]) return;
  if (count_ == 0) {
    first_ = now;
    warned_ = now;
  }
  joined_[r] = true;
  ++count_;
  last_ = q.rank;
  name_ = q.name;
}

bool JoinTracker::TakeCompleted(Response* done) {
  if (count_ != static_cast<int>(joined_.size())) return false;
  done->name = name_;
  done->op = OpType::JOIN;
  done->root = last_;  // join() returns the last rank to join
  joined_.assign(joined_.size(), false);
  count_ = 0;
  last_ = -1;
  return true;
}

std::string JoinTracker::TakeWarning(Clock::time_point now) {
  warned_ = now;
  std::vector<int> in, out;
  for (size_t r = 0; r < joined_.size(); ++r) (joined_[r] ? in : out).push_back(static_cast<int>(r));
  std::ostringstream os;
  os << "join(): ranks " << BracketedRanks(in) << " have joined and are waiting for ranks " << BracketedRanks(out)
     << " for " << static_cast<int64_t>(std::chrono::duration<double>(now - first_).count()) << " s.";
  return os.str();
}

}  // namespace collectives
