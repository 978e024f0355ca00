// What the engine's submitting threads (Python callers, TensorFlow kernels) share with whoever runs
// a cycle, kept as one object: the engine's lock and what it guards (the submissions no cycle has
// taken yet, the engine's life), and this process's GPU, fixed by the first GPU tensor submitted.
#pragma once

#include <atomic>
#include <mutex>

#include "core/engine_lifetime.h"
#include "core/submission_queue.h"

namespace collectives {

struct EngineShared {
  // The engine's lock: guards `queue` and `lifetime` (but for the lifetime's atomics), and the
  // process sets' members that enqueue checks (process_set_table.h).
  std::mutex mu;
  SubmissionQueue queue;     // submissions no cycle has taken yet, names in flight (submission_queue.h)
  EngineLifetime lifetime;   // started, running, asked to stop, stopped and why, abandoned (engine_lifetime.h)
  // One GPU per process, fixed by the first GPU tensor (-1 until then). Atomic, no lock: set on the
  // submitting thread (device_submission.h), read by the cycle driver and runner.
  std::atomic<int> gpu_device{-1};
};

}  // namespace collectives
