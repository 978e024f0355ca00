#include "monitor/timeline.h"

#include <cstdio>
#include <sstream>


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
  const int64_t epoch_us = std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::system_clock::now().time_since_epoch()).count();
  const auto start = std::chrono::steady_clock::now();
  Status st = writer_.Open(path, "[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, "
                                 "\"args\": {\"name\": \"collectives\", \"start_time_since_epoch_in_micros\": " +
                                     std::to_string(epoch_us) + "}}");
  if (!st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  start_ = start;
  pids_.clear();
  open_.clear();
  mark_cycles_ = mark_cycles;
  active_ = true;
  return Status::Ok();
}

void Timeline::Stop() {
  std::lock_guard<std::mutex> control(control_mu_);
  StopLocked();
}

void Timeline::StopLocked() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!active_) return;
    active_ = false;
  }
  writer_.Close();  // no event is pushed any more: every Push is under mu_ while active_
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
  writer_.Push(os.str());
  return pid;
}

void Timeline::Begin(const std::string& tensor, const std::string& event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_) return;
  ++open_[tensor];
  std::ostringstream os;
  os << "{\"name\": " << JsonString(event) << ", \"ph\": \"B\", \"ts\": " << Now() << ", \"pid\": " << Pid(tensor)
     << ", \"tid\": 0}";
  writer_.Push(os.str());
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
  writer_.Push(os.str());
}

void Timeline::MarkCycle() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_ || !mark_cycles_) return;
  std::ostringstream os;
  os << "{\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"g\", \"ts\": " << Now() << ", \"pid\": 0, \"tid\": 0}";
  writer_.Push(os.str());
}

}  // namespace collectives
