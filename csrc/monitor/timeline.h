// Chrome-trace (JSON array) timeline written by rank 0, with Horovod's event names: per
// tensor a NEGOTIATE_<OP> phase, then the <OP> phase with activities such as
// MEMCPY_IN_FUSION_BUFFER / MPI_ALLREDUCE / MEMCPY_OUT_FUSION_BUFFER. Events are
// formatted on the engine thread and written by a writer thread, so file I/O never
// stalls communication. Opens in Perfetto and chrome://tracing.
//
// Stop() returns only once the file is complete JSON, whichever thread calls it and whatever
// else stops or starts the timeline meanwhile (a user thread, another one, the engine's
// teardown): the user reads the file right after. The file is written with write(2), never
// through a stdio buffer: a child forked while events sat in such a buffer wrote them into the
// file a second time when it exited normally (exit() flushes every stdio stream), which broke
// the JSON.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/status.h"

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
  int Pid(const std::string& tensor);
  int64_t Now() const;
  void Push(std::string event);
  void WriterLoop();
  void StopLocked();  // holds control_mu_
  void Write(const std::string& text);  // the writer thread, or Start/Stop while it is not running

  // Held through a whole Start() or Stop(): a Stop() that finds another one under way waits for
  // it to finish the file instead of returning at once.
  std::mutex control_mu_;
  std::mutex mu_;  // guards the fields below against Start/Stop from a user thread
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  std::thread writer_;
  int fd_ = -1;
  bool write_failed_ = false;  // reported once per file
  std::string path_;
  bool stop_writer_ = false;
  bool active_ = false;
  bool mark_cycles_ = false;
  std::chrono::steady_clock::time_point start_;
  std::unordered_map<std::string, int> pids_;
  std::unordered_map<std::string, int> open_;  // B events not yet closed, per tensor
};

}  // namespace collectives
