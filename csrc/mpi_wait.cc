#include "mpi_wait.h"

#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "spin.h"

namespace collectives {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> g_spin{true};
thread_local const std::atomic<bool>* t_abort = nullptr;

bool Aborted() { return t_abort && t_abort->load(std::memory_order_relaxed); }

// The yielding phase: this long for any call, plus the time the data would take at a slow
// shared-memory copy rate (so that a large message's transfer finishes before anyone sleeps;
// 64 MiB allreduces ran at 2.5-4 GB/s on the 2-core VM). A yielding thread leaves the core to
// any other that can run, so the phase costs a busy machine little; it is long enough for a
// negotiation between hosts, whose round trips outlast 100 us: with 100 us here, a 1 MiB
// allreduce across 2 simulated hosts went from 0.99x to 1.06x raw MPI's time, the sleeps adding
// up (benchmarks/hierarchical_bench_hosts.py).
constexpr auto kYieldBase = std::chrono::milliseconds(2);
constexpr double kSlowBytesPerMicrosecond = 2000.0;  // 2 GB/s
// How often the machine's load is looked at (a read of /proc/loadavg costs microseconds).
constexpr auto kLoadCheckInterval = std::chrono::milliseconds(20);
// Sleeps between polls afterwards: the first, and the bound they double up to. The bound is
// the most a sleeping rank delays a peer that arrives late, per protocol step.
constexpr auto kFirstSleep = std::chrono::microseconds(20);
constexpr auto kLongestSleep = std::chrono::microseconds(250);

int TypeBytes(MPI_Datatype type) {
  int size = 0;
  MPI_Type_size(type, &size);
  return size;
}

// True when the threads ready to run, besides this one, fill every core (the kernel's
// instantaneous count, the 4th field of /proc/loadavg: "running/total"). Then a core this thread
// holds while waiting is a core taken from compute, so waits skip their pure spin and start
// yielding at once. (Sleeping at once, tried first, made an 8 B allreduce take 0.6-0.8 ms at load
// average 10, against 60-80 us with this yielding wait at load 6: a yield gives the core away
// only to a thread that is ready to run on it, and costs nothing to wait for when none is.)
// Cached for kLoadCheckInterval.
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
    if (std::fscanf(f, "%lf %lf %lf %ld/%ld", &l1, &l5, &l15, &running, &total) == 5) busy = running - 1 >= cores;
    std::fclose(f);
  }
  oversubscribed.store(busy, std::memory_order_relaxed);
  return busy;
}

}  // namespace

void SetMpiWaitSpin(bool spin) { g_spin.store(spin, std::memory_order_relaxed); }

void SetWaitAbort(const std::atomic<bool>* abort) { t_abort = abort; }

int WaitForRequest(MPI_Request* request, int64_t bytes) {
  int done = 0;
  int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS || done) return rc;
  const auto start = Clock::now();
  const bool oversubscribed = MachineOversubscribed();
  if (g_spin.load(std::memory_order_relaxed) && !oversubscribed) {
    const auto spin_until = start + kSpin;
    do {
      rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS || done) return rc;
    } while (Clock::now() < spin_until);
  }
  const auto yield_until =
      start + kYieldBase +
      std::chrono::microseconds(static_cast<int64_t>(static_cast<double>(bytes) / kSlowBytesPerMicrosecond));
  do {
    sched_yield();
    rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || done) return rc;
    if (Aborted()) return MPI_ERR_OTHER;
  } while (Clock::now() < yield_until);
  // Linux stretches a sleep by the thread's timer slack (50 us by default), which would more than
  // double the short sleeps; this thread's wakeups are worth the precision.
  static thread_local bool slack_set = prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0) == 0;
  (void)slack_set;
  auto sleep = std::chrono::duration_cast<Clock::duration>(kFirstSleep);
  while (true) {
    std::this_thread::sleep_for(sleep);
    rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || done) return rc;
    if (Aborted()) return MPI_ERR_OTHER;
    sleep = std::min<Clock::duration>(sleep * 2, kLongestSleep);
  }
}

int AllreduceWaiting(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc = MPI_Iallreduce(send, recv, count, type, op, comm, &request);
  if (rc != MPI_SUCCESS) return rc;
  return WaitForRequest(&request, static_cast<int64_t>(count) * TypeBytes(type));
}

#if MPI_VERSION >= 4
int AllreduceWaitingC(const void* send, void* recv, MPI_Count count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc = MPI_Iallreduce_c(send, recv, count, type, op, comm, &request);
  if (rc != MPI_SUCCESS) return rc;
  return WaitForRequest(&request, static_cast<int64_t>(count) * TypeBytes(type));
}
#endif

}  // namespace collectives
