// The negotiation protocol (negotiator.h). Every rank runs the same cycles in the same order:
//  1. an allreduce(BAND) of a small bit vector: engine-wide flags (inverted, so AND acts
//     as OR), one bit per response-cache entry this rank is ready to run, and inverted
//     "invalidate" bits for cache entries whose signature changed or that stalled;
//  2. only when some rank has requests the cache does not know: a gather of those requests
//     to rank 0, which validates and orders them, and a broadcast of its responses;
//  3. execution of cached-ready responses (bit order) then rank 0's responses (by the engine's
//     executor, after Negotiate returns them; EndCycle then closes the cycle).
#include "negotiation/negotiator.h"

#include <unordered_set>

namespace collectives {
namespace {

// What a rank that never submitted a cached response stores for it (a joined rank, or one
// outside the process set): enough for the cache to stay identical on every rank.
Request RequestFromResponse(const Response& r) {
  Request q;
  q.name = r.name;
  q.op = r.op;
  q.dtype = r.dtype;
  q.reduce_op = r.reduce_op;
  q.root = r.root;
  q.prescale = r.prescale;
  q.postscale = r.postscale;
  q.shape = r.shape;
  q.device = r.device;
  q.group = r.group;
  q.group_size = r.group_size;
  q.process_set = r.process_set;
  return q;
}

constexpr uint64_t kFlagShutdown = 1;  // some rank asked to shut down
constexpr uint64_t kFlagUncached = 2;  // some rank (or the coordinator) needs phase 2
constexpr uint64_t kFlagPending = 4;   // some rank has requests in flight
constexpr uint64_t kFlagJoined = 8;    // some rank has called join() (which has not completed)
constexpr uint64_t kFlagNews = 16;     // some rank brings something new (not a quiet cycle)
// (Bits 8 and 9 belong to FusedNegotiation: the payload classes wanted.)

bool TestBit(const uint64_t* words, int bit) { return (words[bit / 64] >> (bit % 64)) & 1u; }

// Calls f(bit) for each bit below `limit` that is set (cleared, if `inverted`), in increasing
// order, skipping empty words: a cycle looks at 1024 cache bits of which few are ever set.
template <typename F>
void ForEachBit(const uint64_t* words, int count, bool inverted, int limit, F&& f) {
  for (int w = 0; w < count; ++w) {
    uint64_t bits = inverted ? ~words[w] : words[w];
    while (bits) {
      const int b = w * 64 + __builtin_ctzll(bits);
      bits &= bits - 1;
      if (b >= limit) return;
      f(b);
    }
  }
}

}  // namespace

Status Negotiator::Init(MPI_Comm comm, const NegotiatorConfig& config, std::atomic<const char*>* step) {
  config_ = config;
  comm_ = comm;
  cache_.reset(new ResponseCache(config_.cache_capacity));
  if (config_.size > 1) {  // the same on every rank: the negotiation message's layout depends on it
    *step = "the negotiation's shared-memory segment (needs every rank)";
    Status st = carried_.Init(1 + 2 * ((cache_->capacity() + 63) / 64), comm_, config_.local_size,
                              config_.shm_negotiation);
    if (!st.ok()) return st;
  }
  exchange_.Init(comm_, config_.rank, config_.size, config_.stall_check_s, config_.stall_shutdown_s);
  return Status::Ok();
}

void Negotiator::Free() {
  carried_.Free();
  table_.Clear();
}

void Negotiator::AdmitLocal(Pending&& p, const NegotiationContext& ctx, std::vector<int>* invalid_bits) {
  if (p.request.op == OpType::JOIN) join_.joined = true;
  int stale = -1;
  int bit = IsDataOp(p.request.op) ? cache_->Lookup(p.request, &stale) : -1;
  if (bit >= 0 && join_.join_mode) {
    // While some rank has joined, requests go to the coordinator, the only one to know which
    // ranks no longer submit. A cached entry is evicted everywhere on the way: a rank that
    // submits the same name after the join ends must not wait for it on the cached path.
    stale = bit;
    bit = -1;
  }
  if (bit >= 0)
    p.cache_bit = bit;
  else if (stale >= 0)
    invalid_bits->push_back(stale);
  if (ctx.timeline.active())
    ctx.timeline.Begin(p.request.name, std::string("NEGOTIATE_") + OpTypeName(p.request.op));
  table_.Insert(std::move(p), /*report=*/bit < 0);
}

void Negotiator::Plan(const std::vector<Response>& responses, const std::map<int32_t, ProcessSet>& sets,
                      CyclePlan* plan) {
  const size_t n = responses.size();
  plan->responses = &responses;
  plan->entries.assign(n, nullptr);
  plan->requests.resize(n);
  plan->ran.assign(n, 0);
  plan->orphans.clear();
  for (size_t i = 0; i < n; ++i) {
    const Response& r = responses[i];
    auto set = sets.find(r.process_set);
    if (set == sets.end() || !set->second.includes_me()) continue;  // another set's collective
    auto it = table_.entries().find(r.name);
    if (it != table_.entries().end()) plan->entries[i] = &it->second;
  }
  for (size_t i = 0; i < n; ++i)
    plan->requests[i] = plan->entries[i] ? plan->entries[i]->request : RequestFromResponse(responses[i]);
}

void Negotiator::EndExecution(const std::vector<int>& cache_bits, NegotiationListener& listener, CyclePlan* plan) {
  const std::vector<Response>& responses = *plan->responses;
  const size_t n = responses.size();
  for (size_t i = 0; i < n; ++i)
    if (plan->ran[i]) table_.Erase(responses[i].name);
  PendingTable::Entries& pending = table_.entries();
  for (const std::string& name : plan->orphans) {
    auto it = pending.find(name);
    if (it == pending.end()) continue;
    Result res;
    res.status = Status::Error(StatusCode::INVALID_ARGUMENT,
                               "process set " + std::to_string(it->second.request.process_set) +
                                   " was removed while tensor '" + name + "' was waiting");
    listener.Finish(it->second, std::move(res));
    pending.erase(it);
  }
  // The cache changes in execution order, identically on every rank (members or not).
  std::vector<int> evicted;
  for (size_t i = 0; i < n; ++i) {
    if (!IsDataOp(responses[i].op)) continue;
    if (cache_bits[i] >= 0)
      cache_->Touch(cache_bits[i]);
    else
      cache_->Put(plan->requests[i], responses[i], &evicted);
  }
  table_.EvictBits(evicted);
}

void Negotiator::RemoveProcessSet(int32_t id, std::vector<std::string>* orphans) {
  // Its cached responses go on every rank alike; its waiting requests fail.
  std::vector<int> evicted;
  for (int b = 0; b < cache_->capacity(); ++b)
    if (cache_->Contains(b) && cache_->Get(b).process_set == id) cache_->Erase(b, &evicted);
  for (auto& kv : table_.entries())
    if (kv.second.request.process_set == id) orphans->push_back(kv.first);
  table_.EvictBits(evicted);
  exchange_.RemoveProcessSet(id);
}

Status Negotiator::Negotiate(std::vector<Pending>&& fresh, bool shutdown_local, Clock::time_point now,
                             const NegotiationContext& ctx, Negotiation* out) {
  std::vector<int> invalid;
  // A request whose name is still pending here (behind this rank's own error submission of
  // that name) waits for it to resolve; earlier held ones go first, keeping submission order.
  std::vector<Pending> earlier = table_.TakeHeld();
  const auto admit = [&](Pending& p) {
    if (table_.Has(p.request.name))
      table_.Hold(std::move(p));
    else
      AdmitLocal(std::move(p), ctx, &invalid);
  };
  for (Pending& p : earlier) admit(p);
  for (Pending& p : fresh) admit(p);
  // A cached request waiting past the stall-check (or stall-shutdown) time is sent to the
  // coordinator, which knows every rank's submissions: it names the missing ranks, and
  // decides the shutdown.
  double stall_s = config_.stall_check_s;
  if (config_.stall_shutdown_s > 0 && (stall_s <= 0 || config_.stall_shutdown_s < stall_s))
    stall_s = config_.stall_shutdown_s;
  if (stall_s > 0) {
    const auto stall = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(stall_s));
    for (auto& kv : table_.entries()) {
      Pending& p = kv.second;
      if (p.cache_bit >= 0 && !p.stall_flagged && now - p.enqueued > stall) {
        p.stall_flagged = true;
        invalid.push_back(p.cache_bit);
      }
    }
  }

  // Phase 1: flags, ready bits and invalidations in one allreduce.
  const int words = (cache_->capacity() + 63) / 64;
  std::vector<uint64_t>& v = bits_;  // kept: its capacity serves every cycle
  v.assign(static_cast<size_t>(1 + 2 * words), 0);
  const bool coordinator_due = exchange_.StallCheckDue(now);
  uint64_t flags = 0;
  if (shutdown_local) flags |= kFlagShutdown;
  if (table_.has_reports() || coordinator_due) flags |= kFlagUncached;
  if (table_.has_work()) flags |= kFlagPending;
  if (join_.joined) flags |= kFlagJoined;
  // (What phase 2 carries, the reports and the coordinator's check, is news too: kFlagUncached.)
  if (!fresh.empty() || table_.has_held() || !invalid.empty()) flags |= kFlagNews;
  v[0] = ~flags;
  uint64_t* ready = v.data() + 1;
  uint64_t* valid = v.data() + 1 + words;
  for (const auto& kv : table_.entries()) {
    const int b = kv.second.cache_bit;
    if (b >= 0) ready[b / 64] |= 1ull << (b % 64);
  }
  cache_->MarkForeignReady(ctx.sets, ready);
  for (int w = 0; w < words; ++w) valid[w] = ~0ull;
  for (int b : invalid) valid[b / 64] &= ~(1ull << (b % 64));
  Pending* carried = nullptr;  // a small allreduce riding along (fused_negotiation.h)
  bool agreed = false;
  const FusedNegotiation& message = carried_.message();
  const BackendCall phase1 = message.shared() ? BackendCall::NEGOTIATION_SHARED : BackendCall::NEGOTIATION_ALLREDUCE;
  const bool may_carry = !join_.joined && !join_.join_mode;
  if (ctx.watchdog.Watch(phase1, 0, [&] {
        return carried_.Exchange(ctx, comm_, table_, may_carry, &v, &carried, &agreed);
      }) != MPI_SUCCESS) {
    out->failed_first = true;
    return Status::Error(StatusCode::INTERNAL,
                         message.failure().empty() ? "MPI failure during negotiation" : message.failure());
  }
  const uint64_t global_flags = ~v[0];
  const int carried_bit = carried ? carried->cache_bit : -1;  // before evictions can reset it
  if (ctx.stages) cycles_.negotiated_at = Clock::now();

  // Invalidated entries (and their groups) leave the cache on every rank; requests waiting
  // on them go to the coordinator instead.
  std::vector<int> evicted;
  ForEachBit(valid, words, /*inverted=*/true, cache_->capacity(), [&](int b) { cache_->Erase(b, &evicted); });
  const std::unordered_set<int> evicted_set(evicted.begin(), evicted.end());
  table_.EvictBits(evicted);

  // The carried allreduce is complete when every rank carried it and it is still cached and
  // ready everywhere (the same facts on every rank, so every rank decides alike); otherwise its
  // result is dropped and it runs below, or in a later cycle, like any other.
  int fused_bit = -1;
  if (carried) {
    const int b = carried_bit;
    if (agreed && TestBit(ready, b) && !evicted_set.count(b) && cache_->Contains(b) &&
        !(global_flags & kFlagJoined)) {
      fused_bit = b;
      carried_.Finish(ctx, table_, *cache_, carried, b);
    } else {
      carried_.Discard();
    }
  }
  out->carried_bit = fused_bit;  // the engine's autotuner counts it

  std::vector<Response>& responses = out->responses;
  std::vector<int>& cache_bits = out->cache_bits;  // bit for cached responses, -1 for the coordinator's
  ForEachBit(ready, words, /*inverted=*/false, cache_->capacity(), [&](int b) {
    if (evicted_set.count(b) || !cache_->Contains(b) || b == fused_bit) return;
    const Response& r = cache_->Get(b);
    if (!r.group.empty()) {
      // A group runs only when every member is ready everywhere.
      const std::set<int>* members = cache_->GroupBits(r.group);
      if (!members || static_cast<int>(members->size()) != r.group_size) return;
      bool all = true;
      for (int m : *members) all = all && TestBit(ready, m);
      if (!all) return;
    }
    responses.push_back(r);
    cache_bits.push_back(b);
  });

  // Phase 2: the coordinator, only when someone has something the cache does not cover.
  ResponseList list;
  if (global_flags & kFlagUncached) {
    Status st = exchange_.Run(ctx, table_, coordinator_due, &list);
    if (!st.ok()) return st;
  }
  if (ctx.stages) cycles_.negotiated_at = Clock::now();
  for (Response& r : list.responses) {
    responses.push_back(std::move(r));
    cache_bits.push_back(-1);
  }

  out->active = (global_flags & kFlagPending) != 0;
  out->shutdown = (global_flags & kFlagShutdown) != 0;
  out->stall_shutdown = list.shutdown;
  out->stall_reason = list.shutdown_reason;
  out->joined = (global_flags & kFlagJoined) != 0;
  out->quiet = !(global_flags & (kFlagNews | kFlagUncached | kFlagJoined)) && responses.empty() && fused_bit < 0;
  return Status::Ok();
}

void Negotiator::EndCycle(const Negotiation& n) {
  ++cycles_.completed;
  // While some rank has joined, requests waiting on the cache go to the coordinator instead
  // (from the next cycle on, the same decision on every rank).
  join_.join_mode = n.joined;
  if (join_.join_mode) table_.ReportCached();
  cycles_.quiet = n.quiet ? cycles_.quiet + 1 : 0;
}

}  // namespace collectives
