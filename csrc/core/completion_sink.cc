// Completing handles, and the control operations (completion_sink.h).
#include "core/completion_sink.h"

namespace collectives {

void CompletionSink::Finish(Pending& p, Result&& result) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    queue_.Release(p);
  }
  if (monitors_.timeline.active()) monitors_.timeline.End(p.request.name);  // closes the <OP> phase
  if (monitors_.stages_on && p.handle != 0) monitors_.stages.RecordExecuted(p.enqueued, p.picked, negotiator_.cycles().negotiated_at);
  handles_.Complete(p.handle, std::move(result));
}

void CompletionSink::FinishDevice(int64_t handle, const std::string& name, Result&& result) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    queue_.ReleaseName(name);  // only now may the name be submitted again
  }
  if (monitors_.timeline.active()) {
    monitors_.timeline.End(name);  // NCCL_<OP>
    monitors_.timeline.End(name);  // <OP>
  }
  handles_.Complete(handle, std::move(result));
}

Status CompletionSink::ExecuteControl(const Response& r, Result* result, std::vector<std::string>* orphans) {
  switch (r.op) {
    case OpType::JOIN:
      negotiator_.EndJoin();
      result->value = r.root;
      return Status::Ok();
    case OpType::PROCESS_SET_ADD: {
      int32_t id = 0;
      const Status st = process_sets_.Add(r, job_, negotiator_, monitors_.watchdog, &id);
      if (st.ok()) result->value = id;
      return st;
    }
    case OpType::PROCESS_SET_REMOVE:
      return process_sets_.Remove(r.root, negotiator_, executor_, monitors_.watchdog, orphans);
    default:
      return Status::Error(StatusCode::INTERNAL, "not a control operation");
  }
}

void CompletionSink::FailAll(const Status& status) {
  std::vector<Pending> waiting;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    queue_.TakeAll(&waiting);
    negotiator_.TakeAll(&waiting);  // the negotiated entries, then those held behind their name
    queue_.ForgetNames();
  }
  for (Pending& p : waiting) {
    Result r;
    r.status = Status::Error(status.code, status.message + " (tensor '" + p.request.name + "' was pending)");
    handles_.Complete(p.handle, std::move(r));
  }
}

}  // namespace collectives
