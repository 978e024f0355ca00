// DLPack capsules over engine-owned memory, so that a framework adopts an engine output
// (torch.from_dlpack, cupy.from_dlpack) without a copy and without an allocator callback.
// The structures are DLPack's stable ABI (the unversioned "dltensor" capsule, which every
// consumer accepts), declared here so that no dlpack.h is needed.
#pragma once
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "gpu/gpu_runtime.h"
#include "common/types.h"

namespace collectives {

constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDA = 2;

// A capsule named "dltensor" describing C-contiguous memory at `data`. `owner` is kept alive
// until the consumer calls the deleter (or the capsule dies unconsumed).
pybind11::capsule MakeDlpackCapsule(void* data, int32_t device_type, int32_t device_id, const std::vector<int64_t>& shape,
                                    DataType dtype, std::shared_ptr<void> owner);

// DeviceBuffer.__dlpack__ (the array API's signature). `stream` is the consumer's (None: the
// legacy default stream, -1: none named); the buffer is freed in its order when the
// consumer lets go (gpu_runtime.h). copy=True exports a copy made on that stream;
// dl_device other than the buffer's GPU raises BufferError.
pybind11::capsule DeviceBufferDlpack(const std::shared_ptr<gpu::DeviceBuffer>& buffer, const pybind11::object& stream,
                                     const pybind11::object& max_version, const pybind11::object& dl_device,
                                     const pybind11::object& copy);
// DeviceBuffer.__cuda_array_interface__ (version 3; the data is complete, so no stream).
pybind11::dict DeviceBufferArrayInterface(const std::shared_ptr<gpu::DeviceBuffer>& buffer);

// numpy-style type string of __cuda_array_interface__ ("<f4", "|b1", ...); empty for bfloat16,
// which that protocol cannot describe.
const char* ArrayInterfaceTypestr(DataType dtype);

}  // namespace collectives
