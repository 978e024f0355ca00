#include "monitor/timeline.h"

#include <sstream>

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
  Stop();
  std::lock_guard<std::mutex> lock(mu_);
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) return Status::Error(StatusCode::INVALID_ARGUMENT, "cannot open timeline file '" + path + "'");
  start_ = std::chrono::steady_clock::now();
  const int64_t epoch_us = std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::system_clock::now().time_since_epoch()).count();
  std::fprintf(file_,
               "[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, \"args\": {\"name\": "
               "\"collectives\", \"start_time_since_epoch_in_micros\": %lld}}",
               static_cast<long long>(epoch_us));
  pids_.clear();
  open_.clear();
  mark_cycles_ = mark_cycles;
  stop_writer_ = false;
  active_ = true;
  writer_ = std::thread(&Timeline::WriterLoop, this);
  return Status::Ok();
}

void Timeline::Stop() {
  std::thread writer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!active_) return;
    active_ = false;
    stop_writer_ = true;
    writer.swap(writer_);
  }
  cv_.notify_all();
  if (writer.joinable()) writer.join();
  std::lock_guard<std::mutex> lock(mu_);
  std::fprintf(file_, "\n]\n");
  std::fclose(file_);
  file_ = nullptr;
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
    std::FILE* f = file_;
    lock.unlock();
    for (const std::string& e : batch) {
      std::fputs(",\n", f);
      std::fputs(e.c_str(), f);
    }
    std::fflush(f);
    lock.lock();
    if (stop_writer_ && queue_.empty()) return;
  }
}

}  // namespace collectives
