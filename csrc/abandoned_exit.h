// Process exit once an engine thread has been abandoned inside MPI (an init() timeout, or the
// watchdog's verdict on a backend call that never returns).
//
// That thread keeps running inside MPI and its transport (MPICH's UCX progress loop) until the
// process ends. After Python has finalized, exit() would run the C atexit handlers and the
// libraries' static destructors (UCX's, MPICH's, ours) while it still does: they take locks and
// tear down state that it holds and uses, and a process left that way once hung in exit() for
// good (stuck after its last line of output until the test's 120 s timeout killed it). So once
// a thread is abandoned, exit ends the process at its first exit handler instead, with the
// status the program exited with: stdio buffers are flushed, nothing else runs.
#pragma once

namespace collectives {

// Registers (once per process) the handler that ends the process at exit without teardown.
// Called wherever an engine is marked abandoned; safe from any thread.
void EndProcessWithoutTeardownAtExit();

}  // namespace collectives
