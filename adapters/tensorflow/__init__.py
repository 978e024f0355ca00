"""TensorFlow glue: tf.Tensor <-> numpy/DLPack (tensors), one engine hop per call eagerly or
inside tf.function (hops), the verbs on tensors (ops) and their gradients (functions),
compression, horovod.tensorflow's functions (mpi_ops), gradient reduction shared by the tape
and the optimizer (gradient_reducer), DistributedGradientTape (tape), and the Keras 3
DistributedOptimizer and callbacks (keras_optimizer, keras_callbacks, keras_ops). The
user-facing faces are ``collectives.tensorflow`` and ``collectives.keras``."""
