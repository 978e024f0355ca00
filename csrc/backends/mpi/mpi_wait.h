// Waiting for MPI without holding a core. MPICH's blocking calls poll its progress engine for
// as long as they wait: while one rank waits for a late peer, its engine thread takes a core
// from its own framework thread, from the other ranks and from a data loader. On a 2-core
// machine with one extra busy process, the engine thread of the early rank used more CPU than
// the rank's training thread (benchmarks/busy_machine_bench.py, docs/performance.md "A busy machine").
//
// The engine's long calls therefore start a nonblocking call and complete it here with MPI_Test,
// pausing between tests as wait_policy.h says: a short spin, then yielding for as long as the
// data itself could still be moving, then sleeping. MPICH has no progress thread here, so a
// nonblocking collective moves only inside MPI calls and a sleeping rank can hold its peers back
// by up to one sleep per protocol step; the yielding phase is sized from the message so that a
// transfer under way is never left waiting on a sleeper, and the sleeps' bound keeps the delay
// to a late rank's peers small.
#pragma once
#include <mpi.h>

#include <atomic>
#include <cstdint>

namespace collectives {

// This thread's waits give up, returning MPI_ERR_OTHER with the request left behind, once *abort
// turns true (null: never). A caller running the engine's cycle (engine_inline.cc) sets it, so that
// when the watchdog fires it returns to raise the watchdog's error instead of staying in MPI.
void SetWaitAbort(const std::atomic<bool>* abort);
// Whether this thread's waits should give up now (other waits honour it too: shared_exchange.h).
bool WaitAborted();

// Completes `request`, which moves about `bytes` per rank. Returns MPI_Test's code.
int WaitForRequest(MPI_Request* request, int64_t bytes);

// MPI_Allreduce, completed by WaitForRequest. `send` may be MPI_IN_PLACE.
int AllreduceWaiting(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm);

}  // namespace collectives
