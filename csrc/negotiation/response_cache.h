// The response cache: once a named collective has been negotiated and executed, every rank
// stores its response under the same bit (insertions and evictions happen in execution
// order, which is identical on all ranks). Resubmitting the same request later only sets
// that bit, so steady-state negotiation is one bitwise-AND allreduce.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "operation/message.h"
#include "operation/process_set.h"

namespace collectives {

class ResponseCache {
 public:
  explicit ResponseCache(int capacity);

  int capacity() const { return static_cast<int>(entries_.size()); }

  // The bit holding `req` if cached with the same signature, else -1. When the name is
  // cached with a different signature, *stale_bit is set to its bit (else -1).
  int Lookup(const Request& req, int* stale_bit) const;

  const Response& Get(int bit) const { return entries_[static_cast<size_t>(bit)].response; }
  bool Contains(int bit) const;

  // Bits of all cached members of a group.
  const std::set<int>* GroupBits(const std::string& group) const;

  // Record that a cached response was executed (least-recently-used order).
  void Touch(int bit);

  // Cache a freshly negotiated response. Bits evicted to make room (with their whole
  // group) are appended to *evicted. Returns false if the response is not cacheable.
  bool Put(const Request& local_request, const Response& response, std::vector<int>* evicted);

  // Remove a bit and the other members of its group; removed bits go to *evicted.
  void Erase(int bit, std::vector<int>* evicted);

  // A rank outside a process set never submits that set's requests; it marks their bits ready
  // in `ready` so that the negotiation's bitwise AND reflects the members alone.
  void MarkForeignReady(const std::map<int32_t, ProcessSet>& sets, uint64_t* ready) const;

 private:
  struct Entry {
    bool used = false;
    Request request;
    Response response;
    uint64_t last_use = 0;
  };
  void EraseOne(int bit, std::vector<int>* evicted);

  std::vector<Entry> entries_;
  std::unordered_map<std::string, int> by_name_;
  std::unordered_map<std::string, std::set<int>> by_group_;
  uint64_t clock_ = 0;
};

}  // namespace collectives
