// This rank's table of negotiated names (negotiator.h): the entries submitted and not yet
// executed, by name; the submissions held behind their own name (a new request under the name
// of this rank's own error submission waits until that has been negotiated: Engine::announced_);
// and the names still to report to the coordinator. The negotiator alone changes it, on the
// thread that runs the cycle (the engine's cycle_mu_).
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "operation/message.h"
#include "operation/pending.h"

namespace collectives {

class PendingTable {
 public:
  using Entries = std::unordered_map<std::string, Pending>;

  // By name: ready bits, stalls, the carried allreduce's candidate, a removed set's orphans.
  Entries& entries() { return pending_; }
  const Entries& entries() const { return pending_; }
  bool Has(const std::string& name) const { return pending_.count(name) != 0; }
  // A new entry; `report`: the coordinator must hear of it (the cache does not cover it).
  void Insert(Pending&& p, bool report);
  void Erase(const std::string& name) { pending_.erase(name); }

  // Held behind an entry of the same name; taken back, earliest first, at the next negotiation.
  void Hold(Pending&& p) { held_.push_back(std::move(p)); }
  std::vector<Pending> TakeHeld();
  bool has_held() const { return !held_.empty(); }
  // Whether this rank has entries not yet executed.
  bool has_work() const { return !pending_.empty() || !held_.empty(); }

  // Entries waiting on these (evicted) cache bits, or (join mode) on any cache bit, go to the
  // coordinator instead.
  void EvictBits(const std::vector<int>& bits);
  void ReportCached();
  bool has_reports() const { return !to_report_.empty(); }
  // The requests to send to the coordinator now, each entry's once, as rank `rank`'s.
  std::vector<Request> TakeReports(int rank, Clock::time_point now);

  // Every entry not yet executed (the table's, then the held ones); the table is empty afterwards.
  void TakeAll(std::vector<Pending>* waiting);
  void Clear() { pending_.clear(); }

 private:
  Entries pending_;
  std::vector<Pending> held_;
  std::vector<std::string> to_report_;  // names to send to the coordinator
};

}  // namespace collectives
