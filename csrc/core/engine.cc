// Engine lifecycle, the submission queue and handles.
#include "core/engine.h"

#include "core/process_exit.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "execution/device_submission.h"
#include "common/log.h"
#include "shm/shared_segment.h"
#include "common/thread_name.h"
#include "wait/wait_policy.h"
#include "backends/mpi/mpi_fault.h"
#include "backends/mpi/rank_agreement.h"
#include "core/validation.h"

namespace collectives {
namespace {

// Names are per process set: the same name may be in flight in two sets at once.
void QualifyName(Request* q) {
  if (q->process_set == 0) return;
  const std::string suffix = " [process set " + std::to_string(q->process_set) + "]";
  q->name += suffix;
  if (!q->group.empty()) q->group += suffix;
}

std::string JoinNames(const std::vector<Submission>& subs) {
  std::ostringstream os;
  for (size_t i = 0; i < subs.size() && i < 3; ++i) os << (i ? ", " : "") << "'" << subs[i].request.name << "'";
  if (subs.size() > 3) os << ", ...";
  return os.str();
}

}  // namespace

// Never runs in a forked child or for an abandoned engine: the Python binding's deleter leaks
// those objects (their threads or locks are not this process's to end or destroy).
Engine::~Engine() { Shutdown(); }

Status Engine::Start(MPI_Comm comm, const EngineConfig& config) {
  if (thread_.joinable() || lifetime_.abandoned())
    return Status::Error(StatusCode::INVALID_ARGUMENT, "engine already started");
  config_ = config;
  lifetime_.Started();
  SetFinalizeTimeout(config_.finalize_timeout_s);
  std::promise<Status> started;
  std::future<Status> ready = started.get_future();
  thread_ = std::thread(&Engine::ThreadMain, this, comm, std::move(started));
  // Setup waits inside MPI for every rank of the communicator (MPI_Init_thread, MPI_Comm_dup):
  // bound that wait, since a rank that never comes would leave this one blocked forever.
  const double limit_s = std::min(config_.init_timeout_s, 10.0 * 365 * 24 * 3600);
  if (limit_s > 0 && ready.wait_for(std::chrono::duration<double>(limit_s)) != std::future_status::ready) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!lifetime_.setup_done_locked()) {
      // The thread cannot be stopped inside MPI: let it go, and keep this object (it uses it)
      // alive for good. Should Setup still complete, ThreadMain only stops the late ranks.
      std::ostringstream os;
      os << "init() timed out after " << config_.init_timeout_s << " s: not every rank reached init() (this rank "
         << "waited in " << setup_step_.load() << ", which needs every rank of the communicator); set "
         << "COLLECTIVES_INIT_TIMEOUT_SECONDS to wait longer (0: no limit)";
      lifetime_.AbandonLocked(Status::Error(StatusCode::TIMEOUT, os.str()));
      const Status st = lifetime_.stop_info_locked().reason;
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
    std::lock_guard<std::mutex> lock(mu_);
    // After an init timeout the thread only ends, or stops the late ranks (engine_lifetime.h).
    if (!lifetime_.SetupEndedLocked(st.ok(), &late)) return;
  }
  if (!st.ok()) {
    started.set_value(st);
    return;
  }
  if (!late) {
    lifetime_.MarkRunning();
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
  st = autotune_.Start();
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
    st = monitors_.timeline.Start(config_.timeline_path, config_.timeline_mark_cycles);
    if (!st.ok()) Log(LogLevel::WARNING, st.message);
  }
  st = watchdog_.Start(&setup_step_);
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
    std::lock_guard<std::mutex> lock(mu_);
    mine = lifetime_.stop_request_locked().Flags();
    mpi_failed = lifetime_.stopped_status().code == StatusCode::INTERNAL;
  }
  std::vector<int> everyone(static_cast<size_t>(job_.size), 0);
  auto record_stop = [&](const std::vector<int>* parts) {
    std::lock_guard<std::mutex> lock(mu_);
    lifetime_.RecordStopLocked(parts, job_.rank, job_.size);
  };
  if (mpi_failed) {
    record_stop(nullptr);
  } else {
    const bool exchanged = monitors_.watchdog.Watch(BackendCall::SHUTDOWN_EXCHANGE, 0, [&] {
      return MPI_Allgather(&mine, 1, MPI_INT, everyone.data(), 1, MPI_INT, job_.comm);
    }) == MPI_SUCCESS;
    record_stop(exchanged ? &everyone : nullptr);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    lifetime_.MarkStoppedLocked();
  }
  sink_.FailAll(lifetime_.stopped_status());
  // GPU work already launched finishes (or is aborted after a grace period) and completes its
  // handles; then the NCCL communicators go.
  executor_.device().Shutdown(lifetime_.stopped_status());
  monitors_.timeline.Stop();
  if (mpi_failed) monitors_.watchdog.Watch(BackendCall::SHUTDOWN_EXCHANGE, 0, [&] { return MPI_Barrier(job_.comm); });
  // No wake message is in flight any more: receive what arrived, then release the communicators.
  wakeups_.Drain();
  negotiator_.Free();  // the negotiation message's resources; its table is empty (FailAll)
  process_sets_.FreeAll();
  job_.Free();
  executor_.Release();  // the backends' MPI operators, the fusion buffer, the shared segments
  // A shut-down process keeps no idle host buffers: unmap them, and free those still held by
  // the caller (outputs) when they are released.
  SetBufferPoolLimit(0);
  monitors_.watchdog.Stop();
  if (monitors_.stages_on) {
    const Negotiator::Report nr = negotiator_.report();
    std::fprintf(stderr,
                 "%s; fused with the negotiation: %llu done, %llu discarded; cycles %llu, run by callers %llu; "
                 "negotiation through %s, payload capacity changed %llu times\n",
                 monitors_.stages.Summary(job_.rank).c_str(), static_cast<unsigned long long>(nr.fused_done),
                 static_cast<unsigned long long>(nr.fused_discarded), static_cast<unsigned long long>(nr.cycles),
                 static_cast<unsigned long long>(monitors_.inline_cycles), nr.transport,
                 static_cast<unsigned long long>(nr.resizes));
  }
  // MPI itself stays initialized (finalized at process exit), so that init() can run again.
}

void Engine::Shutdown(bool process_exiting) {
  // A forked child must not touch the parent's engine: its locks may be held by threads that
  // do not exist here. An abandoned engine's thread is stuck in MPI: nothing to stop or join.
  if (lifetime_.forked_child() || lifetime_.abandoned()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lifetime_.stop_request_locked().Ask(process_exiting);
  }
  wakeups_.Ring();
  // Only one caller joins; the others find the thread gone.
  static std::mutex join_mu;
  std::lock_guard<std::mutex> lock(join_mu);
  if (!thread_.joinable()) return;
  thread_.join();
}

Status Engine::Enqueue(std::vector<Submission>&& subs, std::vector<int64_t>* handles, bool caller_waits) {
  const auto now = Clock::now();
  // GPU tensors: find their device and record the producer's stream position, on this
  // (the producer's) thread, before the engine can see them.
  std::vector<gpu::EventPtr> ready;  // both sized only when some tensor is on a GPU
  std::vector<int32_t> devices;
  for (size_t k = 0; k < subs.size(); ++k) {
    if (subs[k].request.device == -1) continue;
    if (devices.empty()) {
      ready.resize(subs.size());
      devices.assign(subs.size(), -1);
    }
    Submission& s = subs[k];
    Status st = PrepareDeviceSubmission(s.request, s.input, s.output, s.stream, gpu_device_, &ready[k], &devices[k]);
    if (!st.ok()) {
      std::vector<Request> reqs;
      for (const Submission& sub : subs) reqs.push_back(sub.request);
      AnnounceFailure(std::move(reqs), st.message);
      return st;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!lifetime_.accepting_locked()) return lifetime_.stopped_status();
  Status failure;
  for (Submission& s : subs) {
    Request& q = s.request;
    const std::vector<int>* members = process_sets_.MembersLocked(q.process_set);
    if (members == nullptr)
      return Status::Error(StatusCode::INVALID_ARGUMENT, "process set " + std::to_string(q.process_set) +
                                                             " does not exist (tensor '" + q.name + "')");
    if (std::find(members->begin(), members->end(), job_.rank) == members->end())
      return Status::Error(StatusCode::INVALID_ARGUMENT, "rank " + std::to_string(job_.rank) +
                                                             " is not a member of process set " +
                                                             std::to_string(q.process_set) + " (tensor '" + q.name + "')");
    Status st = ValidateSubmission(&s.request, s.input != nullptr && s.output != nullptr, *members, job_.size);
    if (!st.ok() && failure.ok()) failure = st;
    QualifyName(&q);
  }
  if (!failure.ok()) {
    // Bad input here must not leave the other ranks waiting for these names.
    std::vector<Request> reqs;
    for (const Submission& sub : subs) reqs.push_back(sub.request);
    if (queue_.AnnounceLocked(std::move(reqs), failure.message, now)) {
      wakeups_.Submitted();
      wakeups_.Ring();
    }
    return failure;
  }
  std::unordered_set<std::string> batch;  // names of this submission (filled only for several)
  for (const Submission& s : subs) {
    const std::string& name = s.request.name;
    if (queue_.InFlight(name) || (subs.size() > 1 && !batch.insert(name).second))
      return Status::Error(StatusCode::DUPLICATE_NAME,
                           "a collective named '" + name + "' is already in flight; names must be unique until the "
                           "operation completes (submitted: " + JoinNames(subs) + ")");
  }
  for (size_t k = 0; k < subs.size(); ++k) {
    Submission& s = subs[k];
    Pending p;
    p.request = std::move(s.request);
    p.input = s.input;
    p.output = s.output;
    if (!devices.empty()) {
      p.gpu_device = devices[k];
      p.ready = std::move(ready[k]);
    }
    p.enqueued = now;
    const int64_t handle = queue_.Add(std::move(p));
    sink_.handles().Add(handle);
    handles->push_back(handle);
  }
  wakeups_.Submitted();
  // A waiting caller may run the cycle itself (engine_inline.cc); if it cannot, it wakes the
  // engine thread then.
  if (caller_waits && driver_.CallerMayRunCycles())
    queue_.Claim(subs.size());
  else
    wakeups_.Ring();
  return Status::Ok();
}

void Engine::AnnounceFailure(std::vector<Request>&& reqs, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!lifetime_.accepting_locked()) return;
  std::vector<Request> valid;
  for (Request& q : reqs) {
    const std::vector<int>* members = process_sets_.MembersLocked(q.process_set);
    if (members == nullptr || std::find(members->begin(), members->end(), job_.rank) == members->end())
      continue;  // no set of ours expects this name
    QualifyName(&q);
    valid.push_back(std::move(q));
  }
  if (!queue_.AnnounceLocked(std::move(valid), reason, Clock::now())) return;
  wakeups_.Submitted();
  wakeups_.Ring();
}

Engine::StopInfo Engine::stop_info() {
  if (lifetime_.forked_child()) return StopInfo();
  std::lock_guard<std::mutex> lock(mu_);
  return lifetime_.stop_info_locked();
}

Status Engine::StartTimeline(const std::string& path, bool mark_cycles) {
  if (job_.rank != 0) return Status::Ok();  // rank 0 writes the timeline for everyone
  return monitors_.timeline.Start(path, mark_cycles);
}

void Engine::StopTimeline() { monitors_.timeline.Stop(); }

}  // namespace collectives
