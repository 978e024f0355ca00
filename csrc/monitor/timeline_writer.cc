#include "monitor/timeline_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "common/thread_name.h"

namespace collectives {

Status TimelineWriter::Open(const std::string& path, const std::string& header) {
  Close();
  // O_CLOEXEC: a program the process starts does not inherit the file.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return Status::Error(StatusCode::INVALID_ARGUMENT,
                         "cannot open timeline file '" + path + "': " + std::strerror(errno));
  fd_ = fd;
  path_ = path;
  write_failed_ = false;
  Write(header);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.clear();
    stop_ = false;
  }
  thread_ = std::thread(&TimelineWriter::Loop, this);
  return Status::Ok();
}

void TimelineWriter::Push(std::string event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(event));
  }
  cv_.notify_one();
}

void TimelineWriter::Close() {
  if (fd_ < 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();  // it writes what was queued before it returns
  Write("\n]\n");
  ::close(fd_);
  fd_ = -1;
}

void TimelineWriter::Write(const std::string& text) {
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

void TimelineWriter::Loop() {
  NameThisThread("coll-timeline");
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
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
    if (stop_ && queue_.empty()) return;
  }
}

}  // namespace collectives
