// A caller waiting for its own result runs the negotiation cycles itself while the engine thread
// is idle. A synchronous small allreduce then costs no thread hand-off: without this, the engine
// thread had to be woken for the request (about 10 us on the 2-core VM) and the caller woken for
// the result (about 7 us), and on every rank, so the negotiation also waited for the slowest
// peer's hand-off (docs/performance-history.md). Any thread may run a cycle, since a cycle is defined by the
// order of cycles on each rank, not by the thread: the cycle driver's cycle_mu makes sure one
// runs at a time, and MPI is initialized with MPI_THREAD_MULTIPLE. The cycles themselves run in
// CycleDriver::RunCyclesInline (cycle_driver.cc).
//
// Not for GPU tensors: the CUDA context and the NCCL completion logic belong to the engine thread.
#include <algorithm>
#include <chrono>

#include "core/engine_requests.h"

namespace collectives {

bool EngineRequests::Wait(int64_t handle, bool first, std::chrono::milliseconds timeout, bool run_cycles) {
  if (shared_.lifetime.forked_child()) return true;
  const auto until = Clock::now() + timeout;
  bool done = false;
  if (run_cycles && driver_.CallerMayRunCycles() && !sink_.handles().Poll(handle))
    done = driver_.RunCyclesInline(sink_.handles(), handle, until);
  if (!done) {
    // The engine thread runs the cycle (it was busy, or the wait ran out): Enqueue did not wake
    // it for a caller that waits, so do it now.
    {
      std::lock_guard<std::mutex> lock(shared_.mu);
      shared_.queue.Unclaim();
    }
    wakeups_.Ring();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    done = sink_.handles().Wait(handle, first && wakeups_.spin(), std::max(left, std::chrono::milliseconds(0)));
  }
  if (done && monitors_.stages_on) monitors_.stages.RecordWaitReturned();
  return done;
}

}  // namespace collectives
