// TensorFlow ops implemented by the engine (tensorflow_kernels.cc).
#pragma once
#include <string>

namespace collectives {

// Registers the ops and their CPU kernels with the TensorFlow loaded in this process (once).
// Returns "" on success, else why they are not available.
std::string RegisterTensorflowKernels();

}  // namespace collectives
