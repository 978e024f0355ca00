// What the autotuner (autotune.h) tunes and how it is told to.
#pragma once
#include <cstdint>
#include <string>

namespace collectives {

// What the tuner sets; identical on every rank at every cycle.
struct TunedParams {
  int64_t fusion_threshold = 0;
  double cycle_time_ms = 1.0;
  bool hierarchical_allreduce = false;
  bool hierarchical_allgather = false;
};

struct AutotuneSettings {
  bool enabled = false;
  std::string log_path;  // CSV written by rank 0 ("" : none)
  int warmup_samples = 3;
  int steps_per_sample = 10;
  int max_samples = 20;  // scored samples at most (HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES)
  // Set explicitly by the user: kept as configured.
  bool fusion_threshold_fixed = false;
  bool cycle_time_fixed = false;
  bool hierarchical_allreduce_fixed = false;
  bool hierarchical_allgather_fixed = false;
  bool cache_enabled = true;  // only written to the log's cache_enabled column (not tuned)
};

}  // namespace collectives
