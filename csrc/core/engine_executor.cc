// The engine's side of execution (executor.h): handing each cycle's responses to the executor
// with what it needs of the engine's state, completing the handles of what it ran (and of the
// allreduce the negotiation carried: negotiator.h), the control operations (join, process sets),
// which change the engine's own tables and the negotiator's.
#include "core/engine.h"

namespace collectives {

void Engine::ExecuteAll(const std::vector<Response>& responses, const std::vector<int>& cache_bits) {
  if (responses.empty()) return;
  const ExecutionContext ctx{process_sets_.sets(), negotiator_.pending(), negotiator_.cache(), monitors_.timeline, monitors_.watchdog, *this,
                             negotiator_.joined(), negotiator_.join_mode(), config_.fusion_threshold, gpu_device_};
  executor_.Execute(responses, cache_bits, ctx);
}

void Engine::Finish(Pending& p, Result&& result) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.Release(p);
  }
  if (monitors_.timeline.active()) monitors_.timeline.End(p.request.name);  // closes the <OP> phase
  if (monitors_.stages_on && p.handle != 0) monitors_.stages.RecordExecuted(p.enqueued, p.picked, negotiator_.negotiated_at());
  CompleteHandle(p.handle, std::move(result));
}

void Engine::FinishDevice(int64_t handle, const std::string& name, Result&& result) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.ReleaseName(name);  // only now may the name be submitted again
  }
  if (monitors_.timeline.active()) {
    monitors_.timeline.End(name);  // NCCL_<OP>
    monitors_.timeline.End(name);  // <OP>
  }
  CompleteHandle(handle, std::move(result));
}

Status Engine::ExecuteControl(const Response& r, Result* result, std::vector<std::string>* orphans) {
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

}  // namespace collectives
