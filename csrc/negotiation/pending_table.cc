// This rank's table of negotiated names (pending_table.h).
#include "negotiation/pending_table.h"

#include <chrono>
#include <unordered_set>

namespace collectives {

void PendingTable::Insert(Pending&& p, bool report) {
  if (report) to_report_.push_back(p.request.name);
  std::string name = p.request.name;
  pending_.emplace(std::move(name), std::move(p));
}

std::vector<Pending> PendingTable::TakeHeld() {
  std::vector<Pending> held;
  held.swap(held_);
  return held;
}

void PendingTable::EvictBits(const std::vector<int>& bits) {
  if (bits.empty()) return;
  std::unordered_set<int> set(bits.begin(), bits.end());
  for (auto& kv : pending_) {
    if (kv.second.cache_bit >= 0 && set.count(kv.second.cache_bit)) {
      kv.second.cache_bit = -1;
      to_report_.push_back(kv.first);
    }
  }
}

void PendingTable::ReportCached() {
  for (auto& kv : pending_) {
    if (kv.second.cache_bit < 0) continue;
    kv.second.cache_bit = -1;
    to_report_.push_back(kv.first);
  }
}

std::vector<Request> PendingTable::TakeReports(int rank, Clock::time_point now) {
  std::vector<Request> reqs;
  for (const std::string& name : to_report_) {
    auto it = pending_.find(name);
    if (it == pending_.end() || it->second.reported || it->second.cache_bit >= 0) continue;
    Request q = it->second.request;
    q.rank = rank;
    q.age_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second.enqueued).count();
    reqs.push_back(std::move(q));
    it->second.reported = true;
  }
  to_report_.clear();
  return reqs;
}

void PendingTable::TakeAll(std::vector<Pending>* waiting) {
  for (auto& kv : pending_) waiting->push_back(std::move(kv.second));
  pending_.clear();
  for (Pending& p : held_) waiting->push_back(std::move(p));
  held_.clear();
}

}  // namespace collectives
