// The autotuner's scores (autotune_sampling.h).
#include "monitor/autotune_sampling.h"

#include <algorithm>

#include "common/log.h"

namespace collectives {

void SampleScorer::Start(int steps_per_sample, int warmup_samples, int rank) {
  steps_per_sample_ = steps_per_sample;
  warmup_left_ = warmup_samples;
  rank_ = rank;
}

void SampleScorer::Count(const std::string& name, int64_t bytes) {
  bytes_ += bytes;
  cycle_worked_ = true;
  // Counts since tuning began, as Horovod's: score k ends when some name reaches (k + 1) x steps,
  // so a score that ends after the first tensors of a step does not leave the next one short.
  if (++counts_[name] >= (scores_done_ + 1) * static_cast<int64_t>(steps_per_sample_)) score_complete_ = true;
}

bool SampleScorer::EndCycle(Clock::time_point start, Clock::time_point end) {
  if (!cycle_worked_) return false;  // idle cycles neither start nor end a score
  cycle_worked_ = false;
  if (!score_started_) {
    score_started_ = true;
    score_start_ = start;
  }
  if (!score_complete_) return false;
  const double us = std::chrono::duration<double, std::micro>(end - score_start_).count();
  scores_.push_back(us > 0 ? static_cast<double>(bytes_) / us : 0.0);
  ++scores_done_;
  bytes_ = 0;
  score_started_ = score_complete_ = false;
  if (static_cast<int>(scores_.size()) < kScoresPerSample) return false;
  std::sort(scores_.begin(), scores_.end());
  sample_score_ = scores_[scores_.size() / 2];
  scores_.clear();
  if (warmup_left_ > 0) {  // the same count on every rank: no broadcast
    --warmup_left_;
    if (rank_ == 0) Log(LogLevel::DEBUG, "autotune: warm-up sample discarded (" + std::to_string(warmup_left_) + " left)");
    return false;
  }
  return true;
}

}  // namespace collectives
