#include "operation/handle_table.h"

#include <string>

#include "wait/spin.h"

namespace collectives {

void HandleTable::Add(int64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  states_[handle];
}

bool HandleTable::DoneLocked(int64_t handle) const {
  auto it = states_.find(handle);
  return it == states_.end() || it->second.done;
}

bool HandleTable::Poll(int64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  return DoneLocked(handle);
}

bool HandleTable::Wait(int64_t handle, bool spin, std::chrono::milliseconds timeout) {
  if (spin) {
    // Results of small operations arrive within microseconds: look before sleeping.
    uint64_t seen = completions_.load();
    if (!Poll(handle)) SpinFor([&] {
      const uint64_t now = completions_.load();
      if (now == seen) return false;
      seen = now;
      return Poll(handle);
    });
  }
  std::unique_lock<std::mutex> lock(mu_);
  return done_cv_.wait_for(lock, timeout, [&] { return DoneLocked(handle); });
}

Result HandleTable::Collect(int64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = states_.find(handle);
  Result r;
  if (it == states_.end() || !it->second.done) {
    r.status = Status::Error(StatusCode::INVALID_ARGUMENT,
                             "handle " + std::to_string(handle) +
                                 (it == states_.end() ? " is unknown or was already synchronized" : " is not complete"));
    return r;
  }
  r = std::move(it->second.result);
  states_.erase(it);
  return r;
}

void HandleTable::Complete(int64_t handle, Result&& result) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = states_.find(handle);
    if (it != states_.end()) {
      it->second.done = true;
      it->second.result = std::move(result);
    }
  }
  completions_.fetch_add(1);
  done_cv_.notify_all();
}

void HandleTable::FailUndone(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& kv : states_) {
      if (kv.second.done) continue;
      kv.second.done = true;
      kv.second.result = Result();
      kv.second.result.status = status;
    }
  }
  completions_.fetch_add(1);
  done_cv_.notify_all();
}

}  // namespace collectives
