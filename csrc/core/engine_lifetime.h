// The engine's life: started by this process or inherited by a forked child, running, asked to
// stop, stopped (and why, and whether init() may start another engine), or abandoned inside MPI
// (an init() timeout, or the watchdog's verdict on a backend call that never returns). What the
// process does at its exit because of it is process_exit.h's.
//
// Locking: no lock of its own. Everything but the atomics is under the engine's lock, the lock
// under which an enqueue checks that the engine runs, so that a submission and the engine's stop
// never cross: the methods named ...Locked expect it held. The atomics (the owner, abandoned,
// running) are read without it by any thread; abandoned and running are set under it, except
// running's first setting by the engine thread (as before the split).
#pragma once
#include <atomic>
#include <vector>

#include "common/process_id.h"
#include "common/status.h"

namespace collectives {

// Why the engine stopped, once its thread has ended. `restartable`: a later init() may start a
// new engine -- every rank stopped through shutdown() calls and none is exiting. A stall
// shutdown, an MPI failure, a rank's exit or an init() timeout is final for the process.
struct EngineStopInfo {
  bool stopped = false;
  bool restartable = false;
  Status reason;
};

// What this rank asks of the stop, for the teardown's exchange: shutdown() was called, from the
// process's exit, or init() gave up before the engine was set up. Under the engine's lock.
class StopRequest {
 public:
  // shutdown(): every rank is asked to stop; `process_exiting`: from this process's exit.
  void Ask(bool process_exiting) {
    asked_ = true;
    if (process_exiting) process_exiting_ = true;
  }
  // Setup completed after an init timeout: this engine only stops, as an exiting rank.
  void AskAfterInitGaveUp() {
    Ask(true);
    init_gave_up_ = true;
  }
  bool asked() const { return asked_; }
  // This rank's part of the teardown's exchange (engine_lifetime.cc reads everyone's).
  int Flags() const;

 private:
  bool asked_ = false;
  bool process_exiting_ = false;  // this process is ending
  bool init_gave_up_ = false;     // Setup completed after an init timeout
};

class EngineLifetime {
 public:
  // Any thread, no lock.
  // A forked child holds a copy of the engine but not its threads (whose locks it may hold).
  bool forked_child() const { return owner_pid_ != 0 && owner_pid_ != CurrentPid(); }
  int owner_pid() const { return owner_pid_; }
  bool abandoned() const { return abandoned_; }
  bool running() const { return running_; }
  // Start: this process owns the engine from now on. The engine thread, once set up: it runs.
  void Started() { owner_pid_ = CurrentPid(); }
  void MarkRunning() { running_ = true; }

  // Under the engine's lock.
  bool setup_done_locked() const { return setup_done_; }
  // The engine thread is past Setup (`ok`: successfully). False when Start already gave up on it
  // and Setup failed: the thread just ends. `late`: Start gave up and Setup completed after all:
  // the engine only stops, as an exiting rank (this process will not start again).
  bool SetupEndedLocked(bool ok, bool* late);
  // Start gave up on the engine thread, or the watchdog found it stuck in MPI: it stays there,
  // and the engine is never destroyed; the stop is final, for `why`.
  void AbandonLocked(const Status& why);
  // shutdown()'s request and what this rank tells the others of it at the teardown.
  StopRequest& stop_request_locked() { return stop_request_; }
  const StopRequest& stop_request_locked() const { return stop_request_; }
  // Whether new work is taken: the engine runs and nobody asked it to stop.
  bool accepting_locked() const { return running_ && !stop_request_.asked(); }
  void MarkStoppedLocked() { running_ = false; }
  // Why the engine stopped, for requests made afterwards; set by whoever decides the stop. The
  // engine thread also reads it without the lock at teardown, as it did before the split.
  const Status& stopped_status() const { return stopped_status_; }
  void set_stopped_status_locked(const Status& why) { stopped_status_ = why; }
  const EngineStopInfo& stop_info_locked() const { return stop_info_; }

  // Teardown's exchange (engine_lifetime.cc): the stop from everyone's parts (StopRequest::Flags;
  // null: the exchange failed), with this rank's place in the job.
  void RecordStopLocked(const std::vector<int>* everyone, int rank, int size);

 private:
  int owner_pid_ = 0;  // a forked child has the object but not the thread (set once, by Start)
  // Start gave up on the engine thread (init timeout); set under mu_ unless setup_done_.
  std::atomic<bool> abandoned_{false};
  std::atomic<bool> running_{false};
  StopRequest stop_request_;
  bool setup_done_ = false;       // the engine thread is past Setup and will run
  EngineStopInfo stop_info_;      // set when the engine thread ends
  Status stopped_status_;         // why the engine stopped, for requests made afterwards
};

}  // namespace collectives
