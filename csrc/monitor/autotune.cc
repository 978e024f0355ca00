// The autotuner's counting, search and log (autotune.h).
#include "monitor/autotune.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/log.h"

namespace collectives {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Fusion thresholds tried (bytes). Horovod searches 0-64 MB; on host memory only tensors up to
// 64 KiB are fused (executor.cc), so the few values that change how many share a buffer suffice.
const std::vector<double> kFusionCandidates = {0, 1 * kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB};
// Cycle times tried (ms). Horovod searches 1-100 ms; here a cycle starts at once on new work or
// a peer's wake, so the cycle time only paces the polling while a rank waits: short values matter.
const std::vector<double> kCycleCandidates = {0.5, 1, 2.5, 5, 10};
const std::vector<double> kOnOff = {0, 1};

bool Differ(const TunedParams& a, const TunedParams& b) {
  return a.fusion_threshold != b.fusion_threshold || std::fabs(a.cycle_time_ms - b.cycle_time_ms) > 1e-9 ||
         a.hierarchical_allreduce != b.hierarchical_allreduce || a.hierarchical_allgather != b.hierarchical_allgather;
}

std::string Describe(const TunedParams& p) {
  std::ostringstream s;
  s << "fusion threshold " << p.fusion_threshold / kMiB << " MiB, cycle time " << p.cycle_time_ms
    << " ms, hierarchical allreduce " << (p.hierarchical_allreduce ? "on" : "off") << ", hierarchical allgather "
    << (p.hierarchical_allgather ? "on" : "off");
  return s.str();
}

}  // namespace

Status Autotuner::Start(const AutotuneSettings& settings, const TunedParams& initial, int rank,
                        bool hierarchical_allreduce_possible, bool hierarchical_allgather_possible) {
  settings_ = settings;
  rank_ = rank;
  start_ = current_ = best_ = initial;
  warmup_left_ = settings.warmup_samples;
  if (settings.enabled) {
    if (!settings.fusion_threshold_fixed) candidates_[FUSION] = kFusionCandidates;
    if (!settings.cycle_time_fixed) candidates_[CYCLE] = kCycleCandidates;
    if (!settings.hierarchical_allreduce_fixed && hierarchical_allreduce_possible) candidates_[HIER_ALLREDUCE] = kOnOff;
    if (!settings.hierarchical_allgather_fixed && hierarchical_allgather_possible) candidates_[HIER_ALLGATHER] = kOnOff;
    bool anything = false;
    for (const auto& c : candidates_) anything = anything || !c.empty();
    tuning_ = anything && settings.steps_per_sample > 0 && settings.max_samples > 0;
    if (rank_ == 0) {
      if (!settings.log_path.empty()) {
        // An unwritable log is a warning, not an error: failing init() on rank 0 alone would
        // leave the other ranks waiting for it.
        log_.open(settings.log_path, std::ios::out | std::ios::trunc);
        if (!log_.good()) {
          Log(LogLevel::WARNING, "autotune: cannot write the log '" + settings.log_path + "'");
          log_.close();
        } else {  // Horovod's columns, so its readers work; torus_allreduce and cache_enabled are not tuned here
          log_ << "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,cycle_time_ms,"
                  "tensor_fusion_threshold,score"
               << std::endl;
        }
      }
      Log(LogLevel::INFO, std::string("autotune: ") + (tuning_ ? "tuning from " : "nothing to tune; keeping ") +
                              Describe(initial));
    }
  }
  std::lock_guard<std::mutex> lock(state_mu_);
  state_.enabled = settings.enabled;
  state_.tuning = tuning_;
  state_.params = initial;
  return Status::Ok();
}

void Autotuner::Cancel() {
  tuning_ = false;
  log_.close();
  std::lock_guard<std::mutex> lock(state_mu_);
  state_.tuning = false;
}

void Autotuner::Count(const std::string& name, int64_t bytes) {
  bytes_ += bytes;
  cycle_worked_ = true;
  // Counts since tuning began, as Horovod's: score k ends when some name reaches (k + 1) x steps,
  // so a score that ends after the first tensors of a step does not leave the next one short.
  if (++counts_[name] >= (scores_done_ + 1) * static_cast<int64_t>(settings_.steps_per_sample)) score_complete_ = true;
}

bool Autotuner::EndCycle(Clock::time_point start, Clock::time_point end) {
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

TunedParams Autotuner::With(Coordinate c, double value) const {
  TunedParams p = best_;
  switch (c) {
    case FUSION: p.fusion_threshold = static_cast<int64_t>(value); break;
    case CYCLE: p.cycle_time_ms = value; break;
    case HIER_ALLREDUCE: p.hierarchical_allreduce = value != 0; break;
    case HIER_ALLGATHER: p.hierarchical_allgather = value != 0; break;
    default: break;
  }
  return p;
}

bool Autotuner::NextCandidate() {
  while (coordinate_ < NUM_COORDINATES) {
    if (coordinate_ >= 0) {
      const std::vector<double>& values = candidates_[coordinate_];
      while (next_index_ < static_cast<int>(values.size())) {
        const TunedParams p = With(static_cast<Coordinate>(coordinate_), values[static_cast<size_t>(next_index_++)]);
        if (Differ(p, best_)) {
          current_ = p;
          return true;
        }
      }
    }
    ++coordinate_;
    next_index_ = 0;
  }
  return false;
}

void Autotuner::WriteRow(const TunedParams& p, double score) {
  if (!log_.is_open()) return;
  log_ << (p.hierarchical_allreduce ? 1 : 0) << ',' << (p.hierarchical_allgather ? 1 : 0) << ",0,"
       << (settings_.cache_enabled ? 1 : 0) << ',' << p.cycle_time_ms << ',' << p.fusion_threshold / kMiB << ','
       << score << std::endl;
}

void Autotuner::Decide(double packed[kPackedSize]) {
  const double score = sample_score_;
  ++scored_;
  WriteRow(current_, score);
  std::ostringstream line;
  line << "autotune: sample " << scored_ << ": " << Describe(current_) << ": " << score << " bytes/us";
  Log(LogLevel::INFO, line.str());
  bool more = true;
  switch (phase_) {
    case SEARCH:
      if (best_score_ < 0) {
        best_score_ = score;  // the starting point, scored first (current_ == best_ == start_)
      } else if (score > best_score_ * (1 + kMinGain)) {
        best_ = current_;
        best_score_ = score;
      }
      more = scored_ < settings_.max_samples && NextCandidate();
      if (!more && Differ(best_, start_)) {  // the rematch: the starting point first, then the winner
        phase_ = REMATCH_START;
        current_ = start_;
        more = true;
      }
      break;
    case REMATCH_START:
      start_rematch_ = score;
      phase_ = REMATCH_BEST;
      current_ = best_;
      break;
    case REMATCH_BEST:
      // The winner of the search stays only when it wins again by the margin; else the configured
      // settings stay.
      if (score > start_rematch_ * (1 + kMinGain)) {
        best_score_ = score;
      } else {
        best_ = start_;
        best_score_ = start_rematch_;
      }
      more = false;
      break;
  }
  if (!more) {
    current_ = best_;
    WriteRow(best_, best_score_);  // Horovod's last row: the best parameters and their score
    std::ostringstream done;
    done << "autotune: done after " << scored_ << " samples; keeping " << Describe(best_) << " (" << best_score_
         << " bytes/us)";
    Log(LogLevel::INFO, done.str());
  }
  packed[0] = static_cast<double>(current_.fusion_threshold);
  packed[1] = current_.cycle_time_ms;
  packed[2] = current_.hierarchical_allreduce ? 1 : 0;
  packed[3] = current_.hierarchical_allgather ? 1 : 0;
  packed[4] = more ? 1 : 0;
  packed[5] = scored_;
  packed[6] = best_score_;
}

TunedParams Autotuner::Apply(const double packed[kPackedSize]) {
  TunedParams p;
  p.fusion_threshold = static_cast<int64_t>(std::llround(packed[0]));
  p.cycle_time_ms = packed[1];
  p.hierarchical_allreduce = packed[2] != 0;
  p.hierarchical_allgather = packed[3] != 0;
  tuning_ = packed[4] != 0;
  if (!tuning_) log_.close();
  std::lock_guard<std::mutex> lock(state_mu_);
  state_.tuning = tuning_;
  state_.params = p;
  state_.samples = static_cast<int>(packed[5]);
  state_.best_score = packed[6];
  return p;
}

AutotuneState Autotuner::state() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return state_;
}

}  // namespace collectives
