// A caller waiting for its own result runs the negotiation cycles itself while the engine thread
// is idle. A synchronous small allreduce then costs no thread hand-off: without this, the engine
// thread had to be woken for the request (about 10 us on the 2-core VM) and the caller woken for
// the result (about 7 us), and on every rank, so the negotiation also waited for the slowest
// peer's hand-off (README "Latency"). Any thread may run a cycle, since a cycle is defined by the
// order of cycles on each rank, not by the thread: cycle_mu_ makes sure one runs at a time, and
// MPI is initialized with MPI_THREAD_MULTIPLE.
//
// Not for GPU tensors: the CUDA context and the NCCL completion logic belong to the engine thread.
#include <chrono>

#include "core/engine.h"
#include "backends/mpi/mpi_wait.h"

namespace collectives {

bool Engine::Wait(int64_t handle, bool first, std::chrono::milliseconds timeout, bool run_cycles) {
  if (forked_child()) return true;
  const auto until = Clock::now() + timeout;
  bool done = false;
  if (run_cycles && CallerMayRunCycles() && !sink_.handles().Poll(handle)) done = RunCyclesInline(handle, until);
  if (!done) {
    // The engine thread runs the cycle (it was busy, or the wait ran out): Enqueue did not wake
    // it for a caller that waits, so do it now.
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.Unclaim();
    }
    bell_.RingOwn();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    done = sink_.handles().Wait(handle, first && spin_, std::max(left, std::chrono::milliseconds(0)));
  }
  if (done && monitors_.stages_on) monitors_.stages.RecordWaitReturned();
  return done;
}

bool Engine::RunCyclesInline(int64_t handle, Clock::time_point until) {
  std::unique_lock<std::mutex> cycle(cycle_mu_, std::try_to_lock);
  if (!cycle.owns_lock()) return false;  // the engine thread is in a cycle: it will finish ours
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.Unclaim();  // ours now: this thread's WaitForCycle sees them as local work
  }
  SetWaitAbort(&abort_inline_);
  while (!cycles_over_ && !abort_inline_ && !sink_.handles().Poll(handle) && Clock::now() < until) {
    WaitForCycle(cycle, until);
    if (cycles_over_ || Clock::now() >= until) break;
    bool declined = false;
    const bool go_on = RunCycle(&active_, &declined);
    if (declined) break;  // GPU work: the engine thread's
    ++monitors_.inline_cycles;
    caller_ran_last_ = true;
    if (!go_on) cycles_over_ = true;  // the engine thread tears down
  }
  SetWaitAbort(nullptr);
  // Work left here (other threads' submissions, or the engine's end) is the engine thread's again:
  // wake it rather than leave it to its next poll.
  bool left = cycles_over_ || negotiator_.has_work() || gpu_device_ >= 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left = left || queue_.HasUnclaimed();
  }
  cycle.unlock();
  if (left) bell_.RingOwn();
  return sink_.handles().Poll(handle);
}

}  // namespace collectives
