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

}  // namespace collectives
