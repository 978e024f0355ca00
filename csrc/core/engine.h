// The engine: one background thread that owns all communication. Framework threads
// enqueue requests and get handles at once; the engine thread negotiates with the other
// ranks which names are ready everywhere, executes them in the same order on every rank
// (fusing small allreduces), and completes the handles.
//
// The Engine is a facade over objects with narrow interfaces, each documenting which lock
// guards it: a Negotiator decides what runs in each cycle and plans this rank's part
// (negotiator.h, cycle_plan.h), an Executor runs it on the backends (executor.h), and the
// Monitors (monitors.h: timeline, watchdog, autotuner, stage timing) watch them. The submissions
// not yet taken are a SubmissionQueue (submission_queue.h); where operations end is the
// CompletionSink (completion_sink.h: the handles, the listeners); the process sets are a
// ProcessSetTable (process_set_table.h); who runs the cycles and when is the CycleDriver
// (cycle_driver.h), over the Wakeups (wakeups.h: doorbell, wake messages); the engine's life
// (started, stopped and why, abandoned) is its EngineLifetime (engine_lifetime.h). Where this rank
// sits in the job is a JobLayout (job_layout.h). The engine keeps the public calls, the setup and
// teardown that wire these together; one cycle's steps are a CycleRunner (cycle_runner.h).
//
// Files: engine.cc (start, setup, teardown, enqueue), engine_inline.cc (a caller's Wait); the
// watchdog's hooks are an EngineWatchdog (engine_watchdog.h), the autotuner's an EngineAutotune
// (engine_autotune.h).
#pragma once
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/buffer_pool.h"
#include "core/agreed_layouts.h"
#include "core/engine_autotune.h"
#include "core/engine_config.h"
#include "core/engine_lifetime.h"
#include "core/process_exit.h"
#include "core/completion_sink.h"
#include "core/cycle_driver.h"
#include "core/cycle_runner.h"
#include "core/engine_watchdog.h"
#include "core/process_set_table.h"
#include "core/submission_queue.h"
#include "monitor/monitors.h"
#include "execution/executor.h"
#include "operation/handle_table.h"
#include "backends/mpi/job_layout.h"
#include "operation/message.h"
#include "negotiation/negotiator.h"
#include "operation/pending.h"
#include "common/process_id.h"
#include "operation/process_set.h"
#include "common/status.h"
#include "core/wakeups.h"

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

class Engine final {
 public:
  ~Engine();

  // Starts the engine thread on a duplicate of `comm` and waits until it is ready.
  Status Start(MPI_Comm comm, const EngineConfig& config);
  // Asks every rank to stop, waits for this engine thread to exit. Idempotent.
  // `process_exiting`: the process is about to end (atexit), so the other ranks learn that this
  // rank will not init() again.
  void Shutdown(bool process_exiting = false);

  // Why the engine stopped, once its thread has ended, and whether a later init() may start a new
  // engine (engine_lifetime.h).
  using StopInfo = EngineStopInfo;
  StopInfo stop_info();

  // Running, and the facts any thread may read without a lock (engine_lifetime.h): a forked
  // child holds a copy of this object but not its threads (whose locks it may hold), so it must
  // not touch it and must never destroy it (forked_child, owner_pid); start timed out, or the
  // watchdog found the engine thread stuck in a backend call: the thread is stuck in MPI and
  // still uses this object, which must therefore never be destroyed (abandoned). Whether MPI is
  // finalized at this process's exit: ProcessShouldFinalizeMpi (process_exit.h).
  const EngineLifetime& lifetime() const { return lifetime_; }

  // This rank's places in the job: rank, size, local and cross ones, MPI's thread level (job_layout.h).
  const JobLayout& job() const { return job_; }
  // Turns the hierarchical algorithms (hierarchical.h) on or off from the next operation on. Every
  // rank must make the same change at the same point of its sequence of operations, with none in
  // flight (e.g. right after a barrier), or ranks would run different algorithms and never meet.
  void SetHierarchical(bool allreduce, bool allgather) { executor_.SetHierarchical(allreduce, allgather); }
  // The autotuner's parameters in force and whether it is still tuning (any thread).
  AutotuneState autotune_state() const { return monitors_.autotune.state(); }
  // The GPU this process uses (-1 until a GPU tensor is submitted).
  int gpu_device() const { return gpu_device_; }
  int64_t gpu_allreduce_launches() const { return executor_.device().AllreduceLaunches(); }

  // Enqueues all submissions atomically (a group is negotiated together) or none. `caller_waits`:
  // the caller waits for them next (a synchronous verb), so the engine thread is not woken: the
  // caller's Wait runs the cycles itself if the engine thread is idle (engine_inline.cc).
  Status Enqueue(std::vector<Submission>&& subs, std::vector<int64_t>* handles, bool caller_waits = false);
  // Bad input found on this rank before submitting (e.g. by the Python layer): the other
  // ranks fail these names with `reason` instead of waiting for them. Nothing to wait for here.
  void AnnounceFailure(std::vector<Request>&& requests, const std::string& reason);
  bool Poll(int64_t handle) { return lifetime_.forked_child() || sink_.handles().Poll(handle); }
  // Blocks until the handle completes or `timeout` passes (the caller releases the GIL and
  // loops); true when done or unknown. `first`: the caller's first call for this handle, which
  // spins briefly before sleeping.
  // While the engine thread is idle the caller runs the cycles itself (engine_inline.cc), unless
  // `run_cycles` is false (a framework kernel's thread: see tensorflow_kernels.cc).
  bool Wait(int64_t handle, bool first, std::chrono::milliseconds timeout, bool run_cycles = true);
  // Removes a completed handle and returns its outcome.
  Result Collect(int64_t handle) { return sink_.handles().Collect(handle); }

  Status StartTimeline(const std::string& path, bool mark_cycles);
  void StopTimeline();

  // Gradient layouts found alike on every rank of a set, checked once per engine (agreed_layouts.h).
  AgreedLayouts& agreed_layouts() { return agreed_layouts_; }

 private:
  // engine.cc
  void ThreadMain(MPI_Comm comm, std::promise<Status> started);
  Status Setup(MPI_Comm comm);
  void Teardown();

  EngineConfig config_;
  JobLayout job_;  // this process's communicators and places in the job (set in Setup)
  // What Setup is waiting for, for the init timeout's message.
  std::atomic<const char*> setup_step_{""};
  // The data backends and algorithms, and running the negotiated responses on them (executor.h).
  Executor executor_;
  std::atomic<int> gpu_device_{-1};   // one GPU per process, fixed by the first GPU tensor
  std::thread thread_;
  // The doorbell, the wake messages to other hosts, the submission count and whether waiting
  // threads spin (wakeups.h): atomic or the cycle runner's, no lock.
  Wakeups wakeups_;

  // Shared with submitting threads, under mu_.
  std::mutex mu_;
  SubmissionQueue queue_;  // submissions no cycle has taken yet, names in flight (submission_queue.h)
  // Started, running, asked to stop, stopped and why, abandoned (engine_lifetime.h): under mu_
  // but for its atomics.
  EngineLifetime lifetime_;
  // The autotuner's hooks (engine_autotune.h): they change config_'s tuned knobs between cycles.
  // It only keeps references, some to members declared below.
  EngineAutotune autotune_{config_, executor_, monitors_, job_, mu_, lifetime_};

  // The timeline, the watchdog, the autotuner, the stage timing (monitors.h).
  Monitors monitors_;

  // Cycle state: whoever runs a cycle holds the cycle driver's cycle_mu (cycle_driver.h): the
  // engine thread, or a caller waiting for its own result while the engine thread is idle.
  // The protocol that decides each cycle's responses, with this rank's pending entries, the
  // response cache, the coordinator and the cycle counts (negotiator.h).
  Negotiator negotiator_;
  // The process sets stay here rather than in the negotiator, which only reads them: control
  // operations create and remove them during execution (completion_sink.cc), and the executor,
  // the watchdog and Teardown use them too. Their communicators are the cycle's (the cycle
  // driver's cycle_mu), their members for the checks at enqueue are under mu_ (process_set_table.h).
  ProcessSetTable process_sets_{mu_};
  // Where operations end (completion_sink.h): the handles, and the executor's and the negotiator's
  // listener. Declared after what it refers to.
  CompletionSink sink_{mu_, queue_, monitors_, negotiator_, process_sets_, executor_, job_};
  // Who runs the cycles and when: the waiting between them, the GPU hold, callers' cycles
  // (cycle_driver.h). Declared after what it refers to.
  CycleDriver driver_{CycleInputs{mu_, queue_, lifetime_, config_, executor_, negotiator_, gpu_device_,
                                  monitors_, wakeups_, [this](bool* active, bool* declined) {
                                    return cycle_.Run(active, declined);
                                  }}};
  // One cycle: the queue to the negotiator, its responses to the executor (cycle_runner.h).
  CycleRunner cycle_{CycleParts{mu_, queue_, lifetime_, config_, gpu_device_, monitors_, autotune_, negotiator_,
                                process_sets_, executor_, sink_, driver_}};
  // A backend call that never returns ends the process (engine_watchdog.h).
  EngineWatchdog watchdog_{config_, job_, monitors_, process_sets_, mu_, lifetime_, sink_, driver_, wakeups_};

  AgreedLayouts agreed_layouts_;
};

}  // namespace collectives
