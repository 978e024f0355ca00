"""What the elastic driver tells each rank, through the environment (the elastic contract).

COLLECTIVES_ELASTIC=1 turns elastic mode on; without it, ``hvd.elastic.run`` runs a fixed-size
job, as Horovod's elastic scripts do under plain ``mpirun``.
"""
import os
import tempfile
from dataclasses import dataclass

from .. import config

# Exit statuses a rank reports to the driver.
EXIT_HOSTS_UPDATED = 77  # the host set changed: every rank stops at the same commit, which is durable
EXIT_RESET = 78  # a collective failed because of someone else's failure: restart from the newest commit


@dataclass(frozen=True)
class ElasticEnvironment:
    enabled: bool
    driver: str  # "<ip>:<port>" of the driver's notification server, "" when none
    job_id: str
    generation: int
    commit_dir: str
    hosts_version: int

    @property
    def driver_address(self):
        """(host, port) of the driver, or None."""
        if not self.driver:
            return None
        host, sep, port = self.driver.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"COLLECTIVES_ELASTIC_DRIVER={self.driver!r} is not <ip>:<port>")
        return host.strip("[]"), int(port)


def _int(environ, name, default):
    value = environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def commit_dir_for(job_id, environ=None):
    """The job's commit directory on every host: <COLLECTIVES_ELASTIC_COMMIT_BASE_DIR, else
    /dev/shm, else the temporary directory>/collectives-elastic-<job>."""
    base = config.read("elastic_commit_base_dir", environ)
    if not base:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(base, f"collectives-elastic-{job_id}")


def read(environ=None):
    """The elastic settings of this process (read at each call: tests change the environment)."""
    environ = os.environ if environ is None else environ
    enabled = environ.get("COLLECTIVES_ELASTIC", "").strip() not in ("", "0")
    job_id = environ.get("COLLECTIVES_ELASTIC_JOB_ID", "").strip() or "local"
    commit_dir = environ.get("COLLECTIVES_ELASTIC_COMMIT_DIR", "").strip()
    if enabled and not commit_dir:
        commit_dir = commit_dir_for(job_id, environ)
    return ElasticEnvironment(
        enabled=enabled,
        driver=environ.get("COLLECTIVES_ELASTIC_DRIVER", "").strip(),
        job_id=job_id,
        generation=_int(environ, "COLLECTIVES_ELASTIC_GENERATION", 0),
        commit_dir=commit_dir,
        hosts_version=_int(environ, "COLLECTIVES_ELASTIC_HOSTS_VERSION", 0),
    )
