// What watches the engine rather than running it, kept as one object so that the engine hands it
// around whole: the timeline, the watchdog of backend calls, the autotuner, and the per-stage
// timing of operations.
#pragma once
#include <cstdint>

#include "monitor/autotune.h"
#include "monitor/latency_stages.h"
#include "monitor/timeline.h"
#include "monitor/watchdog.h"

namespace collectives {

struct Monitors {
  Timeline timeline;   // rank 0's Chrome trace, when started
  Watchdog watchdog;   // times the engine thread's blocking backend calls (negotiator, executor, teardown)
  Autotuner autotune;  // the engine thread's, but for state()
  // Per-stage timing of operations, only under COLLECTIVES_LATENCY_STAGES=1 (latency_stages.h).
  const bool stages_on = LatencyStages::Enabled();
  LatencyStages stages;
  uint64_t inline_cycles = 0;  // cycles run by waiting callers (for the stage report)
};

}  // namespace collectives
