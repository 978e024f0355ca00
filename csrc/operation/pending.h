// One operation this rank submitted, from the engine's queue to its completion: the queue
// (engine.cc), the negotiation's table of pending names (negotiator.h) and execution
// (executor.h) all hold it.
#pragma once
#include <cstdint>
#include <memory>

#include "common/clock.h"
#include "operation/message.h"

namespace collectives {
namespace gpu {
class Event;  // gpu/gpu_runtime.h: the engine's core holds GPU state only by pointer
}  // namespace gpu

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
  std::shared_ptr<gpu::Event> ready;  // recorded on the producer's stream at enqueue
};

}  // namespace collectives
