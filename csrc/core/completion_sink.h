// Where operations end: the engine's side of execution (execution/execution_listener.h) and of
// negotiation (negotiator.h's NegotiationListener). It completes the handles (it owns the handle
// table, which callers poll and wait on), releases the names in flight, closes the timeline's
// phases, records the stage timing, and runs the control operations (join, and process sets
// through the ProcessSetTable).
//
// Locking: the handle table locks itself (handle_table.h). The submission queue is the engine's,
// under the engine's lock, which the sink is given at construction and takes just where the engine
// took it before: around each release of a name. Finish, ExecuteControl and EvictBits run on
// whoever runs the cycle (the engine's cycle_mu_), which owns the negotiator and the process sets;
// FinishDevice also runs on the NCCL completion thread, and touches only the queue (under mu_),
// the timeline and the handles, which lock themselves. FailAll runs at teardown (cycle_mu_ held).
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "backends/mpi/job_layout.h"
#include "core/process_set_table.h"
#include "core/submission_queue.h"
#include "execution/execution_listener.h"
#include "monitor/monitors.h"
#include "negotiation/negotiator.h"
#include "operation/handle_table.h"

namespace collectives {

class Executor;

class CompletionSink final : public ExecutionListener, public NegotiationListener {
 public:
  // All but the handle table are the engine's, and outlive the sink. `queue_mu`: the engine's lock.
  CompletionSink(std::mutex& queue_mu, SubmissionQueue& queue, Monitors& monitors, Negotiator& negotiator,
                 ProcessSetTable& process_sets, Executor& executor, const JobLayout& job)
      : queue_mu_(queue_mu), queue_(queue), monitors_(monitors), negotiator_(negotiator),
        process_sets_(process_sets), executor_(executor), job_(job) {}

  // The handles callers poll, wait on and collect (any thread; the table locks itself).
  HandleTable& handles() { return handles_; }

  void Finish(Pending& p, Result&& result) override;  // both listeners'
  void FinishDevice(int64_t handle, const std::string& name, Result&& result) override;
  Status ExecuteControl(const Response& r, Result* result, std::vector<std::string>* orphans) override;
  // Fails every operation not completed yet (queued, or negotiated and not run) with `status`.
  void FailAll(const Status& status);

 private:
  std::mutex& queue_mu_;
  SubmissionQueue& queue_;  // under queue_mu_
  Monitors& monitors_;
  Negotiator& negotiator_;
  ProcessSetTable& process_sets_;
  Executor& executor_;
  const JobLayout& job_;
  HandleTable handles_;
};

}  // namespace collectives
