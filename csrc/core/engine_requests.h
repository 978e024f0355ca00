// The engine's request calls, which the Python boundary, the TensorFlow kernels and the layout check
// reach through Engine::requests(): enqueue submissions, announce a failure found before submitting,
// poll, wait for and collect a handle. Each is a plain call on this object (no virtual call, no
// allocation beyond the request's own), as the fast path needs (python/allreduce_now.cc).
//
// Locking: Enqueue and AnnounceFailure take the engine's lock (engine_shared.h); Poll, Wait and
// Collect only the handle table's own lock, but for Wait's release of the queue's claim. Files:
// engine_requests.cc (enqueue, announce), engine_inline.cc (a caller's Wait, which may run cycles).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/mpi/job_layout.h"
#include "common/status.h"
#include "core/agreed_layouts.h"
#include "core/completion_sink.h"
#include "core/cycle_driver.h"
#include "core/engine_shared.h"
#include "core/process_set_table.h"
#include "core/wakeups.h"
#include "monitor/monitors.h"
#include "operation/message.h"

namespace collectives {

// What a caller asks for: the request plus its buffers (output may be null when the engine
// allocates it: allgather, alltoall). Tensors in GPU memory have request.device >= 0 (or -2:
// a device the engine must find out from the pointer) and the producer's stream.
struct Submission {
  Request request;
  const void* input = nullptr;
  void* output = nullptr;
  uintptr_t stream = 0;
};

class EngineRequests {
 public:
  // All the engine's, outliving this; only references are kept (some objects are not built yet).
  EngineRequests(EngineShared& shared, const JobLayout& job, const ProcessSetTable& sets, CompletionSink& sink,
                 CycleDriver& driver, Wakeups& wakeups, Monitors& monitors)
      : shared_(shared), job_(job), sets_(sets), sink_(sink), driver_(driver), wakeups_(wakeups), monitors_(monitors) {}

  // Enqueues all submissions atomically (a group is negotiated together) or none. `caller_waits`:
  // the caller waits for them next (a synchronous verb), so the engine thread is not woken: the
  // caller's Wait runs the cycles itself if the engine thread is idle (engine_inline.cc).
  Status Enqueue(std::vector<Submission>&& subs, std::vector<int64_t>* handles, bool caller_waits = false);
  // Bad input found on this rank before submitting (e.g. by the Python layer): the other
  // ranks fail these names with `reason` instead of waiting for them. Nothing to wait for here.
  void AnnounceFailure(std::vector<Request>&& requests, const std::string& reason);
  bool Poll(int64_t handle) { return shared_.lifetime.forked_child() || sink_.handles().Poll(handle); }
  // Blocks until the handle completes or `timeout` passes (the caller releases the GIL and
  // loops); true when done or unknown. `first`: the caller's first call for this handle, which
  // spins briefly before sleeping.
  // While the engine thread is idle the caller runs the cycles itself (engine_inline.cc), unless
  // `run_cycles` is false (a framework kernel's thread: see tensorflow_kernels.cc).
  bool Wait(int64_t handle, bool first, std::chrono::milliseconds timeout, bool run_cycles = true);
  // Removes a completed handle and returns its outcome.
  Result Collect(int64_t handle) { return sink_.handles().Collect(handle); }

  // Gradient layouts found alike on every rank of a set, checked once per engine (agreed_layouts.h,
  // frontend/layout_check.h).
  AgreedLayouts& agreed_layouts() { return agreed_layouts_; }

 private:
  EngineShared& shared_;
  const JobLayout& job_;
  const ProcessSetTable& sets_;  // their members, under shared_.mu
  CompletionSink& sink_;         // the handles
  CycleDriver& driver_;          // whether a caller may run the cycles, and running them
  Wakeups& wakeups_;             // the doorbell, the submission count, whether waiters spin
  Monitors& monitors_;           // the stage timing
  AgreedLayouts agreed_layouts_;
};

}  // namespace collectives
