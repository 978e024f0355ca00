// Where the time of one small operation goes, for benchmarks (issue 14): on only when
// COLLECTIVES_LATENCY_STAGES=1 is set, so normal runs take no timestamps beyond the ones the
// engine keeps anyway. Stages of each completed operation, in steady-clock time:
//   handoff_in:  Enqueue -> the engine thread takes it from the queue (cycle start)
//   negotiate:   cycle start -> the negotiation allreduce (and coordinator phase) returned
//   execute:     -> the data call returned and the handle was completed
//   handoff_out: completion -> the waiting caller's Wait returned
// The Python work before Enqueue and after Wait is measured by benchmarks/interleaved_bench.py.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace collectives {

class LatencyStages {
 public:
  using Clock = std::chrono::steady_clock;
  static bool Enabled() {
    static const bool on = [] {
      const char* v = std::getenv("COLLECTIVES_LATENCY_STAGES");
      return v != nullptr && std::strcmp(v, "1") == 0;
    }();
    return on;
  }
  // The engine thread, when it completes an operation.
  void RecordExecuted(Clock::time_point enqueued, Clock::time_point picked, Clock::time_point negotiated) {
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    ++count_;
    handoff_in_ += Us(picked - enqueued);
    negotiate_ += Us(negotiated - picked);
    execute_ += Us(now - negotiated);
    last_completed_ = now;
  }
  // The caller, when its Wait returned done.
  void RecordWaitReturned() {
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    if (last_completed_ == Clock::time_point()) return;
    handoff_out_ += Us(now - last_completed_);
    ++waits_;
    last_completed_ = Clock::time_point();
  }
  std::string Summary(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    char buf[320];
    const double n = count_ ? static_cast<double>(count_) : 1.0, w = waits_ ? static_cast<double>(waits_) : 1.0;
    std::snprintf(buf, sizeof(buf),
                  "[collectives latency stages rank %d] ops %llu: handoff_in %.2f us, negotiate %.2f us, "
                  "execute %.2f us, handoff_out %.2f us (means)",
                  rank, static_cast<unsigned long long>(count_), handoff_in_ / n, negotiate_ / n, execute_ / n,
                  handoff_out_ / w);
    return buf;
  }

 private:
  static double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }
  std::mutex mu_;
  uint64_t count_ = 0, waits_ = 0;
  double handoff_in_ = 0, negotiate_ = 0, execute_ = 0, handoff_out_ = 0;
  Clock::time_point last_completed_;
};

}  // namespace collectives
