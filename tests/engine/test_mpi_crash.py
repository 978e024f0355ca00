"""A peer lost mid-job must not kill a surviving rank by a bare SIGSEGV.

MPICH 5.0.2's ch4 device dereferences a null request when a send to a peer whose connection has
failed fails (csrc/backends/mpi/mpi_fault.h has the stack): the survivor died by signal 11 inside
MPI_Isend or MPI_Test, and the launcher's "signal 11" was all anyone saw of a lost peer. The engine
now turns a crash inside the MPI library into one line naming it and exit status 76.

Here on one machine: MPIR_CVAR_NOLOCAL=1 and UCX kept to TCP send every message over a socket,
and rank 1 (tests/engine/workers/peer_cut_worker.py) shuts down its connections and stops, as a
crashed host's rank would look to its peers, while the launcher (which ends every rank at once
when one exits) still sees it running. Rank 0 then crashes in MPICH in most runs (3 of 4 here), or
its call never returns and its watchdog ends it; a run is repeated until one crashes (at most 4
runs, a few seconds each). Before the fix this failed: mpirun reported "Segmentation fault
(signal 11)". collectivesrun takes that line as a lost peer (it may come before, or instead of,
mpiexec's report of the closed proxy) and ends the job with one line.
"""
import re

from collectives.launcher import supervise
from mpi_launch import run_workers

ENV = {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp,self", "COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS": "5"}
CRASH_LINE = re.compile(r"\[collectives FATAL rank 0\] crashed inside the MPI library \(SIG(?:SEGV|BUS) at (lib\S*)\+0x[0-9a-f]+, "
                        r"address 0x[0-9a-f]+, thread [^)]*\)\. MPICH does this when a send to a peer whose connection "
                        r"failed fails .* This process exits with status 76$", re.M)
# A typed error on rank 0: its watchdog's StallTimeoutError, or MPI's own error should MPICH return one.
ERROR_LINE = re.compile(r"^\[rank 0\] error after \d+ steps: (StallTimeoutError: stalled in a backend call|InternalError: MPI_)",
                        re.M)
RUNS = 4


def test_a_crash_inside_mpi_after_a_lost_peer_is_one_line_and_a_status():
    outcomes = []
    for _ in range(RUNS):
        run = run_workers(2, "peer_cut_worker.py", 5, 1_000_000, timeout=60, env=ENV, expect_success=False)
        text = run.stdout + run.stderr
        assert "[rank 1] cutting its connections after 5 steps" in run.stdout, run.describe()
        assert "signal 11" not in text and "Segmentation fault" not in text and run.returncode != 11, \
            f"rank 0 died by SIGSEGV inside MPI:\n{run.describe()}"
        crashed = CRASH_LINE.search(run.stderr)
        # Rank 0 ends either by our line after MPICH's crash (status 76, what mpirun then exits with) or by a
        # typed error: when its transport never tried to send to rank 1, its watchdog's StallTimeoutError.
        assert crashed or ERROR_LINE.search(run.stdout), f"rank 0 neither crashed nor raised:\n{run.describe()}"
        if crashed:
            assert run.returncode == 76, run.describe()
            outcomes.append(crashed.group(0))
            break
        outcomes.append(ERROR_LINE.search(run.stdout).group(1))
    print(outcomes)


def test_collectivesrun_takes_a_crash_inside_mpi_as_a_lost_peer():
    line = ("[collectives FATAL rank 1] crashed inside the MPI library (SIGSEGV at libmpi.so.12+0x41e057, address "
            "0x110, thread coll-engine). MPICH does this when a send to a peer whose connection failed fails (...)")
    seen = supervise.Findings()
    seen.scan(line)
    assert seen.alarm.is_set() and seen.crashes == {1: "SIGSEGV at libmpi.so.12+0x41e057"}
    hosts = [supervise.HostRanks("ha", (0, 1), True), supervise.HostRanks("hb", (2, 3), False)]
    assert supervise.summary(seen, hosts, {"hb": "Connection refused"}).startswith(
        "lost host 'hb' (ranks 2, 3): the MPI launcher's connection to its proxy closed")
    assert supervise.summary(seen, hosts, {}) == (
        "rank 1 crashed inside the MPI library (SIGSEGV at libmpi.so.12+0x41e057) and every host answers ssh: a peer's "
        "connection failed (a rank killed, or a link that went down)")
