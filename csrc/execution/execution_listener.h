// The engine's side of execution, apart from the executor (executor.h), so that what implements
// it (core/completion_sink.h) needs no backend's header.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "operation/handle_table.h"
#include "operation/message.h"
#include "operation/pending.h"

namespace collectives {

// The engine's side of execution: how an operation's outcome reaches its caller, and what
// changes the engine's own tables. The engine's CompletionSink implements it (core/completion_sink.h).
class ExecutionListener {
 public:
  // Completes a host operation's handle (or an error submission); `p` is still pending.
  virtual void Finish(Pending& p, Result&& result) = 0;
  // Completes a GPU operation's handle (from the completion thread, or at once on failure).
  virtual void FinishDevice(int64_t handle, const std::string& name, Result&& result) = 0;
  // A control operation (join, process set creation and removal): these change the engine's
  // tables. `orphans`: waiting requests of a removed process set.
  virtual Status ExecuteControl(const Response& r, Result* result, std::vector<std::string>* orphans) = 0;

 protected:
  ~ExecutionListener() = default;
};

}  // namespace collectives
