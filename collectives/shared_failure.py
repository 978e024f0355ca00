"""Bad input on one rank fails the collective on every rank.

A rank that rejects its own input (an unsupported dtype, a read-only array for an in-place
op, a bad root or splits, an object that cannot be pickled, ...) raises at once. Left at that,
the other ranks would wait for the name forever. ``failing_together`` tells the engine the
names the failed call would have used; it sends an error submission under each, negotiated
like any request, so the other ranks' matching requests fail with this rank's reason.
"""
import contextlib

from . import basics
from .process_set_registry import process_set_id
from . import submissions


@contextlib.contextmanager
def failing_together(op, names, process_set=None, group="", group_size=0):
    """Runs the body; an exception in it is announced under ``names``, then re-raised."""
    try:
        yield
    except Exception as error:
        announce(op, names, process_set, error, group, group_size)
        raise


def announce(op, names, process_set, error, group="", group_size=0):
    """Fail ``names`` on the other ranks with ``error``'s text. Best effort: with no running
    engine, or names and sets that cannot identify a request, there is nobody to tell."""
    try:
        engine = basics.engine()
        set_id = process_set_id(process_set)
    except Exception:  # noqa: BLE001 - the caller's own error is the one to raise
        return
    if not engine.running:
        return
    reason = f"{type(error).__name__}: {error}"
    try:
        failed = [submissions.submission(int(op), n, group=group, group_size=int(group_size),
                                         process_set=set_id) for n in names if isinstance(n, str)]
        engine.announce_failure(failed, reason)
    except Exception:  # noqa: BLE001 - e.g. a name that is not valid text
        pass
