// The autotuner (autotune.h): its scores (autotune_sampling.cc) and its search
// (autotune_search.cc), and what it tells the ranks and Python.
#include "monitor/autotune.h"

#include <cmath>

#include "common/log.h"

namespace collectives {

Status Autotuner::Start(const AutotuneSettings& settings, const TunedParams& initial, int rank,
                        bool hierarchical_allreduce_possible, bool hierarchical_allgather_possible) {
  scorer_.Start(settings.steps_per_sample, settings.warmup_samples, rank);
  if (settings.enabled) {
    const bool anything =
        search_.Start(settings, initial, hierarchical_allreduce_possible, hierarchical_allgather_possible);
    tuning_ = anything && settings.steps_per_sample > 0 && settings.max_samples > 0;
    if (rank == 0) {
      if (!settings.log_path.empty()) search_.OpenLog(settings.log_path);
      Log(LogLevel::INFO, std::string("autotune: ") + (tuning_ ? "tuning from " : "nothing to tune; keeping ") +
                              DescribeTunedParams(initial));
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
  search_.CloseLog();
  std::lock_guard<std::mutex> lock(state_mu_);
  state_.tuning = false;
}

void Autotuner::Decide(double packed[kPackedSize]) {
  TunedParams next;
  const bool more = search_.Decide(scorer_.sample_score(), &next);
  packed[0] = static_cast<double>(next.fusion_threshold);
  packed[1] = next.cycle_time_ms;
  packed[2] = next.hierarchical_allreduce ? 1 : 0;
  packed[3] = next.hierarchical_allgather ? 1 : 0;
  packed[4] = more ? 1 : 0;
  packed[5] = search_.scored();
  packed[6] = search_.best_score();
}

TunedParams Autotuner::Apply(const double packed[kPackedSize]) {
  TunedParams p;
  p.fusion_threshold = static_cast<int64_t>(std::llround(packed[0]));
  p.cycle_time_ms = packed[1];
  p.hierarchical_allreduce = packed[2] != 0;
  p.hierarchical_allgather = packed[3] != 0;
  tuning_ = packed[4] != 0;
  if (!tuning_) search_.CloseLog();
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
