// Negotiation: deciding, once per cycle and identically on every rank, which operations run next
// and in which order. The negotiator owns the protocol (negotiator.cc) and what only it uses:
// this rank's table of negotiated names, the requests waiting behind their own name, the names
// still to report to the coordinator, the response cache, the coordinator (rank 0), the
// negotiation message with the small allreduce that rides along (fused_negotiation.h), the join
// state and the cycle counts. It takes everything else it needs from the engine per cycle,
// through a NegotiationContext, and completes the allreduce it carried through a
// NegotiationListener; the responses it returns run on the executor (executor.h).
//
// The process sets stay on the engine's side: control operations create and remove them during
// execution, and the executor, the watchdog and the engine's teardown use them too; the
// negotiator reads them per cycle. So do the timeline, the watchdog and the wake timing (when
// the last cycle started), which are the engine's between cycles.
//
// Files: negotiator.cc (the protocol, and the small allreduce the negotiation carries); the
// engine's side is engine_cycle.cc (one cycle: the queue to the negotiator, its responses to the
// executor) and completion_sink.cc (completing handles, join and process sets).
#pragma once
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "negotiation/coordinator.h"
#include "negotiation/cycle_plan.h"
#include "negotiation/fused_negotiation.h"
#include "operation/handle_table.h"
#include "operation/message.h"
#include "operation/pending.h"
#include "operation/process_set.h"
#include "negotiation/response_cache.h"
#include "common/status.h"
#include "monitor/timeline.h"
#include "monitor/watchdog.h"

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

// What the negotiator keeps from the engine's setup.
struct NegotiatorConfig {
  int rank = 0;
  int size = 1;
  int local_size = 1;
  int cache_capacity = 1024;
  double stall_check_s = 60.0;
  double stall_shutdown_s = 1800.0;
  bool shm_negotiation = true;  // the message through shared memory on one host (shared_exchange.h)
};

// One negotiation's outcome.
struct Negotiation {
  // What every rank executes next, in this order: the cached responses ready everywhere (bit
  // order), then the coordinator's. cache_bits[i]: the cache bit of a cached response, -1 for the
  // coordinator's.
  std::vector<Response> responses;
  std::vector<int> cache_bits;
  // The cache bit of the small allreduce the negotiation carried and completed (-1: none).
  int carried_bit = -1;
  bool active = false;    // some rank has work in flight: the next cycle is due soon
  bool shutdown = false;  // some rank asked to shut down (or exited)
  bool stall_shutdown = false;  // the coordinator stops the job after a stall...
  std::string stall_reason;     // ...for this reason
  bool joined = false;  // some rank has joined: the next cycles negotiate through the coordinator
  bool quiet = false;   // nothing happened anywhere
  // When Negotiate fails: whether it was the first exchange (the negotiation allreduce, which a
  // watchdog's abort ends) rather than the coordinator's.
  bool failed_first = false;
};

class Negotiator {
 public:
  // The response cache, the negotiation message (collective over `comm`, when size > 1) and, on
  // rank 0, the coordinator. `step`: what setup waits for, for the init timeout's message.
  Status Init(MPI_Comm comm, const NegotiatorConfig& config, std::atomic<const char*>* step);
  // The negotiation message's resources (no collective); the table of pending names.
  void Free();

  // One negotiation, the same on every rank: this rank's new submissions (`fresh`, in submission
  // order; their entries are moved from, the vector stays the caller's to reuse) join the table,
  // and every rank learns what runs next. `shutdown_local`: this rank asks
  // to stop. Fails (a Status to log and stop with) when an exchange failed.
  Status Negotiate(std::vector<Pending>&& fresh, bool shutdown_local, Clock::time_point now,
                   const NegotiationContext& ctx, Negotiation* out);
  // This rank's part in running a negotiation's (non-empty) responses, for the executor: its
  // entries, looked up among the members of each response's process set (`sets`, as they are
  // before execution), and the requests the cache will store.
  void Plan(const std::vector<Response>& responses, const std::map<int32_t, ProcessSet>& sets, CyclePlan* plan);
  // After the executor ran the plan: the entries that ran leave the table, those of a removed
  // process set fail (through `listener`), and the cache changes in execution order, identically
  // on every rank (`cache_bits`: the negotiation's).
  void EndExecution(const std::vector<int>& cache_bits, NegotiationListener& listener, CyclePlan* plan);
  // After the negotiated responses ran: the cycle is complete, and its outcome (join mode, quiet
  // cycles) applies from the next one on.
  void EndCycle(const Negotiation& n);

  // Control operations, executed in the same order on every rank: this rank's join completed; a
  // process set was created; one was removed (its cached responses go, its waiting requests are
  // `orphans`, to fail).
  void EndJoin() { joined_ = false; }
  void AddProcessSet(int32_t id, const std::vector<int>& ranks);
  void RemoveProcessSet(int32_t id, std::vector<std::string>* orphans);
  // Every entry not yet executed (the table's, then those held behind their name), to fail at
  // the engine's end; the table is empty afterwards.
  void TakeAll(std::vector<Pending>* waiting);

  // The response cache (the autotuner counts the allreduce the negotiation carried).
  const ResponseCache& cache() const { return *cache_; }
  bool joined() const { return joined_; }        // this rank called join() and it has not completed
  bool join_mode() const { return join_mode_; }  // some rank has joined (the same on every rank)
  // Whether this rank has entries not yet executed.
  bool has_work() const { return !pending_.empty() || !held_.empty(); }
  // Cycles completed; identical on every rank (wake messages name the cycle).
  uint64_t cycle() const { return cycle_; }
  // Cycles in a row in which nothing happened anywhere; the same on every rank.
  int quiet_cycles() const { return quiet_cycles_; }
  // When this cycle's negotiation returned (only with NegotiationContext::stages).
  Clock::time_point negotiated_at() const { return negotiated_at_; }
  // For the stage report (latency_stages.h), at the engine's end.
  struct Report {
    uint64_t fused_done = 0;       // allreduces the negotiation carried and completed
    uint64_t fused_discarded = 0;  // ... carried and dropped
    uint64_t cycles = 0;
    const char* transport = "";    // how the message travels
    uint64_t resizes = 0;          // how often its payload capacity changed
  };
  Report report() const { return {fused_done_, fused_discarded_, cycle_, fused_.transport(), fused_.resizes()}; }

 private:
  // negotiator.cc
  // Pending entries waiting on these (evicted) cache bits go to the coordinator instead.
  void EvictBits(const std::vector<int>& bits);
  void AdmitLocal(Pending&& p, const NegotiationContext& ctx, std::vector<int>* invalid_bits);
  Status ExchangeWithCoordinator(const NegotiationContext& ctx, bool coordinator_due, ResponseList* list);
  void MarkForeignBits(const std::map<int32_t, ProcessSet>& sets, uint64_t* ready) const;

  // The negotiation allreduce, carrying a small cached allreduce when one
  // is ready here (fused_negotiation.h); the entry it carried, and whether every rank agreed on it.
  int NegotiationAllreduce(const NegotiationContext& ctx, std::vector<uint64_t>* v, Pending** carried, bool* agreed);
  Pending* FusedCandidate(const NegotiationContext& ctx);
  void FinishFused(const NegotiationContext& ctx, Pending* p, int bit);

  NegotiatorConfig config_;
  MPI_Comm comm_ = MPI_COMM_NULL;  // the engine's
  bool joined_ = false;     // this rank called join() and it has not completed
  bool join_mode_ = false;  // some rank has joined: negotiate through the coordinator
  std::unordered_map<std::string, Pending> pending_;
  // Submissions whose name is still pending here: a new request under the name of this rank's
  // own error submission waits until that has been negotiated (Engine::announced_).
  std::vector<Pending> held_;
  std::vector<std::string> to_report_;  // names to send to the coordinator
  std::unique_ptr<ResponseCache> cache_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0
  uint64_t cycle_ = 0;
  int quiet_cycles_ = 0;
  Clock::time_point negotiated_at_;
  FusedNegotiation fused_;  // small allreduces carried by the negotiation (whole job, size > 1)
  uint64_t fused_done_ = 0, fused_discarded_ = 0;  // for the stage report
  std::vector<uint64_t> bits_;  // the negotiation's bit vector, reused by every cycle
};

}  // namespace collectives
