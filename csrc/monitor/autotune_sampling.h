// The autotuner's scores (autotune.h), on every rank alike: the bytes of the data operations
// executed between cycles, a score when some name has run steps_per_sample times more, and a
// sample as the median of kScoresPerSample scores; warm-up samples are discarded. Engine thread.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace collectives {

class SampleScorer {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kScoresPerSample = 5;  // Horovod's SAMPLES: a sample is their median

  void Start(int steps_per_sample, int warmup_samples, int rank);
  // One executed data operation of the current cycle (every rank, the same names in each cycle).
  void Count(const std::string& name, int64_t bytes);
  // The cycle that started at `start` is over. True: a sample is complete (sample_score()), the
  // same cycle on every rank.
  bool EndCycle(Clock::time_point start, Clock::time_point end);
  double sample_score() const { return sample_score_; }  // bytes per microsecond, the median

 private:
  int steps_per_sample_ = 0;
  int rank_ = 0;  // rank 0 logs the warm-up
  std::unordered_map<std::string, int64_t> counts_;  // executions of each name since tuning began
  int64_t scores_done_ = 0;
  int64_t bytes_ = 0;
  bool cycle_worked_ = false;    // Count was called since the last EndCycle
  bool score_complete_ = false;  // some name reached steps_per_sample executions
  bool score_started_ = false;
  Clock::time_point score_start_;
  std::vector<double> scores_;  // of the current sample
  int warmup_left_ = 0;
  double sample_score_ = 0;  // the median, kept for the decision
};

}  // namespace collectives
