#include "negotiation/response_cache.h"

namespace collectives {

ResponseCache::ResponseCache(int capacity) : entries_(static_cast<size_t>(capacity > 0 ? capacity : 0)) {}

int ResponseCache::Lookup(const Request& req, int* stale_bit) const {
  *stale_bit = -1;
  auto it = by_name_.find(req.name);
  if (it == by_name_.end()) return -1;
  if (entries_[static_cast<size_t>(it->second)].request.SameSignature(req)) return it->second;
  *stale_bit = it->second;
  return -1;
}

bool ResponseCache::Contains(int bit) const {
  return bit >= 0 && bit < capacity() && entries_[static_cast<size_t>(bit)].used;
}

const std::set<int>* ResponseCache::GroupBits(const std::string& group) const {
  auto it = by_group_.find(group);
  return it == by_group_.end() ? nullptr : &it->second;
}

void ResponseCache::Touch(int bit) {
  if (Contains(bit)) entries_[static_cast<size_t>(bit)].last_use = ++clock_;
}

bool ResponseCache::Put(const Request& req, const Response& resp, std::vector<int>* evicted) {
  if (capacity() == 0 || !resp.error.empty()) return false;
  if (!resp.group.empty() && resp.group_size > capacity()) return false;
  auto existing = by_name_.find(req.name);
  if (existing != by_name_.end()) Erase(existing->second, evicted);

  int free_bit = -1;
  for (int b = 0; b < capacity(); ++b) {
    if (!entries_[static_cast<size_t>(b)].used) {
      free_bit = b;
      break;
    }
  }
  if (free_bit < 0) {
    // Evict the least recently used entry that is not a member of the group being filled.
    int victim = -1;
    for (int b = 0; b < capacity(); ++b) {
      const Entry& e = entries_[static_cast<size_t>(b)];
      if (!resp.group.empty() && e.response.group == resp.group) continue;
      if (victim < 0 || e.last_use < entries_[static_cast<size_t>(victim)].last_use) victim = b;
    }
    if (victim < 0) return false;
    Erase(victim, evicted);
    for (int b = 0; b < capacity(); ++b) {
      if (!entries_[static_cast<size_t>(b)].used) {
        free_bit = b;
        break;
      }
    }
  }
  Entry& e = entries_[static_cast<size_t>(free_bit)];
  e.used = true;
  e.request = req;
  e.response = resp;
  e.last_use = ++clock_;
  by_name_[req.name] = free_bit;
  if (!resp.group.empty()) by_group_[resp.group].insert(free_bit);
  return true;
}

void ResponseCache::EraseOne(int bit, std::vector<int>* evicted) {
  if (!Contains(bit)) return;
  Entry& e = entries_[static_cast<size_t>(bit)];
  by_name_.erase(e.request.name);
  if (!e.response.group.empty()) {
    auto it = by_group_.find(e.response.group);
    if (it != by_group_.end()) {
      it->second.erase(bit);
      if (it->second.empty()) by_group_.erase(it);
    }
  }
  e = Entry();
  evicted->push_back(bit);
}

void ResponseCache::Erase(int bit, std::vector<int>* evicted) {
  if (!Contains(bit)) return;
  const std::string group = entries_[static_cast<size_t>(bit)].response.group;
  EraseOne(bit, evicted);
  if (!group.empty()) {
    auto it = by_group_.find(group);
    if (it != by_group_.end()) {
      std::set<int> siblings = it->second;
      for (int b : siblings) EraseOne(b, evicted);
    }
  }
}

void ResponseCache::MarkForeignReady(const std::map<int32_t, ProcessSet>& sets, uint64_t* ready) const {
  if (sets.size() <= 1) return;
  for (int b = 0; b < capacity(); ++b) {
    if (!Contains(b)) continue;
    auto it = sets.find(Get(b).process_set);
    if (it == sets.end() || !it->second.includes_me()) ready[b / 64] |= 1ull << (b % 64);
  }
}

}  // namespace collectives
