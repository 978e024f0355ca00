// The autotuner's search and its log (autotune_search.h).
#include "monitor/autotune_search.h"

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

}  // namespace

std::string DescribeTunedParams(const TunedParams& p) {
  std::ostringstream s;
  s << "fusion threshold " << p.fusion_threshold / kMiB << " MiB, cycle time " << p.cycle_time_ms
    << " ms, hierarchical allreduce " << (p.hierarchical_allreduce ? "on" : "off") << ", hierarchical allgather "
    << (p.hierarchical_allgather ? "on" : "off");
  return s.str();
}

bool ParameterSearch::Start(const AutotuneSettings& settings, const TunedParams& initial,
                            bool hierarchical_allreduce_possible, bool hierarchical_allgather_possible) {
  max_samples_ = settings.max_samples;
  cache_enabled_ = settings.cache_enabled;
  start_ = current_ = best_ = initial;
  if (!settings.fusion_threshold_fixed) candidates_[FUSION] = kFusionCandidates;
  if (!settings.cycle_time_fixed) candidates_[CYCLE] = kCycleCandidates;
  if (!settings.hierarchical_allreduce_fixed && hierarchical_allreduce_possible) candidates_[HIER_ALLREDUCE] = kOnOff;
  if (!settings.hierarchical_allgather_fixed && hierarchical_allgather_possible) candidates_[HIER_ALLGATHER] = kOnOff;
  bool anything = false;
  for (const auto& c : candidates_) anything = anything || !c.empty();
  return anything;
}

void ParameterSearch::OpenLog(const std::string& path) {
  // An unwritable log is a warning, not an error: failing init() on rank 0 alone would leave the
  // other ranks waiting for it.
  log_.open(path, std::ios::out | std::ios::trunc);
  if (!log_.good()) {
    Log(LogLevel::WARNING, "autotune: cannot write the log '" + path + "'");
    log_.close();
  } else {  // Horovod's columns, so its readers work; torus_allreduce and cache_enabled are not tuned here
    log_ << "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,cycle_time_ms,"
            "tensor_fusion_threshold,score"
         << std::endl;
  }
}

TunedParams ParameterSearch::With(Coordinate c, double value) const {
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

bool ParameterSearch::NextCandidate() {
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

void ParameterSearch::WriteRow(const TunedParams& p, double score) {
  if (!log_.is_open()) return;
  log_ << (p.hierarchical_allreduce ? 1 : 0) << ',' << (p.hierarchical_allgather ? 1 : 0) << ",0,"
       << (cache_enabled_ ? 1 : 0) << ',' << p.cycle_time_ms << ',' << p.fusion_threshold / kMiB << ','
       << score << std::endl;
}

bool ParameterSearch::Decide(double score, TunedParams* next) {
  ++scored_;
  WriteRow(current_, score);
  std::ostringstream line;
  line << "autotune: sample " << scored_ << ": " << DescribeTunedParams(current_) << ": " << score << " bytes/us";
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
      more = scored_ < max_samples_ && NextCandidate();
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
    done << "autotune: done after " << scored_ << " samples; keeping " << DescribeTunedParams(best_) << " (" << best_score_
         << " bytes/us)";
    Log(LogLevel::INFO, done.str());
  }
  *next = current_;
  return more;
}

}  // namespace collectives
