"""Per-framework glue (PyTorch autograd and hooks, TensorFlow ops and Keras). Filled by the framework issues."""
