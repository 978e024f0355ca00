"""The ranks' answers to one call, turned into values or one typed error: a lost actor or node
is a WorkerLostError naming the rank and node; a rank whose process ended because another was
lost is a casualty; otherwise the first rank's own exception is raised (peers that failed only
because of it raise the engine's consequence errors)."""
import time

from .errors import RankExited, WorkerLostError
from .ray_api import ray

FAILURE_GRACE_S = 10.0  # after the first failure, for the other ranks' answers


def _cause(error):
    return getattr(error, "cause", None) or error


def classify(error):
    """"lost" (the actor or its node died), "casualty" (the rank process ended), "exit", or "error"."""
    if isinstance(error, ray.exceptions.RayActorError):
        return "lost"
    cause = _cause(error)
    if isinstance(cause, WorkerLostError):
        return "casualty"
    if isinstance(cause, RankExited):
        return "exit"
    return "error"


def gather(refs, grace=FAILURE_GRACE_S):
    """Waits for every rank's answer (after a first failure, ``grace`` seconds more for the
    others'); returns (values in rank order, None) or (None, (kind, rank, error)) for the
    failure to report: a lost worker first, then an error of the function's own, then an exit,
    then a rank that ended because others did."""
    index = {ref: r for r, ref in enumerate(refs)}
    results, failures = {}, []
    pending = list(refs)
    deadline = None
    while pending:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, pending = ray.wait(pending, num_returns=1, timeout=wait)
        if not done:
            break  # the grace after a failure is over
        for ref in done:
            r = index[ref]
            try:
                results[r] = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - sorted below
                failures.append((classify(e), r, e))
                if deadline is None:
                    deadline = time.monotonic() + grace
    if not failures:
        return [results[r] for r in range(len(refs))], None
    for kind in ("lost", "error", "exit", "casualty"):
        chosen = [f for f in failures if f[0] == kind]
        if kind == "error":
            chosen = [f for f in chosen if not _is_consequence(_cause(f[2]))] or chosen
        if chosen:
            return None, chosen[0]
    return None, failures[0]


def _is_consequence(error):
    from ..errors import ShutdownError, StallTimeoutError, TensorMismatchError
    return isinstance(error, (ShutdownError, StallTimeoutError, TensorMismatchError))


def lost_error(workers, rank, error, doing):
    cause = _cause(error)
    detail = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    return WorkerLostError(f"RayExecutor.{doing}: worker {workers.where(rank)} was lost ({detail}); the other "
                           "workers were stopped and no actor is left: call start() again to go on",
                           rank=rank, node=workers.infos[rank]["node_ip"], actor_id=workers.infos[rank]["actor_id"])
