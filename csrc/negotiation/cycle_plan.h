// One cycle's plan: what the negotiator (negotiator.h) hands the executor (execution/executor.h)
// instead of its own tables, and what execution reports back, so that only the negotiator changes
// its table of pending entries and its response cache.
#pragma once
#include <string>
#include <vector>

#include "operation/message.h"
#include "operation/pending.h"

namespace collectives {

struct CyclePlan {
  // Made by Negotiator::Plan.
  const std::vector<Response>* responses = nullptr;  // the negotiation's, in execution order
  // This rank's entry for each response (null: none here, or not a member of its process set).
  // They point into the negotiator's table, which stays as it is until EndExecution (a process
  // set's removal during execution only reads it), and are completed through the listener.
  std::vector<Pending*> entries;
  // Each response's request (this rank's, or one made from the response) for the response cache,
  // taken before execution.
  std::vector<Request> requests;

  // Filled by Executor::Execute, read by Negotiator::EndExecution.
  std::vector<char> ran;  // the entry was executed (or failed) here: it leaves the table
  std::vector<std::string> orphans;  // waiting requests of a process set removed in this cycle
};

}  // namespace collectives
