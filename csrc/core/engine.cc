// The engine's life: start, the engine thread, setup, teardown, shutdown.
#include "core/engine.h"

#include "core/process_exit.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "common/log.h"
#include "shm/shared_segment.h"
#include "common/thread_name.h"
#include "wait/wait_policy.h"
#include "backends/mpi/mpi_fault.h"
#include "backends/mpi/rank_agreement.h"

namespace collectives {

// Never runs in a forked child or for an abandoned engine: the Python binding's deleter leaks
// those objects (their threads or locks are not this process's to end or destroy).
Engine::~Engine() { Shutdown(); }

Status Engine::Start(MPI_Comm comm, const EngineConfig& config) {
  if (thread_.joinable() || shared_.lifetime.abandoned())
    return Status::Error(StatusCode::INVALID_ARGUMENT, "engine already started");
  config_ = config;
  shared_.lifetime.Started();
  SetFinalizeTimeout(config_.finalize_timeout_s);
  std::promise<Status> started;
  std::future<Status> ready = started.get_future();
  thread_ = std::thread(&Engine::ThreadMain, this, comm, std::move(started));
  // Setup waits inside MPI for every rank of the communicator (MPI_Init_thread, MPI_Comm_dup):
  // bound that wait, since a rank that never comes would leave this one blocked forever.
  const double limit_s = std::min(config_.init_timeout_s, 10.0 * 365 * 24 * 3600);
  if (limit_s > 0 && ready.wait_for(std::chrono::duration<double>(limit_s)) != std::future_status::ready) {
    std::unique_lock<std::mutex> lock(shared_.mu);
    if (!shared_.lifetime.setup_done_locked()) {
      // The thread cannot be stopped inside MPI: let it go, and keep this object (it uses it)
      // alive for good. Should Setup still complete, ThreadMain only stops the late ranks.
      std::ostringstream os;
      os << "init() timed out after " << config_.init_timeout_s << " s: not every rank reached init() (this rank "
         << "waited in " << setup_step_.load() << ", which needs every rank of the communicator); set "
         << "COLLECTIVES_INIT_TIMEOUT_SECONDS to wait longer (0: no limit)";
      shared_.lifetime.AbandonLocked(Status::Error(StatusCode::TIMEOUT, os.str()));
      const Status st = shared_.lifetime.stop_info_locked().reason;
      lock.unlock();
      thread_.detach();
      return st;
    }
  }
  Status st = ready.get();
  if (!st.ok()) {
    thread_.join();
  }
  return st;
}

void Engine::ThreadMain(MPI_Comm comm, std::promise<Status> started) {
  NameThisThread("coll-engine");
  // Held from Setup to Teardown but while waiting for the next cycle, when a caller may run one.
  std::unique_lock<std::mutex> cycle(driver_.cycle_mu());
  Status st = Setup(comm);
  bool late = false;
  {
    std::lock_guard<std::mutex> lock(shared_.mu);
    // After an init timeout the thread only ends, or stops the late ranks (engine_lifetime.h).
    if (!shared_.lifetime.SetupEndedLocked(st.ok(), &late)) return;
  }
  if (!st.ok()) {
    started.set_value(st);
    return;
  }
  if (!late) {
    shared_.lifetime.MarkRunning();
    started.set_value(Status::Ok());
  }

  driver_.RunCycles(cycle);
  Teardown();
}

Status Engine::Setup(MPI_Comm comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Here rather than in mpi4py's import (collectives/basics.py asks it not to), so that the
    // init timeout covers it: MPI_Init_thread returns only once every rank has called it. MPI
    // is finalized at process exit (bindings.cc, ProcessShouldFinalizeMpi), not by Teardown, so that
    // init() may run again.
    setup_step_ = "MPI_Init_thread";
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      return Status::Error(StatusCode::INTERNAL, "MPI_Init_thread failed");
    NoteMpiInitializedHere();
  }
  int thread_level = 0;
  MPI_Query_thread(&thread_level);
  if (thread_level < MPI_THREAD_SERIALIZED)
    return Status::Error(StatusCode::INTERNAL,
                         "MPI was initialized without thread support (need MPI_THREAD_SERIALIZED or better; "
                         "initialize it with MPI_THREAD_MULTIPLE, the mpi4py default)");
  {
    Status laid_out = job_.Init(comm, &setup_step_);
    if (!laid_out.ok()) return laid_out;
    job_.thread_level = thread_level;
  }
  SetLogRank(job_.rank);
  // MPICH crashes on a failed send to a lost peer: say so in one line (mpi_fault.h).
  ReportCrashesInMpi(job_.rank);
  // Spin only when every rank on this machine has a core: an oversubscribed machine needs
  // its cores for the ranks that compute.
  const bool spin = static_cast<unsigned>(job_.local_size) <= std::thread::hardware_concurrency();
  SetWaitSpinAllowed(spin);
  {
    // The host's count of waiting threads, which the waiting policy subtracts from the machine's
    // load (wait_policy.h). Never unmapped: a user thread may be inside a wait when the engine
    // stops; a re-init maps another page.
    static_assert(std::atomic<int32_t>::is_always_lock_free, "a counter shared between processes");
    setup_step_ = "the shared-memory count of waiting threads (needs every rank on this host)";
    void* mapped = nullptr;
    std::string why;
    Status shared = MapSharedSegment(job_.local_comm, sizeof(std::atomic<int32_t>), "waiters", &mapped, &why);
    if (!shared.ok()) return shared;
    if (mapped == nullptr) Log(LogLevel::INFO, "waiting threads counted per process only: " + why);
    SetHostWaiters(static_cast<std::atomic<int32_t>*>(mapped));
  }
  setup_step_ = "the doorbells in shared memory (needs every rank on this host)";
  {
    Status rung = wakeups_.Init(job_, spin);
    if (!rung.ok()) return rung;
  }
  setup_step_ = "the engine's setup after MPI_Comm_dup";
  ExecutorConfig exec;
  exec.rank = job_.rank;
  exec.local_rank = job_.local_rank;
  exec.local_size = job_.local_size;
  exec.spin = spin;
  exec.hierarchical_allreduce = config_.hierarchical_allreduce;
  exec.hierarchical_allgather = config_.hierarchical_allgather;
  exec.shm_allreduce = config_.shm_allreduce;
  exec.cma_allreduce = config_.cma_allreduce;
  exec.stall_check_s = config_.stall_check_s;
  exec.stall_shutdown_s = config_.stall_shutdown_s;
  Status st = executor_.Init(job_.comm, job_.local_comm, job_.cross_comm, exec, &setup_step_);
  if (!st.ok()) return st;
  st = monitoring_.autotune().Start();
  if (!st.ok()) return st;
  // GPU libraries: loaded now, used from the first GPU tensor on. Missing ones are no error
  // here; GPU tensors then fail with the reason (gpu::Libraries::problem).
  executor_.device().Load(config_.cuda_driver_library, config_.nccl_library, config_.nccl_problem);
  executor_.device().OnIdle([this] { driver_.GpuIdle(); });
  process_sets_.AddWholeJob(job_);
  NegotiatorConfig negotiation;
  negotiation.rank = job_.rank;
  negotiation.size = job_.size;
  negotiation.local_size = job_.local_size;
  negotiation.cache_capacity = config_.cache_capacity;
  negotiation.stall_check_s = config_.stall_check_s;
  negotiation.stall_shutdown_s = config_.stall_shutdown_s;
  negotiation.shm_negotiation = config_.shm_negotiation;
  st = negotiator_.Init(job_.comm, negotiation, &setup_step_);
  if (!st.ok()) return st;
  if (job_.rank == 0 && !config_.timeline_path.empty()) {
    st = monitoring_.monitors().timeline.Start(config_.timeline_path, config_.timeline_mark_cycles);
    if (!st.ok()) Log(LogLevel::WARNING, st.message);
  }
  st = monitoring_.watchdog().Start(&setup_step_);
  if (!st.ok()) return st;
  SetBufferPoolLimit(config_.buffer_pool_bytes);
  wakeups_.StartMessages(job_.comm);
  driver_.Start();
  return Status::Ok();
}

void Engine::Teardown() {
  // Every rank leaves the loop in the same cycle. Each tells the others whether it asked to stop
  // and whether its process is exiting, which decides whether init() may run again; the stop is
  // recorded before running() turns false, so whoever sees it stopped also sees why. This
  // allgather is also the barrier after which no wake message is in flight any more. After an
  // MPI failure it might never complete: then fail the handles first, and the stop is final.
  int mine = 0;
  bool mpi_failed = false;
  {
    std::lock_guard<std::mutex> lock(shared_.mu);
    mine = shared_.lifetime.stop_request_locked().Flags();
    mpi_failed = shared_.lifetime.stopped_status().code == StatusCode::INTERNAL;
  }
  std::vector<int> everyone(static_cast<size_t>(job_.size), 0);
  auto record_stop = [&](const std::vector<int>* parts) {
    std::lock_guard<std::mutex> lock(shared_.mu);
    shared_.lifetime.RecordStopLocked(parts, job_.rank, job_.size);
  };
  if (mpi_failed) {
    record_stop(nullptr);
  } else {
    const bool exchanged = monitoring_.monitors().watchdog.Watch(BackendCall::SHUTDOWN_EXCHANGE, 0, [&] {
      return MPI_Allgather(&mine, 1, MPI_INT, everyone.data(), 1, MPI_INT, job_.comm);
    }) == MPI_SUCCESS;
    record_stop(exchanged ? &everyone : nullptr);
  }
  {
    std::lock_guard<std::mutex> lock(shared_.mu);
    shared_.lifetime.MarkStoppedLocked();
  }
  sink_.FailAll(shared_.lifetime.stopped_status());
  // GPU work already launched finishes (or is aborted after a grace period) and completes its
  // handles; then the NCCL communicators go.
  executor_.device().Shutdown(shared_.lifetime.stopped_status());
  monitoring_.monitors().timeline.Stop();
  if (mpi_failed) monitoring_.monitors().watchdog.Watch(BackendCall::SHUTDOWN_EXCHANGE, 0, [&] { return MPI_Barrier(job_.comm); });
  // No wake message is in flight any more: receive what arrived, then release the communicators.
  wakeups_.Drain();
  negotiator_.Free();  // the negotiation message's resources; its table is empty (FailAll)
  process_sets_.FreeAll();
  job_.Free();
  executor_.Release();  // the backends' MPI operators, the fusion buffer, the shared segments
  // A shut-down process keeps no idle host buffers: unmap them, and free those still held by
  // the caller (outputs) when they are released.
  SetBufferPoolLimit(0);
  monitoring_.monitors().watchdog.Stop();
  if (monitoring_.monitors().stages_on) {
    const Negotiator::Report nr = negotiator_.report();
    std::fprintf(stderr,
                 "%s; fused with the negotiation: %llu done, %llu discarded; cycles %llu, run by callers %llu; "
                 "negotiation through %s, payload capacity changed %llu times\n",
                 monitoring_.monitors().stages.Summary(job_.rank).c_str(), static_cast<unsigned long long>(nr.fused_done),
                 static_cast<unsigned long long>(nr.fused_discarded), static_cast<unsigned long long>(nr.cycles),
                 static_cast<unsigned long long>(monitoring_.monitors().inline_cycles), nr.transport,
                 static_cast<unsigned long long>(nr.resizes));
  }
  // MPI itself stays initialized (finalized at process exit), so that init() can run again.
}

void Engine::Shutdown(bool process_exiting) {
  // A forked child must not touch the parent's engine: its locks may be held by threads that
  // do not exist here. An abandoned engine's thread is stuck in MPI: nothing to stop or join.
  if (shared_.lifetime.forked_child() || shared_.lifetime.abandoned()) return;
  {
    std::lock_guard<std::mutex> lock(shared_.mu);
    shared_.lifetime.stop_request_locked().Ask(process_exiting);
  }
  wakeups_.Ring();
  // Only one caller joins; the others find the thread gone.
  static std::mutex join_mu;
  std::lock_guard<std::mutex> lock(join_mu);
  if (!thread_.joinable()) return;
  thread_.join();
}

Engine::StopInfo Engine::stop_info() {
  if (shared_.lifetime.forked_child()) return StopInfo();
  std::lock_guard<std::mutex> lock(shared_.mu);
  return shared_.lifetime.stop_info_locked();
}

}  // namespace collectives
