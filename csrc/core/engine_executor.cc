// The engine's side of execution (executor.h): handing each cycle's responses to the executor
// with what it needs of the engine's state, completing the handles of what it ran (and of the
// allreduce the negotiation carried: negotiator.h), the control operations (join, process sets),
// which change the engine's own tables and the negotiator's.
#include "core/engine.h"

namespace collectives {

void Engine::ExecuteAll(const std::vector<Response>& responses, const std::vector<int>& cache_bits) {
  if (responses.empty()) return;
  const ExecutionContext ctx{sets_, negotiator_.pending(), negotiator_.cache(), monitors_.timeline, monitors_.watchdog, *this,
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
      std::vector<int> ranks(r.split_matrix.begin(), r.split_matrix.end());
      // Every rank runs the same checks on the same table, so they agree on the outcome.
      for (const auto& kv : sets_)
        if (kv.second.ranks == ranks)
          return Status::Error(StatusCode::INVALID_ARGUMENT, "a process set with ranks " + ShapeString(r.split_matrix) +
                                                                 " already exists (id " + std::to_string(kv.first) + ")");
      ProcessSet ps;
      ps.id = next_set_id_++;
      ps.ranks = ranks;
      ps.set_rank = ps.IndexOf(job_.rank);
      // Collective over the whole job: every rank executes this response at this point.
      if (monitors_.watchdog.Watch(BackendCall::PROCESS_SET_SPLIT, 0, [&] {
            return MPI_Comm_split(job_.comm, ps.includes_me() ? 0 : MPI_UNDEFINED, job_.rank, &ps.comm);
          }) != MPI_SUCCESS)
        return Status::Error(StatusCode::INTERNAL, "MPI_Comm_split for a new process set failed");
      if (ps.comm != MPI_COMM_NULL) MPI_Comm_set_errhandler(ps.comm, MPI_ERRORS_RETURN);
      negotiator_.AddProcessSet(ps.id, ranks);  // rank 0's coordinator learns its members
      monitors_.watchdog.AddSet(ps.id, ranks);
      {
        std::lock_guard<std::mutex> lock(mu_);
        set_ranks_[ps.id] = ranks;
      }
      result->value = ps.id;
      sets_.emplace(ps.id, std::move(ps));
      return Status::Ok();
    }
    case OpType::PROCESS_SET_REMOVE: {
      const int32_t id = r.root;
      auto it = sets_.find(id);
      if (id == 0 || it == sets_.end())
        return Status::Error(StatusCode::INVALID_ARGUMENT,
                             id == 0 ? "the global process set cannot be removed"
                                     : "process set " + std::to_string(id) + " does not exist");
      {
        std::lock_guard<std::mutex> lock(mu_);
        set_ranks_.erase(id);
      }
      // Its cached responses go on every rank alike; its waiting requests fail; the coordinator
      // forgets it.
      negotiator_.RemoveProcessSet(id, orphans);
      executor_.ReleaseSet(id);  // its NCCL communicator goes once its GPU work is done
      if (it->second.comm != MPI_COMM_NULL) MPI_Comm_free(&it->second.comm);
      sets_.erase(it);
      monitors_.watchdog.RemoveSet(id);
      return Status::Ok();
    }
    default:
      return Status::Error(StatusCode::INTERNAL, "not a control operation");
  }
}

}  // namespace collectives
