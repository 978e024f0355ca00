"""The host file a cluster's job controller names in the launcher's environment.

Kubeflow's mpi-operator (v2) starts the launcher pod of an MPIJob with the worker pods listed in
``/etc/mpi/hostfile`` and that path in the variable its MPI reads by default: ``HYDRA_HOST_FILE``
for MPICH (``<job>-worker-0.<job>-worker.<namespace>.svc:<slots>`` lines), ``I_MPI_HYDRA_HOST_FILE``
for Intel MPI (same lines) and ``OMPI_MCA_orte_default_hostfile`` for Open MPI (``... slots=N``).
There plain ``mpirun prog`` runs one rank per slot of that file; so that
``collectivesrun python train.py`` does the same, a command line without ``-H``/``--hostfile``
takes the file from these variables, and without ``-np`` one rank per slot (host_sources.py's
OperatorHostfile). The same variables
set by hand (they are the MPIs' own) mean the same thing. In the launcher pod (the operator sets
``K_MPI_JOB_ROLE=launcher``) the lines about lost hosts also name the pod (pod_of).
"""
from dataclasses import dataclass
from typing import Mapping, Optional

from . import hosts as hostspec

# (variable, whose default host file it is), in the order they are looked at: the MPI the
# engine is built with (MPICH's hydra) first.
VARIABLES = (
    ("HYDRA_HOST_FILE", "MPICH"),
    ("I_MPI_HYDRA_HOST_FILE", "Intel MPI"),
    ("OMPI_MCA_orte_default_hostfile", "Open MPI"),
)


@dataclass(frozen=True)
class EnvironmentHostfile:
    variable: str
    path: str

    def describe(self):
        return f"{self.path} (from {self.variable})"


def find(environ: Mapping[str, str]) -> Optional[EnvironmentHostfile]:
    """The first host file named by one of VARIABLES, or None."""
    for variable, _ in VARIABLES:
        path = environ.get(variable, "").strip()
        if path:
            return EnvironmentHostfile(variable, path)
    return None


def pod_of(host, environ) -> str:
    """The pod a hostfile name stands for (``<pod>.<service>.<namespace>.svc[.cluster.local]``)
    when collectivesrun runs in an MPIJob's launcher pod, else ""."""
    labels = host.split(".")
    in_cluster = labels[-1:] == ["svc"] or labels[-3:] == ["svc", "cluster", "local"]
    if environ.get("K_MPI_JOB_ROLE") != "launcher" or not in_cluster or len(labels) < 4:
        return ""
    return labels[0]
