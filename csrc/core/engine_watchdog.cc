// The engine's side of the watchdog (watchdog.h): the ranks' hosts, learned at Setup so that a
// report can name them, and what a backend call that never returns does to this process.
#include "core/engine_watchdog.h"

#include <vector>

#include "backends/mpi/mpi_backend.h"
#include "core/process_exit.h"

namespace collectives {
namespace {

// Between the report and the process's exit: time for the threads blocked in synchronize() to
// raise StallTimeoutError and for the program to report it (or exit by itself).
constexpr double kWatchdogGraceS = 5.0;

}  // namespace

Status EngineWatchdog::Start(std::atomic<const char*>* step) {
  if (config_.stall_shutdown_s <= 0) return Status::Ok();  // never fires: no thread, no exchange
  *step = "MPI_Allgather of the ranks' host names";
  std::vector<std::string> hosts;
  Status st = MpiBackend::HostNames(job_.comm, &hosts);
  if (!st.ok()) return st;
  monitors_.watchdog.AddSet(0, sets_.whole_job().ranks);
  monitors_.watchdog.Start(config_.stall_shutdown_s, kWatchdogGraceS, job_.rank, std::move(hosts),
                  [this](const std::string& message) { OnBackendStall(message); });
  return Status::Ok();
}

void EngineWatchdog::OnBackendStall(const std::string& message) {
  // Runs on the watchdog's thread while the engine thread is stuck in MPI for good: the engine
  // is abandoned as after an init() timeout (never destroyed, shutdown() returns at once, MPI is
  // not finalized at exit), later calls raise with this message, and every waiting handle fails.
  const Status st = Status::Error(StatusCode::TIMEOUT, message);
  {
    std::lock_guard<std::mutex> lock(mu_);
    lifetime_.AbandonLocked(st);
    lifetime_.set_stopped_status_locked(st);
    lifetime_.MarkStoppedLocked();
  }
  sink_.handles().FailUndone(st);
  driver_.AbortCallers();  // a caller running the cycle stops waiting in MPI and raises (cycle_driver.h)
  wakeups_.Ring();
}

}  // namespace collectives
