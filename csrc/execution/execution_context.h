// What one cycle's execution reads and changes of the engine's state (executor.h,
// device_executor.h). All of it belongs to whoever runs the cycle (the engine's cycle_mu_),
// except what the listener locks itself.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>

#include "execution/execution_listener.h"
#include "monitor/timeline.h"
#include "monitor/watchdog.h"
#include "operation/process_set.h"

namespace collectives {

struct ExecutionContext {
  const std::map<int32_t, ProcessSet>& sets;  // 0: the whole job
  Timeline& timeline;
  Watchdog& watchdog;    // times the blocking backend calls
  ExecutionListener& engine;
  bool joined;     // this rank called join(): it contributes zeros to allreduces it did not submit
  bool join_mode;  // some rank has joined (the same on every rank)
  int64_t fusion_threshold;            // as the autotuner leaves it
  const std::atomic<int>& gpu_device;  // this process's GPU (-1 until a GPU tensor is submitted)
};

}  // namespace collectives
