#include "monitor/watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "common/log.h"
#include "common/rank_list.h"
#include "common/thread_name.h"

namespace collectives {
namespace {

// A report names at most this many hosts; a job of thousands of ranks still gets one line.
constexpr size_t kMaxHostsNamed = 8;

std::string Seconds(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

}  // namespace

const char* BackendCallName(BackendCall call) {
  switch (call) {
    case BackendCall::NEGOTIATION_ALLREDUCE: return "MPI_Allreduce of the negotiation (which tensors every rank has ready)";
    case BackendCall::NEGOTIATION_SHARED:
      return "the negotiation's exchange through shared memory (which tensors every rank has ready)";
    case BackendCall::NEGOTIATION_GATHER: return "MPI_Gather of the negotiation (requests to the coordinator, rank 0)";
    case BackendCall::NEGOTIATION_BCAST: return "MPI_Bcast of the negotiation (the coordinator's responses)";
    case BackendCall::ALLREDUCE: return "MPI_Allreduce";
    case BackendCall::BROADCAST: return "MPI_Bcast";
    case BackendCall::ALLGATHER: return "MPI_Allgatherv";
    case BackendCall::ALLTOALL: return "MPI_Alltoallv";
    case BackendCall::REDUCESCATTER: return "MPI_Reduce_scatter";
    case BackendCall::PROCESS_SET_SPLIT: return "MPI_Comm_split for a new process set";
    case BackendCall::SHUTDOWN_EXCHANGE: return "the exchange of shutdown() (MPI_Allgather)";
    case BackendCall::NONE: break;
  }
  return "a backend call";
}

void CurrentCall::Enter(BackendCall call, int32_t set, const std::string* tensor, int fused) noexcept {
  // Keeps the stores below after the previous Leave's for a reader that sees them (Read).
  std::atomic_thread_fence(std::memory_order_release);
  const uint64_t f = static_cast<uint64_t>(std::min(std::max(fused, 1), 65535));
  site_.store(static_cast<uint64_t>(call) | static_cast<uint64_t>(static_cast<uint32_t>(set)) << 8 | f << 40 |
                  static_cast<uint64_t>(tensor != nullptr) << kHasLabelBit,
              std::memory_order_relaxed);
  if (tensor) {
    uint64_t words[kLabelWords] = {};
    std::memcpy(words, tensor->data(), std::min(tensor->size(), sizeof(words) - 1));
    for (int i = 0; i < kLabelWords; ++i) label_[i].store(words[i], std::memory_order_relaxed);
  }
  // Odd: inside a call (a new call even if a Leave was missed).
  calls_.store((calls_.load(std::memory_order_relaxed) + 1) | 1, std::memory_order_release);
}

bool CurrentCall::Read(uint64_t calls, Snapshot* out) const {
  const uint64_t site = site_.load(std::memory_order_relaxed);
  uint64_t words[kLabelWords];
  for (int i = 0; i < kLabelWords; ++i) words[i] = label_[i].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (calls_.load(std::memory_order_relaxed) != calls) return false;  // the call ended meanwhile
  out->call = static_cast<BackendCall>(site & 0xff);
  out->set = static_cast<int32_t>(static_cast<uint32_t>(site >> 8));
  out->fused = static_cast<int>((site >> 40) & 0xffff);
  char name[sizeof(words)];
  std::memcpy(name, words, sizeof(words));
  name[sizeof(name) - 1] = '\0';
  out->tensor = (site >> kHasLabelBit) & 1 ? name : "";
  return true;
}

void Watchdog::Start(double limit_s, double grace_s, int rank, std::vector<std::string> hosts, OnStall on_stall) {
  Stop();
  std::lock_guard<std::mutex> lock(mu_);
  limit_s_ = limit_s;
  grace_s_ = grace_s;
  rank_ = rank;
  hosts_ = std::move(hosts);
  on_stall_ = std::move(on_stall);
  stop_ = false;
  if (limit_s_ > 0) thread_ = std::thread(&Watchdog::Run, this);
}

void Watchdog::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::AddSet(int32_t id, const std::vector<int>& ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  sets_[id] = ranks;
}

void Watchdog::RemoveSet(int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  sets_.erase(id);
}

void Watchdog::Run() {
  NameThisThread("coll-watchdog");
  using Clock = std::chrono::steady_clock;
  // A call is seen at most one check after it began: checks every second, more often for the
  // short limits of tests.
  const auto check = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::min(1.0, std::max(0.05, limit_s_ / 4))));
  const auto limit = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit_s_));
  uint64_t watched = 0;  // the call being timed (odd), 0: none
  Clock::time_point since;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait_for(lock, check, [this] { return stop_; });
    if (stop_) return;
    const uint64_t calls = current_.count();
    const auto now = Clock::now();
    if (!(calls & 1)) {
      watched = 0;
      continue;
    }
    if (calls != watched) {
      watched = calls;
      since = now;
      continue;
    }
    CurrentCall::Snapshot s;
    if (now - since < limit || !current_.Read(calls, &s)) continue;
    const std::string message = Describe(s);
    lock.unlock();
    Log(LogLevel::FATAL, message);
    if (on_stall_) on_stall_(message);
    // Time for the threads blocked in synchronize() to raise and report; then the process ends
    // without running anything that could wait for the stuck thread.
    std::this_thread::sleep_for(std::chrono::duration<double>(grace_s_));
    _exit(kWatchdogExitCode);
  }
}

std::string Watchdog::Describe(const CurrentCall::Snapshot& s) const {
  std::ostringstream os;
  // collectives/launcher/supervise.py recognises reports by this start.
  os << "stalled in a backend call: " << BackendCallName(s.call);
  if (!s.tensor.empty()) {
    os << " of tensor '" << s.tensor << "'";
    if (s.fused > 1) os << " and " << s.fused - 1 << " more fused with it";
  }
  if (s.set != 0) os << " in process set " << s.set;
  os << " has not returned after " << Seconds(limit_s_) << " s, waiting on " << Peers(s.set)
     << ". One of them has failed, is stopped, or lost its network link; pending operations fail with "
     << "StallTimeoutError and, since the call cannot be interrupted, this process exits with status "
     << kWatchdogExitCode << " within " << Seconds(grace_s_) << " s (COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS sets "
     << "the limit)";
  return os.str();
}

std::string Watchdog::Peers(int32_t set) const {
  auto it = sets_.find(set);
  if (it == sets_.end()) return "the other ranks of process set " + std::to_string(set);
  // The other members, grouped by host in order of rank.
  std::vector<std::pair<std::string, std::vector<int>>> by_host;
  size_t peers = 0;
  for (int r : it->second) {
    if (r == rank_) continue;
    ++peers;
    const std::string host = r >= 0 && static_cast<size_t>(r) < hosts_.size() ? hosts_[static_cast<size_t>(r)] : "";
    auto group = std::find_if(by_host.begin(), by_host.end(), [&](const auto& g) { return g.first == host; });
    if (group == by_host.end()) {
      by_host.push_back({host, {}});
      group = by_host.end() - 1;
    }
    group->second.push_back(r);
  }
  if (peers == 0) return "no other rank";
  std::ostringstream os;
  os << (peers == 1 ? "rank " : "ranks ");
  size_t named = 0;
  for (const auto& g : by_host) {
    if (named == kMaxHostsNamed) {
      size_t rest = 0;
      for (size_t i = named; i < by_host.size(); ++i) rest += by_host[i].second.size();
      os << " and " << rest << " more on " << by_host.size() - named << " more hosts";
      break;
    }
    os << (named ? "; " : "") << RankRanges(g.second);
    if (!g.first.empty()) os << " on " << g.first;
    ++named;
  }
  return os.str();
}

}  // namespace collectives
