// Outcomes of submitted operations, keyed by handle: the engine thread completes them,
// callers poll, wait and collect them.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/buffer_pool.h"
#include "common/status.h"

namespace collectives {
namespace gpu {
class DeviceBuffer;  // gpu/gpu_runtime.h: the engine's core holds GPU state only by pointer
}  // namespace gpu

// A finished operation as seen from Python.
struct Result {
  Status status;
  std::shared_ptr<HostBuffer> output;  // engine-allocated output, if any
  std::shared_ptr<gpu::DeviceBuffer> device_output;  // the same, in GPU memory
  std::vector<int64_t> output_shape;
  std::vector<int64_t> received_splits;  // alltoall
  int64_t value = 0;  // join: the last rank to join; process-set creation: the new set's id
};

class HandleTable {
 public:
  // Registers a handle that is not yet done.
  void Add(int64_t handle);
  // True when done (or unknown: nothing to wait for).
  bool Poll(int64_t handle);
  // Blocks until the handle completes or `timeout` passes; true when done (or unknown). `spin`:
  // look for a few microseconds before sleeping. Callers loop, doing what cannot wait (Python's
  // signal handlers) between calls; the outcome stays until Collect.
  bool Wait(int64_t handle, bool spin, std::chrono::milliseconds timeout);
  // Removes a completed handle and returns its outcome.
  Result Collect(int64_t handle);
  // Marks a handle done with its outcome and wakes its waiters.
  void Complete(int64_t handle, Result&& result);
  // Completes every handle not yet done with `status` (the watchdog's, when the engine thread
  // is stuck for good) and wakes their waiters.
  void FailUndone(const Status& status);

 private:
  struct State {
    bool done = false;
    Result result;
  };
  bool DoneLocked(int64_t handle) const;

  std::mutex mu_;
  std::condition_variable done_cv_;
  std::unordered_map<int64_t, State> states_;
  std::atomic<uint64_t> completions_{0};
};

}  // namespace collectives
