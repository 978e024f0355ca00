// The timeline's file (timeline.h): the JSON array's opening and closing, and a writer thread
// that writes the events queued by the engine thread, so that file I/O never stalls
// communication. Written with write(2), never through a stdio buffer: a child forked while
// events sat in such a buffer wrote them into the file a second time when it exited normally
// (exit() flushes every stdio stream), which broke the JSON.
//
// Locking: Push from any thread (its own lock); Open and Close by one thread at a time (the
// timeline's control lock), Close only after the last Push.
#pragma once
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.h"

namespace collectives {

class TimelineWriter {
 public:
  ~TimelineWriter() { Close(); }
  // Opens (truncates) `path`, writes the array's opening `header` and starts the writer thread.
  Status Open(const std::string& path, const std::string& header);
  // One event, written after the ones pushed before it.
  void Push(std::string event);
  // Writes what was pushed, closes the array and the file; nothing when not open.
  void Close();

 private:
  void Loop();
  void Write(const std::string& text);  // the writer thread, or Open/Close while it is not running

  std::mutex mu_;  // guards queue_ and stop_
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  bool stop_ = false;
  std::thread thread_;
  int fd_ = -1;
  bool write_failed_ = false;  // reported once per file
  std::string path_;
};

}  // namespace collectives
