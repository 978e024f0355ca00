#include "wait/wait_policy.h"

#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <thread>

namespace collectives {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> g_spin_allowed{true};
std::atomic<int32_t> g_process_waiters{0};
std::atomic<std::atomic<int32_t>*> g_host_waiters{&g_process_waiters};

constexpr auto kLoadCheckInterval = std::chrono::milliseconds(20);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace

void SetWaitSpinAllowed(bool allowed) { g_spin_allowed.store(allowed, std::memory_order_relaxed); }

void SetHostWaiters(std::atomic<int32_t>* counter) {
  g_host_waiters.store(counter != nullptr ? counter : &g_process_waiters);
}

bool MachineOversubscribed() {
  static std::atomic<int64_t> checked_at{0};
  static std::atomic<bool> oversubscribed{false};
  static const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  const int64_t now = Clock::now().time_since_epoch().count();
  if (now - checked_at.load(std::memory_order_relaxed) <
      std::chrono::duration_cast<Clock::duration>(kLoadCheckInterval).count())
    return oversubscribed.load(std::memory_order_relaxed);
  checked_at.store(now, std::memory_order_relaxed);
  bool busy = false;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    double l1, l5, l15;
    long running = 0, total = 0;
    if (std::fscanf(f, "%lf %lf %lf %ld/%ld", &l1, &l5, &l15, &running, &total) == 5) {
      const long waiting = std::max<long>(0, g_host_waiters.load()->load(std::memory_order_relaxed));
      busy = running - 1 - waiting >= cores;
    }
    std::fclose(f);
  }
  oversubscribed.store(busy, std::memory_order_relaxed);
  return busy;
}

Waiter::Waiter(const WaitPhases& phases)
    : phases_(phases), sleep_(std::chrono::duration_cast<Clock::duration>(phases.first_sleep)) {
  const auto start = Clock::now();
  const bool oversubscribed = MachineOversubscribed();
  const bool spin = g_spin_allowed.load(std::memory_order_relaxed) && !oversubscribed;
  spinning_ = spin && phases.spin.count() > 0;
  spin_until_ = start + (spin ? std::chrono::duration_cast<Clock::duration>(phases.spin) : Clock::duration::zero());
  const auto yield = oversubscribed ? phases.yield_oversubscribed : phases.yield;
  yield_until_ = spin_until_ + std::chrono::duration_cast<Clock::duration>(yield);
  if (yield_until_ > start) {
    counted_ = g_host_waiters.load();
    counted_->fetch_add(1, std::memory_order_relaxed);
  }
}

Waiter::~Waiter() { Uncount(); }

void Waiter::Uncount() {
  if (counted_ != nullptr) counted_->fetch_sub(1, std::memory_order_relaxed);
  counted_ = nullptr;
}

bool Waiter::Pause() {
  if (!sleeping_) {
    if (spinning_) {
      // The clock only every 64 looks: a look at shared memory costs nanoseconds.
      if (++pauses_ % 64 != 0 || Clock::now() < spin_until_) {
        CpuRelax();
        return true;
      }
      spinning_ = false;
    }
    if (Clock::now() < yield_until_) {
      sched_yield();
      return true;
    }
    Uncount();  // a thread that sleeps or blocks is not ready to run
    if (!phases_.sleep) return false;
    sleeping_ = true;
    // Linux stretches a sleep by the thread's timer slack (50 us by default), which would more
    // than double the short sleeps; a waiting thread's wakeups are worth the precision.
    static thread_local bool slack_set = prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0) == 0;
    (void)slack_set;
  }
  std::this_thread::sleep_for(sleep_);
  sleep_ = std::min<Clock::duration>(sleep_ * 2, std::chrono::duration_cast<Clock::duration>(phases_.longest_sleep));
  return true;
}

}  // namespace collectives
