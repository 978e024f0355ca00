"""``RayExecutor.create_settings(timeout_s=...)``: what Horovod's MiniSettings holds that means
something here (no ssh and no NICs: the world is formed through the actors)."""
from dataclasses import dataclass


@dataclass
class Settings:
    timeout_s: float = 300.0  # each start-up step: the actors, the MPI world, the engine
    placement_group_timeout_s: float = 100.0  # for the cluster to have room for the workers
    verbose: int = 1
    ssh_identity_file: str = None  # accepted for Horovod's signature; nothing uses ssh
    nics: set = None


def create_settings(timeout_s=300, ssh_identity_file=None, ssh_str=None, placement_group_timeout_s=100, nics=None,
                    verbose=1):
    for name, value in (("timeout_s", timeout_s), ("placement_group_timeout_s", placement_group_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    del ssh_str  # Horovod writes it to ssh_identity_file for its ssh launch; there is none here
    return Settings(timeout_s=float(timeout_s), placement_group_timeout_s=float(placement_group_timeout_s),
                    verbose=verbose, ssh_identity_file=ssh_identity_file, nics=nics)
