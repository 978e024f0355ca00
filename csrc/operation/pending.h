// One operation this rank submitted, from the engine's queue to its completion: the queue
// (engine.cc), the negotiation's table of pending names (negotiator.h) and execution
// (executor.h) all hold it.
#pragma once
#include <cstdint>

#include "negotiation/coordinator.h"
#include "gpu/gpu_runtime.h"
#include "operation/message.h"

namespace collectives {

struct Pending {
  Request request;
  const void* input = nullptr;
  void* output = nullptr;
  int64_t handle = 0;
  Clock::time_point enqueued;
  Clock::time_point picked;  // taken from the queue by the engine thread (latency_stages.h)
  int cache_bit = -1;       // >= 0 while waiting on the cached path
  bool reported = false;    // sent to the coordinator
  bool stall_flagged = false;
  int32_t gpu_device = -1;  // the local GPU (request.device only says "GPU": ranks use different ones)
  gpu::EventPtr ready;      // recorded on the producer's stream at enqueue
};

}  // namespace collectives
