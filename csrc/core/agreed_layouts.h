// Gradient layouts that every rank of a process set was found to share (frontend/layout_check.h),
// kept per engine so that each is checked once: a new engine (init() after shutdown(), on every
// rank) checks again. Any thread.
#pragma once
#include <mutex>
#include <string>
#include <unordered_set>

namespace collectives {

class AgreedLayouts {
 public:
  bool Contains(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    return keys_.count(key) > 0;
  }
  void Add(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    keys_.insert(key);
  }

 private:
  mutable std::mutex mu_;
  std::unordered_set<std::string> keys_;
};

}  // namespace collectives
