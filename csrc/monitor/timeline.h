// Chrome-trace (JSON array) timeline written by rank 0, with Horovod's event names: per
// tensor a NEGOTIATE_<OP> phase, then the <OP> phase with activities such as
// MEMCPY_IN_FUSION_BUFFER / MPI_ALLREDUCE / MEMCPY_OUT_FUSION_BUFFER. Events are
// formatted (recorded) here on the engine thread and written by TimelineWriter's thread
// (timeline_writer.h). Opens in Perfetto and chrome://tracing.
//
// Stop() returns only once the file is complete JSON, whichever thread calls it and whatever
// else stops or starts the timeline meanwhile (a user thread, another one, the engine's
// teardown): the user reads the file right after.
#pragma once
#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "monitor/timeline_writer.h"

namespace collectives {

class Timeline {
 public:
  ~Timeline() { Stop(); }
  Status Start(const std::string& path, bool mark_cycles);
  void Stop();
  bool active() const { return active_; }
  bool mark_cycles() const { return mark_cycles_; }

  void Begin(const std::string& tensor, const std::string& event);  // phase or activity start
  void End(const std::string& tensor);                              // closes the innermost one
  void MarkCycle();

 private:
  int Pid(const std::string& tensor);  // mu_ held
  int64_t Now() const;
  void StopLocked();  // holds control_mu_

  // Held through a whole Start() or Stop(): a Stop() that finds another one under way waits for
  // it to finish the file instead of returning at once.
  std::mutex control_mu_;
  std::mutex mu_;  // guards the fields below against Start/Stop from a user thread
  TimelineWriter writer_;
  bool active_ = false;
  bool mark_cycles_ = false;
  std::chrono::steady_clock::time_point start_;
  std::unordered_map<std::string, int> pids_;
  std::unordered_map<std::string, int> open_;  // B events not yet closed, per tensor
};

}  // namespace collectives
