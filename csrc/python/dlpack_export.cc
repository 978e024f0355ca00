#include "python/dlpack_export.h"

#include <pybind11/stl.h>

#include <utility>

namespace collectives {
namespace {

// DLPack 0.x/1.x ABI (dlpack.h): DLDevice, DLDataType, DLTensor, DLManagedTensor.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 6 bool
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

// Owns the shape/strides arrays and the memory's owner for as long as the consumer holds
// the tensor.
struct Holder {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  std::shared_ptr<void> owner;
};

void DeleteHolder(DLManagedTensor* self) { delete static_cast<Holder*>(self->manager_ctx); }

DLDataType ToDL(DataType t) {
  switch (t) {
    case DataType::UINT8: return {1, 8, 1};
    case DataType::INT8: return {0, 8, 1};
    case DataType::INT16: return {0, 16, 1};
    case DataType::INT32: return {0, 32, 1};
    case DataType::INT64: return {0, 64, 1};
    case DataType::FLOAT16: return {2, 16, 1};
    case DataType::BFLOAT16: return {4, 16, 1};
    case DataType::FLOAT32: return {2, 32, 1};
    case DataType::FLOAT64: return {2, 64, 1};
    case DataType::BOOL: return {6, 8, 1};
  }
  return {1, 8, 1};
}

// Called when the capsule is garbage-collected: a consumer renames the capsule to
// "used_dltensor" when it takes ownership; otherwise the tensor is still ours to free.
void CapsuleDestructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "used_dltensor")) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);  // a destructor must not disturb a pending exception
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed && managed->deleter) managed->deleter(managed);
  PyErr_Clear();
  PyErr_Restore(type, value, traceback);
}

}  // namespace

pybind11::capsule MakeDlpackCapsule(void* data, int32_t device_type, int32_t device_id, const std::vector<int64_t>& shape,
                                    DataType dtype, std::shared_ptr<void> owner) {
  auto* h = new Holder();
  h->shape = shape;
  h->strides.assign(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) h->strides[i - 1] = h->strides[i] * (shape[i] > 0 ? shape[i] : 1);
  h->owner = std::move(owner);
  DLTensor& t = h->managed.dl_tensor;
  t.data = data;
  t.device = {device_type, device_id};
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = ToDL(dtype);
  t.shape = h->shape.empty() ? nullptr : h->shape.data();
  t.strides = h->strides.empty() ? nullptr : h->strides.data();
  t.byte_offset = 0;
  h->managed.manager_ctx = h;
  h->managed.deleter = &DeleteHolder;
  PyObject* cap = PyCapsule_New(&h->managed, "dltensor", &CapsuleDestructor);
  if (!cap) {
    delete h;
    throw pybind11::error_already_set();
  }
  return pybind11::reinterpret_steal<pybind11::capsule>(cap);
}

pybind11::capsule DeviceBufferDlpack(const std::shared_ptr<gpu::DeviceBuffer>& buffer, const pybind11::object& stream,
                                     const pybind11::object& max_version, const pybind11::object& dl_device,
                                     const pybind11::object& copy) {
  (void)max_version;  // the unversioned capsule is what every consumer accepts
  if (!dl_device.is_none()) {
    auto dev = dl_device.cast<std::pair<int32_t, int32_t>>();
    if (dev.first != kDLCUDA || dev.second != buffer->device())
      throw pybind11::buffer_error("this array is on CUDA device " + std::to_string(buffer->device()) +
                                   " and cannot be exported to DLPack device (" + std::to_string(dev.first) + ", " +
                                   std::to_string(dev.second) + ")");
  }
  // The consumer's stream, in DLPack's numbering: None means the legacy default stream, 0
  // is not allowed (taken as the legacy stream too), -1 means the consumer names none.
  int64_t s = stream.is_none() ? static_cast<int64_t>(gpu::kLegacyStream) : stream.cast<int64_t>();
  if (s == 0) s = static_cast<int64_t>(gpu::kLegacyStream);
  if (s < -1) throw pybind11::value_error("__dlpack__: invalid stream " + std::to_string(s));
  if (!copy.is_none() && copy.cast<bool>()) {
    std::shared_ptr<gpu::DeviceBuffer> dup;
    Status st;
    {
      pybind11::gil_scoped_release nogil;
      const uintptr_t order = s == -1 ? gpu::kLegacyStream : static_cast<uintptr_t>(s);
      st = gpu::DeviceBuffer::CopyOf(*buffer, order, &dup);
      // No stream named: the consumer will not wait for the copy, so it is complete on return.
      if (st.ok() && s == -1) st = gpu::CudaStatus(gpu::Runtime::Get().api()->StreamSynchronize(gpu::StreamFromHandle(order)),
                                                   "cuStreamSynchronize (a copy for __dlpack__)");
    }
    if (!st.ok()) throw pybind11::buffer_error("__dlpack__(copy=True): " + st.message);
    return MakeDlpackCapsule(dup->data(), kDLCUDA, dup->device(), dup->shape, dup->dtype, dup);
  }
  buffer->set_consumer_stream(s);
  return MakeDlpackCapsule(buffer->data(), kDLCUDA, buffer->device(), buffer->shape, buffer->dtype, buffer);
}

pybind11::dict DeviceBufferArrayInterface(const std::shared_ptr<gpu::DeviceBuffer>& buffer) {
  const char* typestr = ArrayInterfaceTypestr(buffer->dtype);
  if (!*typestr) throw pybind11::attribute_error("bfloat16 has no __cuda_array_interface__ type; use __dlpack__");
  // Whoever reads it may use any stream: freeing waits for the whole device (gpu_runtime.h).
  buffer->set_consumer_unknown();
  pybind11::dict d;
  std::vector<pybind11::ssize_t> shape(buffer->shape.begin(), buffer->shape.end());
  d["shape"] = pybind11::tuple(pybind11::cast(shape));
  d["typestr"] = typestr;
  d["data"] = pybind11::make_tuple(reinterpret_cast<uintptr_t>(buffer->data()), false);
  d["strides"] = pybind11::none();
  d["stream"] = pybind11::none();  // complete: nothing to synchronize with
  d["version"] = 3;
  return d;
}

const char* ArrayInterfaceTypestr(DataType dtype) {
  switch (dtype) {
    case DataType::UINT8: return "|u1";
    case DataType::INT8: return "|i1";
    case DataType::INT16: return "<i2";
    case DataType::INT32: return "<i4";
    case DataType::INT64: return "<i8";
    case DataType::FLOAT16: return "<f2";
    case DataType::BFLOAT16: return "";
    case DataType::FLOAT32: return "<f4";
    case DataType::FLOAT64: return "<f8";
    case DataType::BOOL: return "|b1";
  }
  return "";
}

}  // namespace collectives
