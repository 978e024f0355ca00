// What the negotiator (negotiator.h) and its parts take from the engine per cycle: the
// context of one cycle's negotiation, the engine's side of a carried allreduce's completion,
// and the executor's answer on which allreduces stay off the negotiation.
#pragma once
#include <cstdint>
#include <map>

#include "monitor/timeline.h"
#include "monitor/watchdog.h"
#include "operation/handle_table.h"
#include "operation/message.h"
#include "operation/pending.h"
#include "operation/process_set.h"

namespace collectives {

// The engine's side of negotiation. The engine's CompletionSink implements it (core/completion_sink.h).
class NegotiationListener {
 public:
  // Completes the handle of an allreduce the negotiation carried (`p` is still pending).
  virtual void Finish(Pending& p, Result&& result) = 0;

 protected:
  ~NegotiationListener() = default;
};

// Whether an allreduce of the whole job goes to a host algorithm that the job asked for by name (the
// hierarchical one): such an allreduce does not ride along the negotiation, which would reduce it
// otherwise. The executor answers (executor.h); the answer is the same on every rank.
class AllreduceRouting {
 public:
  virtual bool RunsOwnAlgorithm(DataType dtype, ReduceOp op, int64_t elements) const = 0;

 protected:
  ~AllreduceRouting() = default;
};

// What one cycle's negotiation uses of the engine's state (the engine's cycle_mu_ held).
struct NegotiationContext {
  const std::map<int32_t, ProcessSet>& sets;  // 0: the whole job
  Timeline& timeline;
  Watchdog& watchdog;          // times the blocking backend calls
  const AllreduceRouting& routing;  // an allreduce that runs its own algorithm does not ride along
  NegotiationListener& engine;
  bool stages;  // per-stage timing is on (latency_stages.h): negotiated_at() is kept
};

}  // namespace collectives
