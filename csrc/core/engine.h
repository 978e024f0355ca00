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
// sits in the job is a JobLayout (job_layout.h). The engine keeps the setup and teardown that wire
// these together; one cycle's steps are a CycleRunner (cycle_runner.h).
//
// The facade's calls are few: start, shutdown, why it stopped, the lifetime's and the job's facts.
// The request calls (enqueue, announce a failure, poll, wait, collect) are an EngineRequests
// (engine_requests.h, through requests()); the monitors with the calls on them (timeline, autotune
// state, hierarchical switch, the GPU and its counts) an EngineMonitoring (engine_monitoring.h,
// through monitoring()); what submitting threads share with the cycle under the engine's lock an
// EngineShared (engine_shared.h).
//
// Files: engine.cc (start, setup, teardown), engine_requests.cc (enqueue), engine_inline.cc (a
// caller's Wait), engine_monitoring.cc; the watchdog's hooks are an EngineWatchdog
// (engine_watchdog.h), the autotuner's an EngineAutotune (engine_autotune.h).
#pragma once
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "backends/mpi/job_layout.h"
#include "common/buffer_pool.h"
#include "common/process_id.h"
#include "common/status.h"
#include "core/agreed_layouts.h"
#include "core/completion_sink.h"
#include "core/cycle_driver.h"
#include "core/cycle_runner.h"
#include "core/engine_config.h"
#include "core/engine_lifetime.h"
#include "core/engine_monitoring.h"
#include "core/engine_requests.h"
#include "core/engine_shared.h"
#include "core/process_exit.h"
#include "core/process_set_table.h"
#include "core/wakeups.h"
#include "execution/executor.h"
#include "negotiation/negotiator.h"
#include "operation/handle_table.h"
#include "operation/message.h"
#include "operation/pending.h"
#include "operation/process_set.h"

namespace collectives {

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
  const EngineLifetime& lifetime() const { return shared_.lifetime; }

  // This rank's places in the job: rank, size, local and cross ones, MPI's thread level (job_layout.h).
  const JobLayout& job() const { return job_; }

  // The request calls: enqueue, announce a failure, poll, wait, collect (engine_requests.h).
  EngineRequests& requests() { return requests_; }
  // The monitors and the calls on them: timeline, autotune state, hierarchical switch, the GPU
  // (engine_monitoring.h).
  EngineMonitoring& monitoring() { return monitoring_; }

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
  std::thread thread_;
  // The doorbell, the wake messages to other hosts, the submission count and whether waiting
  // threads spin (wakeups.h): atomic or the cycle runner's, no lock.
  Wakeups wakeups_;
  // Shared with submitting threads: the lock, the queue, the lifetime, the GPU (engine_shared.h).
  EngineShared shared_;
  // The timeline, the watchdog, the autotuner, the stage timing, and the engine's hooks into them
  // (engine_monitoring.h). Only keeps references to members declared below.
  EngineMonitoring monitoring_{config_, job_, executor_, process_sets_, shared_, sink_, driver_, wakeups_};

  // Cycle state: whoever runs a cycle holds the cycle driver's cycle_mu (cycle_driver.h): the
  // engine thread, or a caller waiting for its own result while the engine thread is idle.
  // The protocol that decides each cycle's responses, with this rank's pending entries, the
  // response cache, the coordinator and the cycle counts (negotiator.h).
  Negotiator negotiator_;
  // The process sets stay here rather than in the negotiator, which only reads them: control
  // operations create and remove them during execution (completion_sink.cc), and the executor,
  // the watchdog and Teardown use them too. Their communicators are the cycle's (the cycle
  // driver's cycle_mu), their members for the checks at enqueue are under shared_.mu (process_set_table.h).
  ProcessSetTable process_sets_{shared_.mu};
  // Where operations end (completion_sink.h): the handles, and the executor's and the negotiator's
  // listener. Declared after what it refers to.
  CompletionSink sink_{shared_.mu, shared_.queue, monitoring_.monitors(), negotiator_, process_sets_, executor_, job_};
  // Who runs the cycles and when: the waiting between them, the GPU hold, callers' cycles
  // (cycle_driver.h). Declared after what it refers to.
  CycleDriver driver_{CycleInputs{shared_.mu, shared_.queue, shared_.lifetime, config_, executor_, negotiator_,
                                  shared_.gpu_device, monitoring_.monitors(), wakeups_,
                                  [this](bool* active, bool* declined) { return cycle_.Run(active, declined); }}};
  // One cycle: the queue to the negotiator, its responses to the executor (cycle_runner.h).
  CycleRunner cycle_{CycleParts{shared_.mu, shared_.queue, shared_.lifetime, config_, shared_.gpu_device,
                                monitoring_.monitors(), monitoring_.autotune(), negotiator_, process_sets_, executor_,
                                sink_, driver_}};
  // The request calls (engine_requests.h). Declared after what it refers to.
  EngineRequests requests_{shared_, job_, process_sets_, sink_, driver_, wakeups_, monitoring_.monitors()};
};

}  // namespace collectives
