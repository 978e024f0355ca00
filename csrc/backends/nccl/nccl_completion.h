// The NCCL backend's completion thread (nccl_backend.h): it waits on the host for the event
// recorded after each group of GPU work, checks the set's communicator for asynchronous errors
// meanwhile, gives up after the stall shutdown time, completes the handles, and destroys the
// communicators of removed process sets once their work is done.
//
// Locking: mu_ guards the queue and the stop; the communicators lock their own table
// (nccl_communicators.h) and are never called under mu_.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backends/nccl/device_stream.h"
#include "backends/nccl/nccl_communicators.h"
#include "common/status.h"

namespace collectives {

// How long the completion thread waits for GPU work: spinning first (every rank has a core),
// a warning after `warn_s`, the communicator aborted after `timeout_s` (0: never).
struct GpuWaitLimits {
  bool spin = false;
  double warn_s = 60.0;
  double timeout_s = 1800.0;
};

class NcclCompletion {
 public:
  using Done = std::function<void(const Status&)>;

  NcclCompletion(const DeviceStream& stream, NcclCommunicators& comms) : stream_(stream), comms_(comms) {}

  // Starts the thread, in the stream's context (after DeviceStream::Start).
  void Start(const GpuWaitLimits& limits);
  bool started() const { return thread_.joinable(); }

  // `done` runs on the completion thread once everything enqueued so far on the stream has
  // finished (OK), or with the error that stopped it. `keep` is released after it ran.
  void Complete(int32_t set_id, Done done, std::vector<std::shared_ptr<void>> keep);
  // Whether GPU work handed to Complete() has not finished yet (any thread). `idle` runs on
  // the completion thread each time the last of it finishes (set before the first Complete).
  bool Busy() const { return unfinished_.load(std::memory_order_acquire) > 0; }
  void OnIdle(std::function<void()> idle) { on_idle_ = std::move(idle); }
  // The set's communicator is destroyed after the work queued on it so far (nothing once stopped).
  void QueueRelease(int32_t set_id);

  // Waits (at most `grace_s`) for queued work, then fails what is left with `why`, aborting
  // the communicators that are stuck; joins the thread. False when already stopped.
  bool Stop(const Status& why, double grace_s);

 private:
  struct Pending {
    int32_t set_id;
    gpu::EventPtr event;  // null: recording failed, `status` says why
    Status status;
    Done done;
    std::vector<std::shared_ptr<void>> keep;
    bool release = false;  // not an operation: destroy the set's communicator (QueueRelease)
  };

  void Loop();
  Status WaitForEvent(const Pending& p);

  const DeviceStream& stream_;
  NcclCommunicators& comms_;
  GpuWaitLimits limits_;

  std::mutex mu_;  // queue_, stopped_, deadline_, why_
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  bool stopped_ = false;  // shutting down: no new releases, and stuck work is aborted after deadline_
  std::chrono::steady_clock::time_point deadline_;
  Status why_;
  std::thread thread_;
  std::atomic<int> unfinished_{0};  // Complete() calls whose GPU work has not finished (or failed) yet
  std::function<void()> on_idle_;
};

}  // namespace collectives
