// DLPack capsules over engine-owned memory, so that a framework adopts an engine output
// (torch.from_dlpack, cupy.from_dlpack) without a copy and without an allocator callback.
// The structures are DLPack's stable ABI (the unversioned "dltensor" capsule, which every
// consumer accepts), declared here so that no dlpack.h is needed.
#pragma once
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "types.h"

namespace collectives {

constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDA = 2;

// A capsule named "dltensor" describing C-contiguous memory at `data`. `owner` is kept alive
// until the consumer calls the deleter (or the capsule dies unconsumed).
pybind11::capsule MakeDlpackCapsule(void* data, int32_t device_type, int32_t device_id, const std::vector<int64_t>& shape,
                                    DataType dtype, std::shared_ptr<void> owner);

// numpy-style type string of __cuda_array_interface__ ("<f4", "|b1", ...); empty for bfloat16,
// which that protocol cannot describe.
const char* ArrayInterfaceTypestr(DataType dtype);

}  // namespace collectives
