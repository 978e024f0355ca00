#include "backends/mpi/mpi_wait.h"

#include <atomic>
#include <chrono>

#include "wait/wait_policy.h"

namespace collectives {
namespace {

thread_local const std::atomic<bool>* t_abort = nullptr;

bool Aborted() { return t_abort && t_abort->load(std::memory_order_relaxed); }

// The yielding phase on a machine with a core to spare: this long for any call, plus the time
// the data would take at a slow shared-memory copy rate (so that a large message's transfer
// finishes before anyone sleeps; 64 MiB allreduces ran at 2.5-4 GB/s on the 2-core VM). A
// yielding thread leaves the core to any other that can run, so the phase costs a quiet machine
// little; it is long enough for a negotiation between hosts, whose round trips outlast 100 us:
// with 100 us here, a 1 MiB allreduce across 2 simulated hosts went from 0.99x to 1.06x raw
// MPI's time, the sleeps adding up (benchmarks/hierarchical_bench_hosts.py).
constexpr auto kYieldBase = std::chrono::milliseconds(2);
constexpr double kSlowBytesPerMicrosecond = 2000.0;  // 2 GB/s

WaitPhases PhasesFor(int64_t bytes) {
  WaitPhases p;
  p.spin = std::chrono::microseconds(50);
  const auto transfer = std::chrono::microseconds(static_cast<int64_t>(static_cast<double>(bytes) / kSlowBytesPerMicrosecond));
  p.yield = kYieldBase + transfer;
  // A machine whose cores are all taken: a yield loop there keeps taking a contended core (see
  // wait_policy.h), so the wait blocks in the kernel after a few yields, but not while the data
  // itself could still be moving: MPICH moves a transfer only inside MPI calls, so a rank asleep
  // between protocol steps holds its peer back. With 20 us here for every size, the gradients'
  // allreduces of an MLP step overlapping its backward pass on 2 busy cores slept between steps:
  // the step's overhead over no communication was 9.6 ms against 6.75 ms with this (medians of 3
  // peer_bench runs; round 1's engine: 6.1 ms; noisy: a later kit run measured 9.3 ms with this).
  p.yield_oversubscribed = std::chrono::microseconds(20) + transfer;
  // The sleeps' bound is the most a sleeping rank delays a peer that arrives late, per protocol
  // step (MPICH has no progress thread here: a nonblocking collective moves only inside MPI calls).
  p.first_sleep = std::chrono::microseconds(20);
  p.longest_sleep = std::chrono::microseconds(250);
  return p;
}

int TypeBytes(MPI_Datatype type) {
  int size = 0;
  MPI_Type_size(type, &size);
  return size;
}

}  // namespace

void SetWaitAbort(const std::atomic<bool>* abort) { t_abort = abort; }

bool WaitAborted() { return Aborted(); }

int WaitForRequest(MPI_Request* request, int64_t bytes) {
  int done = 0;
  int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS || done) return rc;
  Waiter waiter(PhasesFor(bytes));
  while (true) {
    waiter.Pause();  // a policy with sleep never ends its phases
    rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || done) return rc;
    if (Aborted()) return MPI_ERR_OTHER;
  }
}

int AllreduceWaiting(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc = MPI_Iallreduce(send, recv, count, type, op, comm, &request);
  if (rc != MPI_SUCCESS) return rc;
  return WaitForRequest(&request, static_cast<int64_t>(count) * TypeBytes(type));
}

}  // namespace collectives
