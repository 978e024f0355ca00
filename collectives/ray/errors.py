"""The typed errors of collectives.ray (each says in one line what happened and where)."""


class RayExecutorError(RuntimeError):
    """Base class of collectives.ray's errors."""


class RayStartError(RayExecutorError):
    """The workers or their MPI world could not be set up (e.g. within timeout_s)."""


class RayStartTimeout(RayStartError, TimeoutError):
    """A step of start() did not finish within the settings' timeout."""


class WorkerLostError(RayExecutorError):
    """A worker (its Ray actor, its rank process or its node) was lost while the job ran.

    ``rank``, ``node`` (the node's address) and ``actor_id`` name it; the executor shuts the
    rest down (an MPI world cannot lose a member and go on)."""

    def __init__(self, message, rank=None, node=None, actor_id=None):
        super().__init__(message)
        self.rank, self.node, self.actor_id = rank, node, actor_id


class NotStartedError(RayExecutorError):
    """run()/execute() before start(), or after shutdown()."""


class RankExited(RayExecutorError):
    """The function called sys.exit() on a rank (an elastic rank's 77: the hosts changed)."""

    def __init__(self, message, rank=None, code=None):
        super().__init__(message)
        self.rank, self.code = rank, code
