// A watchdog for backend calls that never return, after c10d's: a peer that crashed without its
// kernel closing the connections, or a link that went down, leaves a blocking MPI call waiting
// forever, and such a call cannot be interrupted. The engine thread marks each blocking call it
// enters and leaves (a few atomic stores: no lock, no system call); a thread of the watchdog's
// own looks about once a second. When one call has lasted longer than the limit it reports the
// call once -- which call, which tensor, the process set's other ranks and their hosts -- to the
// owner (the engine fails its handles), and after a grace period ends the process with _exit:
// the engine thread can never return, so nothing that might wait for it (MPI_Finalize, atexit
// handlers, static destructors) may run.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace collectives {

// The exit status of a process the watchdog ended: EX_TEMPFAIL (sysexits.h), a failure that a
// restart may cure. collectives/launcher/supervise.py knows it too.
constexpr int kWatchdogExitCode = 75;

// The blocking backend calls the engine marks.
enum class BackendCall : uint8_t {
  NONE = 0,
  NEGOTIATION_ALLREDUCE,  // phase 1 of every cycle
  NEGOTIATION_SHARED,     // the same through shared memory (a job on one host: shared_exchange.h)
  NEGOTIATION_GATHER,     // phase 2: requests to the coordinator
  NEGOTIATION_BCAST,      // phase 2: the coordinator's responses
  ALLREDUCE,
  BROADCAST,
  ALLGATHER,
  ALLTOALL,
  REDUCESCATTER,
  PROCESS_SET_SPLIT,      // MPI_Comm_split for a new process set
  SHUTDOWN_EXCHANGE,      // the allgather of shutdown()
};

// "MPI_Allreduce of the negotiation" and the like.
const char* BackendCallName(BackendCall call);

// The blocking call the engine thread is inside, if any: written by the engine thread (Enter,
// Leave), read by the watchdog's thread seqlock-style (count, Read) without a lock.
class CurrentCall {
 public:
  struct Snapshot {
    BackendCall call = BackendCall::NONE;
    int32_t set = 0;
    int fused = 1;
    std::string tensor;
  };

  void Enter(BackendCall call, int32_t set, const std::string* tensor, int fused) noexcept;
  void Leave() noexcept {
    // Even again (and no change when not inside a call).
    calls_.store((calls_.load(std::memory_order_relaxed) + 1) & ~uint64_t{1}, std::memory_order_release);
  }
  // Odd while inside a call; each Enter and Leave adds one.
  uint64_t count() const { return calls_.load(std::memory_order_acquire); }
  // The call that `calls` (a count()) numbered; false when it ended meanwhile.
  bool Read(uint64_t calls, Snapshot* out) const;

 private:
  static constexpr int kLabelWords = 8;  // the tensor name, truncated to 63 bytes
  static constexpr int kHasLabelBit = 56;  // in site_: the call has a tensor name

  // The call's description is written before the odd count is published.
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> site_{0};  // call | set << 8 | min(fused, 65535) << 40 | has label << 56
  std::atomic<uint64_t> label_[kLabelWords] = {};
};

class Watchdog {
 public:
  // Called once, on the watchdog's thread, with the line it logged; must not block.
  using OnStall = std::function<void(const std::string& message)>;

  Watchdog() = default;
  ~Watchdog() { Stop(); }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // limit_s <= 0: never fires (no thread is started). hosts[r]: global rank r's host name.
  void Start(double limit_s, double grace_s, int rank, std::vector<std::string> hosts, OnStall on_stall);
  // Joins the thread. Once it has fired the process is ending: Stop then waits for the exit.
  void Stop();

  // Process sets, so that a report can name the peers (rare: under a lock).
  void AddSet(int32_t id, const std::vector<int>& ranks);
  void RemoveSet(int32_t id);

  // Engine thread only, around a blocking backend call. `tensor`: the (first) tensor's name, or
  // null; `fused`: how many tensors share the call.
  void Enter(BackendCall call, int32_t set, const std::string* tensor = nullptr, int fused = 1) noexcept {
    current_.Enter(call, set, tensor, fused);
  }
  void Leave() noexcept { current_.Leave(); }

  // Runs `f` (one blocking call) marked.
  template <typename F>
  auto Watch(BackendCall call, int32_t set, F&& f) {
    Enter(call, set);
    auto result = f();
    Leave();
    return result;
  }

 private:
  void Run();
  std::string Describe(const CurrentCall::Snapshot& s) const;  // mu_ held
  std::string Peers(int32_t set) const;                        // mu_ held

  CurrentCall current_;  // the engine thread's blocking call, read without a lock

  double limit_s_ = 0, grace_s_ = 0;
  int rank_ = 0;
  std::vector<std::string> hosts_;
  OnStall on_stall_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::map<int32_t, std::vector<int>> sets_;
  std::thread thread_;
};

// Marks one blocking call for the duration of a scope.
class WatchedCall {
 public:
  WatchedCall(Watchdog& dog, BackendCall call, int32_t set, const std::string* tensor = nullptr, int fused = 1)
      : dog_(dog) {
    dog_.Enter(call, set, tensor, fused);
  }
  ~WatchedCall() { dog_.Leave(); }
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

 private:
  Watchdog& dog_;
};

}  // namespace collectives
