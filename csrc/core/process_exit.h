// How a process that ran the engine ends: MPI finalized at exit, within a bound; and, once an
// engine thread has been abandoned inside MPI, no teardown at all.
#pragma once

namespace collectives {

// Process exit once an engine thread has been abandoned inside MPI (an init() timeout, or the
// watchdog's verdict on a backend call that never returns).
//
// That thread keeps running inside MPI and its transport (MPICH's UCX progress loop) until the
// process ends. After Python has finalized, exit() would run the C atexit handlers and the
// libraries' static destructors (UCX's, MPICH's, ours) while it still does: they take locks and
// tear down state that it holds and uses. So once a thread is abandoned, exit ends the process
// at its first exit handler instead, with the status the program exited with: stdio buffers
// are flushed, nothing else runs. Registers that handler (once per process); any thread.
void EndProcessWithoutTeardownAtExit();

// The most seconds MPI_Finalize at this process's exit may wait (0: no limit). Set from
// COLLECTIVES_FINALIZE_TIMEOUT_SECONDS whenever an engine starts.
void SetFinalizeTimeout(double seconds);

// MPI_Finalize at exit (Py_AtExit: after the interpreter finalized). MPICH's finalize waits
// for every rank of the job to finalize too (a PMI barrier). A rank whose engine thread was
// abandoned inside MPI never does, and the launcher normally ends the waiting ranks when that
// one exits; once, in CI, it did not, and a rank waited there until the test's timeout. So the
// wait is bounded: past the limit this process says so on stderr and ends without finalizing
// (with its own exit status, as above), which the launcher treats as a rank that did not
// finalize.
void FinalizeMpiWithinTimeout();

// What decides whether MPI is finalized at this process's exit (any thread). MPI_Init_thread ran
// in an engine's Setup in this process; an engine of this process was abandoned inside MPI; a
// peer's init() gave up, so its process never finalizes (MPICH's MPI_Finalize here would wait for
// it until the finalize timeout).
void NoteMpiInitializedHere();
void NoteEngineAbandoned();
void NotePeerNeverFinalizes();
// An engine thread of this very process initialized MPI (not mpi4py's import; not the parent of a
// forked child, whose MPI_Finalize would run the parent's shutdown protocol with the launcher), no
// engine was abandoned inside MPI, and no peer is known never to finalize.
bool ProcessShouldFinalizeMpi();

}  // namespace collectives
