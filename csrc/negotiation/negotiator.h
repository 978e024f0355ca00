// Negotiation: deciding, once per cycle and identically on every rank, which operations run next
// and in which order. The negotiator owns the protocol (negotiator.cc) and what only it uses,
// each part an object of its own: this rank's table of negotiated names, the requests held
// behind their own name and the names still to report to the coordinator (PendingTable,
// pending_table.h); the response cache (response_cache.h); the first phase, the negotiation
// message with the small allreduce that rides along (CarriedAllreduce, carried_allreduce.h); the
// second phase with rank 0's coordinator (CoordinatorExchange, coordinator_exchange.h); the join
// state and the cycle counts. It takes everything else it needs from the engine per cycle,
// through a NegotiationContext (negotiation_context.h), and completes the allreduce it carried
// through a NegotiationListener; the responses it returns run on the executor (executor.h).
//
// The process sets stay on the engine's side: control operations create and remove them during
// execution, and the executor, the watchdog and the engine's teardown use them too; the
// negotiator reads them per cycle. So do the timeline, the watchdog and the wake timing (when
// the last cycle started), which are the engine's between cycles.
//
// Files: negotiator.cc (the protocol), carried_allreduce.cc, coordinator_exchange.cc,
// pending_table.cc; the engine's side is core/cycle_runner.cc (one cycle: the queue to the
// negotiator, its responses to the executor) and completion_sink.cc (completing handles, join
// and process sets).
#pragma once
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "negotiation/carried_allreduce.h"
#include "negotiation/coordinator_exchange.h"
#include "negotiation/cycle_plan.h"
#include "negotiation/negotiation_context.h"
#include "negotiation/pending_table.h"
#include "negotiation/response_cache.h"
#include "operation/handle_table.h"
#include "operation/message.h"
#include "operation/pending.h"
#include "operation/process_set.h"

namespace collectives {

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

// This rank's part in join(); the same join mode on every rank.
struct JoinState {
  bool joined = false;     // this rank called join() and it has not completed
  bool join_mode = false;  // some rank has joined: negotiate through the coordinator
};

// The cycle counts, identical on every rank.
struct CycleCounts {
  uint64_t completed = 0;  // cycles completed (wake messages name the cycle)
  int quiet = 0;           // cycles in a row in which nothing happened anywhere
  Clock::time_point negotiated_at;  // when this cycle's negotiation returned (only with stages)
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
  void EndJoin() { join_.joined = false; }
  void AddProcessSet(int32_t id, const std::vector<int>& ranks) { exchange_.AddProcessSet(id, ranks); }
  void RemoveProcessSet(int32_t id, std::vector<std::string>* orphans);
  // Every entry not yet executed (the table's, then those held behind their name), to fail at
  // the engine's end; the table is empty afterwards.
  void TakeAll(std::vector<Pending>* waiting) { table_.TakeAll(waiting); }

  // The response cache (the autotuner counts the allreduce the negotiation carried).
  const ResponseCache& cache() const { return *cache_; }
  const JoinState& join() const { return join_; }
  // Whether this rank has entries not yet executed.
  bool has_work() const { return table_.has_work(); }
  const CycleCounts& cycles() const { return cycles_; }
  // For the stage report (latency_stages.h), at the engine's end.
  struct Report {
    uint64_t fused_done = 0;       // allreduces the negotiation carried and completed
    uint64_t fused_discarded = 0;  // ... carried and dropped
    uint64_t cycles = 0;
    const char* transport = "";    // how the message travels
    uint64_t resizes = 0;          // how often its payload capacity changed
  };
  Report report() const {
    return {carried_.done(), carried_.discarded(), cycles_.completed, carried_.message().transport(),
            carried_.message().resizes()};
  }

 private:
  // A new entry of this rank: cached (its bit), or to report to the coordinator.
  void AdmitLocal(Pending&& p, const NegotiationContext& ctx, std::vector<int>* invalid_bits);

  NegotiatorConfig config_;
  MPI_Comm comm_ = MPI_COMM_NULL;  // the engine's
  JoinState join_;
  PendingTable table_;  // this rank's entries, those held behind their name, the names to report
  std::unique_ptr<ResponseCache> cache_;
  CoordinatorExchange exchange_;  // phase 2, with rank 0's coordinator
  CarriedAllreduce carried_;      // phase 1, with the small allreduce it carries (whole job, size > 1)
  CycleCounts cycles_;
  std::vector<uint64_t> bits_;  // the negotiation's bit vector, reused by every cycle
};

}  // namespace collectives
