// A crash inside the MPI library reported as one line and an exit status, not a bare signal.
//
// MPICH 5.0.2's ch4 device (the `mpich` wheel, UCX netmod) dereferences a null request when a
// send to a peer whose connection has failed fails at once: MPIDI_UCX_send (ucx_send.h) returns
// ucp_tag_send_nbx's error ("**ucx_nm_rq_error") without a request, and its caller, inlined into
// libmpi.so.12 just after the call, stores 0 at offset 0x110 of *request regardless of the error.
// A surviving rank then dies by SIGSEGV (pc libmpi.so.12+0x41e057, address 0x110) inside
// MPI_Isend (the engine's wake messages) or inside MPI_Test progressing a collective (seen when a
// peer host crashed, its pod died, or a peer's connections were cut). Nothing of ours can stop
// that send: it is MPICH's own step of the collective. What we control is what the user sees:
// the launcher's "KILLED BY SIGNAL: 11", and nothing else, hid that the cause was a lost peer.
//
// So, once per process after MPI is initialized, a SIGSEGV/SIGBUS handler is installed that
// looks at the faulting instruction: inside the MPI library or its transports (libmpi*, UCX's
// libuc*, libfabric, Open MPI's libopen-*), it writes one line
//   [collectives FATAL rank R] crashed inside the MPI library (SIGSEGV at libmpi.so.12+0x41e057,
//   thread coll-engine): ...
// and ends the process with kMpiCrashExitCode (nothing else runs: MPI's state is broken). A
// fault anywhere else goes to the handler that was there before (Python's faulthandler, the
// default core dump), untouched.
#pragma once

namespace collectives {

// The exit status of a rank whose MPI library crashed (the watchdog's is 75).
constexpr int kMpiCrashExitCode = 76;

// Installs the handler (once per process; any thread) and sets the rank its line names.
void ReportCrashesInMpi(int rank);

}  // namespace collectives
