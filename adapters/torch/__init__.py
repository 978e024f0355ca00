"""PyTorch glue: tensor <-> engine conversion (tensors), the verbs on tensors (ops), autograd
Functions (functions), compression, and horovod.torch's functions (mpi_ops). The user-facing
face is ``collectives.torch``."""
