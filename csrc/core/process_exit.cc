#include "core/process_exit.h"

#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "common/process_id.h"
#include "common/thread_name.h"

namespace collectives {
namespace {

std::atomic<double> finalize_timeout_s{1800.0};
std::atomic<int> mpi_owner_pid{0};  // the process whose engine ran MPI_Init_thread
std::atomic<bool> any_abandoned{false};
std::atomic<bool> peer_never_finalizes{false};

// Registered after every library's handlers, so it runs first among them; its status is the
// one exit() was given, which the program's end (sys.exit, an uncaught error) chose.
[[maybe_unused]] void ExitNow(int status, void*) {
  std::fflush(nullptr);
  _exit(status);
}

}  // namespace

void EndProcessWithoutTeardownAtExit() {
  static std::once_flag registered;
  std::call_once(registered, [] {
#ifdef __GLIBC__
    // glibc's on_exit hands the handler exit()'s status; atexit could not keep it. Elsewhere
    // the process exits as before.
    on_exit(&ExitNow, nullptr);
#endif
  });
}

void NoteMpiInitializedHere() { mpi_owner_pid = CurrentPid(); }
void NoteEngineAbandoned() { any_abandoned = true; }
void NotePeerNeverFinalizes() { peer_never_finalizes = true; }
bool ProcessShouldFinalizeMpi() { return mpi_owner_pid == CurrentPid() && !any_abandoned && !peer_never_finalizes; }

void SetFinalizeTimeout(double seconds) { finalize_timeout_s = seconds; }

void FinalizeMpiWithinTimeout() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  const double limit_s = finalize_timeout_s.load();
  if (limit_s <= 0) {
    MPI_Finalize();
    return;
  }
  // Shared: a finalizer left behind must not outlive what it signals.
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread finalizer([done] {
    NameThisThread("coll-finalize");
    MPI_Finalize();
    done->set_value();
  });
  if (finished.wait_for(std::chrono::duration<double>(limit_s)) == std::future_status::ready) {
    finalizer.join();
    return;
  }
  finalizer.detach();  // it stays inside MPI until the process ends
  std::fprintf(stderr,
               "collectives: MPI_Finalize did not return within %g s (COLLECTIVES_FINALIZE_TIMEOUT_SECONDS): a rank "
               "of the job has not finalized MPI (it may have exited without it, or still be running); this "
               "process ends without finalizing\n",
               limit_s);
  EndProcessWithoutTeardownAtExit();
}

}  // namespace collectives
