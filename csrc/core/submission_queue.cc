#include "core/submission_queue.h"

#include <algorithm>
#include <utility>

namespace collectives {

int64_t SubmissionQueue::Add(Pending&& p) {
  p.handle = next_handle_++;
  in_flight_.insert(p.request.name);
  queued_.push_back(std::move(p));
  return queued_.back().handle;
}

void SubmissionQueue::AddAnnounced(Pending&& p) {
  p.handle = 0;
  ++announced_[p.request.name];
  queued_.push_back(std::move(p));
}

SubmissionQueue::Unclaimed SubmissionQueue::DescribeUnclaimed() const {
  Unclaimed u;
  for (size_t i = claimed_; i < queued_.size(); ++i) {
    const Pending& p = queued_[i];
    if (p.gpu_device < 0) {
      u.all_gpu = false;
      break;
    }
    u.oldest = std::min(u.oldest, p.enqueued);
    u.bytes += NumElements(p.request.shape) * DataTypeSize(p.request.dtype);
  }
  return u;
}

void SubmissionQueue::Release(const Pending& p) {
  if (p.handle != 0) {
    in_flight_.erase(p.request.name);
    return;
  }
  auto it = announced_.find(p.request.name);  // an error submission (AddAnnounced)
  if (it != announced_.end() && --it->second <= 0) announced_.erase(it);
}

bool SubmissionQueue::AnnounceLocked(std::vector<Request>&& reqs, const std::string& reason, Clock::time_point now) {
  bool any = false;
  for (Request& q : reqs) {
    // A name already in flight here is this rank's own earlier request, which goes on; an
    // unknown operation cannot match anything the other ranks submit.
    if (q.name.empty() || !IsValidOpType(static_cast<int32_t>(q.op)) || q.op == OpType::JOIN || InFlight(q.name))
      continue;
    if (!IsValidDataType(static_cast<int32_t>(q.dtype))) q.dtype = DataType::UINT8;
    if (!IsValidReduceOp(static_cast<int32_t>(q.reduce_op))) q.reduce_op = ReduceOp::SUM;
    Pending p;
    p.request = std::move(q);
    p.request.failure = reason.empty() ? "invalid input" : reason;
    p.enqueued = now;
    AddAnnounced(std::move(p));  // no handle: the caller already has its exception
    any = true;
  }
  return any;
}

}  // namespace collectives
