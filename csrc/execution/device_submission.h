// Tensors in GPU memory at enqueue, on the caller's (the producer's) thread, before the engine can
// see them: which GPU holds them, and the producer's stream position as an event that the
// execution waits for (device_executor.cc).
#pragma once
#include <atomic>
#include <cstdint>

#include "common/status.h"
#include "gpu/gpu_runtime.h"
#include "operation/message.h"

namespace collectives {

// `q` (request.device >= 0, or -2: find it from the pointer) gets device 0, which is what ranks
// negotiate ("GPU memory": each rank uses its own GPU); *device is the local GPU. The first GPU
// tensor fixes `process_device`, this process's one GPU; a tensor on another one is refused.
Status PrepareDeviceSubmission(Request& q, const void* input, const void* output, uintptr_t stream,
                               std::atomic<int>& process_device, gpu::EventPtr* ready, int32_t* device);

}  // namespace collectives
