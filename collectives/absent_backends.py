"""Horovod's build queries for the vendor backends this library never has: Intel oneCCL and
IBM DDL. Horovod scripts call them before reducescatter and process-set code to choose a
path; they answer False here, as Horovod does when built without them."""


def ccl_built():
    """False: collectives is never built with Intel oneCCL (CPU collectives go over MPI)."""
    return False


def ddl_built():
    """False: collectives is never built with IBM DDL (GPU collectives go over NCCL)."""
    return False
