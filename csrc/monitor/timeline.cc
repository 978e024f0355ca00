#include "monitor/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "common/log.h"
#include "common/thread_name.h"

namespace collectives {
namespace {

std::string JsonString(const std::string& s) {
  std::ostringstream os;
  os << '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      os << '\\' << c;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      os << buf;
    } else {
      os << c;
    }
  }
  os << '"';
  return os.str();
}

}  // namespace

Status Timeline::Start(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> control(control_mu_);
  StopLocked();
  // O_CLOEXEC: a program the process starts does not inherit the file.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return Status::Error(StatusCode::INVALID_ARGUMENT,
                         "cannot open timeline file '" + path + "': " + std::strerror(errno));
  std::lock_guard<std::mutex> lock(mu_);
  fd_ = fd;
  path_ = path;
  write_failed_ = false;
  start_ = std::chrono::steady_clock::now();
  const int64_t epoch_us = std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::system_clock::now().time_since_epoch()).count();
  Write("[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, \"args\": {\"name\": "
        "\"collectives\", \"start_time_since_epoch_in_micros\": " +
        std::to_string(epoch_us) + "}}");
  pids_.clear();
  open_.clear();
  mark_cycles_ = mark_cycles;
  stop_writer_ = false;
  active_ = true;
  writer_ = std::thread(&Timeline::WriterLoop, this);
  return Status::Ok();
}

void Timeline::Stop() {
  std::lock_guard<std::mutex> control(control_mu_);
  StopLocked();
}

void Timeline::StopLocked() {
  std::thread writer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!active_) return;
    active_ = false;
    stop_writer_ = true;
    writer.swap(writer_);
  }
  cv_.notify_all();
  if (writer.joinable()) writer.join();  // it writes what was queued before it returns
  Write("\n]\n");
  ::close(fd_);
  fd_ = -1;
}

void Timeline::Write(const std::string& text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (!write_failed_)
        Log(LogLevel::WARNING, "timeline: writing '" + path_ + "' failed (" +
                                   (n < 0 ? std::string(std::strerror(errno)) : "nothing written") +
                                   "); the file is incomplete");
      write_failed_ = true;
      return;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

int64_t Timeline::Now() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start_).count();
}

int Timeline::Pid(const std::string& tensor) {
  auto it = pids_.find(tensor);
  if (it != pids_.end()) return it->second;
  const int pid = static_cast<int>(pids_.size()) + 1;
  pids_.emplace(tensor, pid);
  std::ostringstream os;
  os << "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << pid << ", \"tid\": 0, \"args\": {\"name\": "
     << JsonString(tensor) << "}},\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " << pid
     << ", \"tid\": 0, \"args\": {\"sort_index\": " << pid << "}}";
  queue_.push_back(os.str());
  return pid;
}

void Timeline::Push(std::string event) {
  queue_.push_back(std::move(event));
  cv_.notify_one();
}

void Timeline::Begin(const std::string& tensor, const std::string& event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_) return;
  ++open_[tensor];
  std::ostringstream os;
  os << "{\"name\": " << JsonString(event) << ", \"ph\": \"B\", \"ts\": " << Now() << ", \"pid\": " << Pid(tensor)
     << ", \"tid\": 0}";
  Push(os.str());
}

void Timeline::End(const std::string& tensor) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_) return;
  // A phase that began before the timeline started has no B event to close.
  auto it = open_.find(tensor);
  if (it == open_.end()) return;
  if (--it->second == 0) open_.erase(it);
  std::ostringstream os;
  os << "{\"ph\": \"E\", \"ts\": " << Now() << ", \"pid\": " << Pid(tensor) << ", \"tid\": 0}";
  Push(os.str());
}

void Timeline::MarkCycle() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_ || !mark_cycles_) return;
  std::ostringstream os;
  os << "{\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"g\", \"ts\": " << Now() << ", \"pid\": 0, \"tid\": 0}";
  Push(os.str());
}

void Timeline::WriterLoop() {
  NameThisThread("coll-timeline");
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_writer_ || !queue_.empty(); });
    std::deque<std::string> batch;
    batch.swap(queue_);
    lock.unlock();
    std::string text;  // one write per batch
    for (const std::string& e : batch) {
      text += ",\n";
      text += e;
    }
    Write(text);
    lock.lock();
    if (stop_writer_ && queue_.empty()) return;
  }
}

}  // namespace collectives
