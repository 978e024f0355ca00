// The engine's life (engine_lifetime.h): the end of its setup, its abandonment, the shutdown
// request, and why it stopped, and whether init() may start another one in this process.
#include "core/engine_lifetime.h"

#include <string>

#include "common/rank_list.h"
#include "core/process_exit.h"

namespace collectives {
namespace {

// Each rank's part of the exchange at Teardown.
constexpr int kStopAsked = 1;    // this rank called shutdown()
constexpr int kStopExiting = 2;  // ... from its process's exit
constexpr int kStopGaveUp = 4;   // its init() timed out before this engine was set up

}  // namespace

bool EngineLifetime::SetupEndedLocked(bool ok, bool* late) {
  if (abandoned_) {
    if (!ok) return false;
    // Setup completed after Start gave up (init timeout) and told its caller so. The ranks that
    // arrived meanwhile now wait in their engines for this one: run one cycle that stops them
    // all, as an exiting rank (this process will not start again), so that their operations
    // fail at once instead of at the stall timeout.
    *late = true;
    stop_request_.AskAfterInitGaveUp();
  }
  setup_done_ = true;
  if (ok) stopped_status_ = Status::Error(StatusCode::SHUT_DOWN, "collectives has been shut down");
  return true;
}

void EngineLifetime::AbandonLocked(const Status& why) {
  abandoned_ = true;
  NoteEngineAbandoned();
  EndProcessWithoutTeardownAtExit();
  stop_info_.stopped = true;
  stop_info_.restartable = false;
  stop_info_.reason = why;
}

int StopRequest::Flags() const {
  return (asked_ ? kStopAsked : 0) | (process_exiting_ ? kStopExiting : 0) | (init_gave_up_ ? kStopGaveUp : 0);
}

void EngineLifetime::RecordStopLocked(const std::vector<int>* everyone, int rank, int size) {
  EngineStopInfo info;
  info.stopped = true;
  info.reason = stopped_status_;
  std::vector<int> asked, exiting, gave_up;
  if (everyone) {
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const int flags = (*everyone)[static_cast<size_t>(r)];
      if (flags & kStopGaveUp) gave_up.push_back(r);
      else if (flags & kStopExiting) exiting.push_back(r);
      else if (flags & kStopAsked) asked.push_back(r);
    }
  }
  // A rank whose init() gave up never finalizes MPI (its engine is abandoned inside MPI), and
  // MPICH's MPI_Finalize here would wait for it until the finalize timeout: skip it, as it does.
  if (!gave_up.empty()) NotePeerNeverFinalizes();
  // Only shutdown() calls (here or elsewhere) leave the job able to start again; a rank that
  // exits never comes back, and a stall or MPI failure ends the job as Horovod's does.
  info.restartable = everyone && stopped_status_.code == StatusCode::SHUT_DOWN && exiting.empty() && gave_up.empty();
  // Name the other ranks' part in the stop when it matters: it was theirs, or it is final.
  if (stopped_status_.code == StatusCode::SHUT_DOWN &&
      (!exiting.empty() || !gave_up.empty() || (!stop_request_.asked() && !asked.empty()))) {
    std::vector<std::string> parts;
    if (!gave_up.empty()) parts.push_back(NamedRanks(gave_up) + " gave up waiting in init() (its init timeout passed)");
    if (!exiting.empty()) parts.push_back(NamedRanks(exiting) + " exited");
    if (!asked.empty()) parts.push_back(NamedRanks(asked) + " called shutdown()");
    std::string why = "collectives was shut down: ";
    for (size_t i = 0; i < parts.size(); ++i) why += (i ? " and " : "") + parts[i];
    info.reason = Status::Error(StatusCode::SHUT_DOWN, why);
    // Pending operations fail with the precise reason too (this rank's own shutdown() says so).
    if (!stop_request_.asked()) stopped_status_ = info.reason;
  }
  stop_info_ = info;
}

}  // namespace collectives
