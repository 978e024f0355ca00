// The Python boundary of the engine. Statuses come back as (code, message) tuples and the
// Python layer turns them into typed exceptions; nothing here knows any framework.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "dlpack_export.h"
#include "engine.h"
#include "gpu_loader.h"
#include "log.h"

namespace py = pybind11;
using namespace collectives;

namespace {

py::tuple StatusTuple(const Status& s) { return py::make_tuple(static_cast<int>(s.code), s.message); }

EngineConfig ConfigFromDict(const py::dict& d) {
  EngineConfig c;
  if (d.contains("fusion_threshold")) c.fusion_threshold = d["fusion_threshold"].cast<int64_t>();
  if (d.contains("cycle_time_ms")) c.cycle_time_ms = d["cycle_time_ms"].cast<double>();
  if (d.contains("cache_capacity")) c.cache_capacity = d["cache_capacity"].cast<int>();
  if (d.contains("timeline_path")) c.timeline_path = d["timeline_path"].cast<std::string>();
  if (d.contains("timeline_mark_cycles")) c.timeline_mark_cycles = d["timeline_mark_cycles"].cast<bool>();
  if (d.contains("stall_check_s")) c.stall_check_s = d["stall_check_s"].cast<double>();
  if (d.contains("stall_shutdown_s")) c.stall_shutdown_s = d["stall_shutdown_s"].cast<double>();
  if (d.contains("cuda_driver_library")) c.cuda_driver_library = d["cuda_driver_library"].cast<std::string>();
  if (d.contains("nccl_library")) c.nccl_library = d["nccl_library"].cast<std::string>();
  if (d.contains("nccl_problem")) c.nccl_problem = d["nccl_problem"].cast<std::string>();
  return c;
}

// A tensor in GPU memory, as Python describes it: (data_ptr, shape, device, stream). device
// -2: unknown (the engine asks the driver); stream: the producer's (0 and 1: the legacy
// default stream, 2: the calling thread's default stream).
struct DeviceSpec {
  uintptr_t ptr = 0;
  std::vector<int64_t> shape;
  int32_t device = -2;
  uintptr_t stream = 0;
};

DeviceSpec DeviceSpecFrom(const py::handle& h) {
  py::tuple t = py::reinterpret_borrow<py::tuple>(h);
  if (t.size() != 4) throw py::value_error("a GPU tensor is described as (data_ptr, shape, device, stream)");
  DeviceSpec d;
  d.ptr = t[0].cast<uintptr_t>();
  d.shape = t[1].cast<std::vector<int64_t>>();
  d.device = t[2].cast<int32_t>();
  d.stream = t[3].cast<uintptr_t>();
  if (d.device < -2 || d.device == -1) throw py::value_error("a GPU tensor's device must be >= 0 (or -2: unknown)");
  return d;
}

// One spec per tensor: (op, name, input, output, dtype, reduce_op, root, prescale, postscale,
// splits, group, group_size, process_set). input/output are C-contiguous numpy arrays (or None): taking
// pointer and shape here costs far less than numpy's ctypes interface in Python. For tensors in
// GPU memory, input and output are DeviceSpec tuples instead (output may be None).
Submission SubmissionFromTuple(const py::tuple& t) {
  if (t.size() != 13) throw py::value_error("engine submission needs 13 fields");
  Submission s;
  Request& q = s.request;
  q.op = static_cast<OpType>(t[0].cast<int32_t>());
  q.name = t[1].cast<std::string>();
  const bool on_device = py::isinstance<py::tuple>(t[2]) || py::isinstance<py::tuple>(t[3]);
  if (on_device) {
    for (int k : {2, 3})
      if (!t[k].is_none() && !py::isinstance<py::tuple>(t[k]))
        throw py::value_error("input and output must both be in GPU memory (or the output None)");
    if (!t[2].is_none()) {
      DeviceSpec in = DeviceSpecFrom(t[2]);
      s.input = reinterpret_cast<const void*>(in.ptr);
      q.shape = in.shape;
      q.device = in.device;
      s.stream = in.stream;
    }
    if (!t[3].is_none()) {
      DeviceSpec out = DeviceSpecFrom(t[3]);
      s.output = reinterpret_cast<void*>(out.ptr);
      if (t[2].is_none()) {
        q.shape = out.shape;
        q.device = out.device;
        s.stream = out.stream;
      }
    }
  } else {
    if (!t[2].is_none()) {
      py::array in = t[2].cast<py::array>();
      s.input = in.data();
      q.shape.assign(in.shape(), in.shape() + in.ndim());
    }
    if (!t[3].is_none()) s.output = t[3].cast<py::array>().mutable_data();
  }
  q.dtype = static_cast<DataType>(t[4].cast<int32_t>());
  q.reduce_op = static_cast<ReduceOp>(t[5].cast<int32_t>());
  q.root = t[6].cast<int32_t>();
  q.prescale = t[7].cast<double>();
  q.postscale = t[8].cast<double>();
  q.splits = t[9].cast<std::vector<int64_t>>();
  q.group = t[10].cast<std::string>();
  q.group_size = t[11].cast<int32_t>();
  q.process_set = t[12].cast<int32_t>();
  return s;
}

py::tuple ResultTuple(Result&& r) {
  py::object out = r.device_output ? py::cast(r.device_output) : r.output ? py::cast(r.output) : py::none();
  return py::make_tuple(static_cast<int>(r.status.code), r.status.message, out, r.output_shape, r.received_splits,
                        r.value);
}

// A numpy array over 64-byte aligned engine memory (TensorFlow requires that alignment of
// memory it borrows; numpy's own allocations are 16-byte aligned).
py::array AlignedEmpty(const std::vector<int64_t>& shape, const py::dtype& dtype) {
  const int64_t bytes = NumElements(shape) * static_cast<int64_t>(dtype.itemsize());
  auto* holder = new std::shared_ptr<HostBuffer>(std::make_shared<HostBuffer>(bytes));
  void* data = (*holder)->data();
  py::capsule owner(holder, [](void* p) { delete static_cast<std::shared_ptr<HostBuffer>*>(p); });
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  return py::array(dtype, dims, data, owner);
}

// What the engine can do with GPUs in this process, for nccl_built()/cuda_built() and messages.
py::dict GpuInfo() {
  gpu::Libraries& libs = gpu::Libraries::Get();
  py::dict d;
  d["cuda_found"] = libs.cuda() != nullptr;
  d["cuda_driver_version"] = libs.driver_version();
  d["nccl_version"] = libs.nccl_version();
  d["nccl_path"] = libs.nccl_path();
  d["available"] = libs.available();
  d["problem"] = libs.problem();
  return d;
}

std::string MpiLibraryVersion() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(buf, &len);
  return std::string(buf, static_cast<size_t>(len));
}

}  // namespace

PYBIND11_MODULE(_engine, m) {
  m.doc() = "collectives engine: background negotiation, tensor fusion, MPI data movement";

  py::class_<HostBuffer, std::shared_ptr<HostBuffer>>(m, "HostBuffer", py::buffer_protocol())
      .def_property_readonly("nbytes", &HostBuffer::size)
      .def_property_readonly("address", [](const HostBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); })
      .def_buffer([](HostBuffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size())}, {static_cast<py::ssize_t>(1)});
      });

  // Engine-owned GPU memory (allgather/alltoall outputs). Frameworks adopt it through DLPack
  // (torch.from_dlpack, cupy.from_dlpack) or __cuda_array_interface__; the data is complete
  // when the handle completes, so no stream synchronization is asked of the consumer.
  py::class_<gpu::DeviceBuffer, std::shared_ptr<gpu::DeviceBuffer>>(m, "DeviceBuffer")
      .def_property_readonly("nbytes", &gpu::DeviceBuffer::size)
      .def_property_readonly("address", [](const gpu::DeviceBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); })
      .def_property_readonly("device", &gpu::DeviceBuffer::device)
      .def_property_readonly("shape", [](const gpu::DeviceBuffer& b) { return b.shape; })
      .def_property_readonly("dtype", [](const gpu::DeviceBuffer& b) { return static_cast<int>(b.dtype); })
      .def("__dlpack_device__", [](const gpu::DeviceBuffer& b) { return py::make_tuple(kDLCUDA, b.device()); })
      .def(
          "__dlpack__",
          [](std::shared_ptr<gpu::DeviceBuffer> b, py::object stream, py::object, py::object, py::object) {
            // The consumer's stream: the memory is freed in its order, as a framework's caching
            // allocator would do for its own tensors (None/-1: the legacy default stream).
            if (!stream.is_none()) {
              const int64_t s = stream.cast<int64_t>();
              if (s >= 0) b->set_free_stream(static_cast<uintptr_t>(s == 0 ? gpu::kLegacyStream : s));
            }
            return MakeDlpackCapsule(b->data(), kDLCUDA, b->device(), b->shape, b->dtype, b);
          },
          py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def_property_readonly("__cuda_array_interface__", [](const gpu::DeviceBuffer& b) {
        const char* typestr = ArrayInterfaceTypestr(b.dtype);
        if (!*typestr) throw py::attribute_error("bfloat16 has no __cuda_array_interface__ type; use __dlpack__");
        py::dict d;
        std::vector<py::ssize_t> shape(b.shape.begin(), b.shape.end());
        d["shape"] = py::tuple(py::cast(shape));
        d["typestr"] = typestr;
        d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(b.data()), false);
        d["strides"] = py::none();
        d["stream"] = py::none();  // complete: nothing to synchronize with
        d["version"] = 3;
        return d;
      });

  py::class_<Engine>(m, "Engine")
      .def(py::init<>())
      .def("start",
           [](Engine& e, uintptr_t comm_address, const py::dict& config) {
             // The caller passes the address of an MPI_Comm (mpi4py's _addressof), or 0 for
             // MPI_COMM_WORLD: works whatever type the MPI library uses for handles.
             MPI_Comm comm = comm_address ? *reinterpret_cast<MPI_Comm*>(comm_address) : MPI_COMM_WORLD;
             EngineConfig c = ConfigFromDict(config);
             Status st;
             {
               py::gil_scoped_release nogil;
               st = e.Start(comm, c);
             }
             return StatusTuple(st);
           })
      .def("shutdown", &Engine::Shutdown, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("running", &Engine::running)
      .def_property_readonly("rank", &Engine::rank)
      .def_property_readonly("size", &Engine::size)
      .def_property_readonly("local_rank", &Engine::local_rank)
      .def_property_readonly("local_size", &Engine::local_size)
      .def_property_readonly("cross_rank", &Engine::cross_rank)
      .def_property_readonly("cross_size", &Engine::cross_size)
      .def_property_readonly("mpi_thread_level", &Engine::mpi_thread_level)
      .def_property_readonly("gpu_device", &Engine::gpu_device)
      .def("enqueue",
           [](Engine& e, const py::list& specs) {
             std::vector<Submission> subs;
             subs.reserve(specs.size());
             for (const auto& item : specs) subs.push_back(SubmissionFromTuple(item.cast<py::tuple>()));
             std::vector<int64_t> handles;
             Status st = e.Enqueue(std::move(subs), &handles);
             return py::make_tuple(static_cast<int>(st.code), st.message, handles);
           })
      .def("poll", &Engine::Poll)
      .def("wait",
           // Blocks without the GIL, then removes the handle and returns
           // (code, message, engine_output_or_None, output_shape, received_splits, value); value is
           // join's last rank to join, or a new process set's id.
           [](Engine& e, int64_t handle) {
             {
               py::gil_scoped_release nogil;
               e.Wait(handle);
             }
             return ResultTuple(e.Collect(handle));
           })
      .def("start_timeline",
           [](Engine& e, const std::string& path, bool mark_cycles) { return StatusTuple(e.StartTimeline(path, mark_cycles)); })
      .def("stop_timeline", &Engine::StopTimeline, py::call_guard<py::gil_scoped_release>());

  m.def("aligned_empty", &AlignedEmpty, py::arg("shape"), py::arg("dtype"));
  m.def("gpu_info", &GpuInfo);
  // Allocates GPU memory for the output of a GPU array whose framework the Python layer does
  // not know how to allocate from (plain __cuda_array_interface__ producers).
  m.def("device_empty", [](const std::vector<int64_t>& shape, int dtype, int device) -> py::tuple {
    std::shared_ptr<gpu::DeviceBuffer> buf;
    const int64_t bytes = NumElements(shape) * DataTypeSize(static_cast<DataType>(dtype));
    Status st = gpu::DeviceBuffer::Allocate(device, bytes, nullptr, &buf);
    if (!st.ok()) return py::make_tuple(static_cast<int>(st.code), st.message, py::none());
    buf->shape = shape;
    buf->dtype = static_cast<DataType>(dtype);
    return py::make_tuple(0, std::string(), py::cast(buf));
  });
  // The GPU that holds `ptr` (for __cuda_array_interface__ producers, which do not say).
  m.def("device_of_pointer", [](uintptr_t ptr) {
    int device = -1;
    Status st = gpu::Runtime::Get().ResolveDevice(ptr, -2, &device);
    return py::make_tuple(static_cast<int>(st.code), st.message, device);
  });
  // A DLPack capsule over host memory: the capsule code of __dlpack__, testable without a GPU.
  // Its bytes count up (i % 251) so that a test can check what the consumer sees.
  m.def("host_dlpack_capsule", [](const std::vector<int64_t>& shape, int dtype) {
    auto buf = std::make_shared<HostBuffer>(NumElements(shape) * DataTypeSize(static_cast<DataType>(dtype)));
    for (int64_t i = 0; i < buf->size(); ++i) static_cast<uint8_t*>(buf->data())[i] = static_cast<uint8_t>(i % 251);
    return MakeDlpackCapsule(buf->data(), kDLCPU, 0, shape, static_cast<DataType>(dtype), buf);
  });
  m.def("set_log_level", [](int level) { SetLogLevel(static_cast<LogLevel>(level)); });
  m.def("mpi_library_version", &MpiLibraryVersion);
  m.def("mpi_version", []() {
    int major = 0, minor = 0;
    MPI_Get_version(&major, &minor);
    return py::make_tuple(major, minor);
  });
}
