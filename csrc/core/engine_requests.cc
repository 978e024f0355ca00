// The engine's request calls that take its lock (engine_requests.h): enqueue and announce a failure.
#include "core/engine_requests.h"

#include <algorithm>
#include <sstream>
#include <unordered_set>

#include "core/validation.h"
#include "execution/device_submission.h"

namespace collectives {
namespace {

// Names are per process set: the same name may be in flight in two sets at once.
void QualifyName(Request* q) {
  if (q->process_set == 0) return;
  const std::string suffix = " [process set " + std::to_string(q->process_set) + "]";
  q->name += suffix;
  if (!q->group.empty()) q->group += suffix;
}

std::string JoinNames(const std::vector<Submission>& subs) {
  std::ostringstream os;
  for (size_t i = 0; i < subs.size() && i < 3; ++i) os << (i ? ", " : "") << "'" << subs[i].request.name << "'";
  if (subs.size() > 3) os << ", ...";
  return os.str();
}

}  // namespace

Status EngineRequests::Enqueue(std::vector<Submission>&& subs, std::vector<int64_t>* handles, bool caller_waits) {
  const auto now = Clock::now();
  // GPU tensors: find their device and record the producer's stream position, on this
  // (the producer's) thread, before the engine can see them.
  std::vector<gpu::EventPtr> ready;  // both sized only when some tensor is on a GPU
  std::vector<int32_t> devices;
  for (size_t k = 0; k < subs.size(); ++k) {
    if (subs[k].request.device == -1) continue;
    if (devices.empty()) {
      ready.resize(subs.size());
      devices.assign(subs.size(), -1);
    }
    Submission& s = subs[k];
    Status st = PrepareDeviceSubmission(s.request, s.input, s.output, s.stream, shared_.gpu_device, &ready[k], &devices[k]);
    if (!st.ok()) {
      std::vector<Request> reqs;
      for (const Submission& sub : subs) reqs.push_back(sub.request);
      AnnounceFailure(std::move(reqs), st.message);
      return st;
    }
  }
  std::lock_guard<std::mutex> lock(shared_.mu);
  if (!shared_.lifetime.accepting_locked()) return shared_.lifetime.stopped_status();
  Status failure;
  for (Submission& s : subs) {
    Request& q = s.request;
    const std::vector<int>* members = sets_.MembersLocked(q.process_set);
    if (members == nullptr)
      return Status::Error(StatusCode::INVALID_ARGUMENT, "process set " + std::to_string(q.process_set) +
                                                             " does not exist (tensor '" + q.name + "')");
    if (std::find(members->begin(), members->end(), job_.rank) == members->end())
      return Status::Error(StatusCode::INVALID_ARGUMENT, "rank " + std::to_string(job_.rank) +
                                                             " is not a member of process set " +
                                                             std::to_string(q.process_set) + " (tensor '" + q.name + "')");
    Status st = ValidateSubmission(&s.request, s.input != nullptr && s.output != nullptr, *members, job_.size);
    if (!st.ok() && failure.ok()) failure = st;
    QualifyName(&q);
  }
  if (!failure.ok()) {
    // Bad input here must not leave the other ranks waiting for these names.
    std::vector<Request> reqs;
    for (const Submission& sub : subs) reqs.push_back(sub.request);
    if (shared_.queue.AnnounceLocked(std::move(reqs), failure.message, now)) {
      wakeups_.Submitted();
      wakeups_.Ring();
    }
    return failure;
  }
  std::unordered_set<std::string> batch;  // names of this submission (filled only for several)
  for (const Submission& s : subs) {
    const std::string& name = s.request.name;
    if (shared_.queue.InFlight(name) || (subs.size() > 1 && !batch.insert(name).second))
      return Status::Error(StatusCode::DUPLICATE_NAME,
                           "a collective named '" + name + "' is already in flight; names must be unique until the "
                           "operation completes (submitted: " + JoinNames(subs) + ")");
  }
  for (size_t k = 0; k < subs.size(); ++k) {
    Submission& s = subs[k];
    Pending p;
    p.request = std::move(s.request);
    p.input = s.input;
    p.output = s.output;
    if (!devices.empty()) {
      p.gpu_device = devices[k];
      p.ready = std::move(ready[k]);
    }
    p.enqueued = now;
    const int64_t handle = shared_.queue.Add(std::move(p));
    sink_.handles().Add(handle);
    handles->push_back(handle);
  }
  wakeups_.Submitted();
  // A waiting caller may run the cycle itself (engine_inline.cc); if it cannot, it wakes the
  // engine thread then.
  if (caller_waits && driver_.CallerMayRunCycles())
    shared_.queue.Claim(subs.size());
  else
    wakeups_.Ring();
  return Status::Ok();
}

void EngineRequests::AnnounceFailure(std::vector<Request>&& reqs, const std::string& reason) {
  std::lock_guard<std::mutex> lock(shared_.mu);
  if (!shared_.lifetime.accepting_locked()) return;
  std::vector<Request> valid;
  for (Request& q : reqs) {
    const std::vector<int>* members = sets_.MembersLocked(q.process_set);
    if (members == nullptr || std::find(members->begin(), members->end(), job_.rank) == members->end())
      continue;  // no set of ours expects this name
    QualifyName(&q);
    valid.push_back(std::move(q));
  }
  if (!shared_.queue.AnnounceLocked(std::move(valid), reason, Clock::now())) return;
  wakeups_.Submitted();
  wakeups_.Ring();
}

}  // namespace collectives
