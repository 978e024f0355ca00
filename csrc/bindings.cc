// The Python boundary of the engine. Statuses come back as (code, message) tuples and the
// Python layer turns them into typed exceptions; nothing here knows any framework.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "engine.h"
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
  return c;
}

// One spec per tensor: (op, name, input, output, dtype, reduce_op, root, prescale, postscale,
// splits, group, group_size, process_set). input/output are C-contiguous numpy arrays (or None): taking
// pointer and shape here costs far less than numpy's ctypes interface in Python.
Submission SubmissionFromTuple(const py::tuple& t) {
  if (t.size() != 13) throw py::value_error("engine submission needs 13 fields");
  Submission s;
  Request& q = s.request;
  q.op = static_cast<OpType>(t[0].cast<int32_t>());
  q.name = t[1].cast<std::string>();
  if (!t[2].is_none()) {
    py::array in = t[2].cast<py::array>();
    s.input = in.data();
    q.shape.assign(in.shape(), in.shape() + in.ndim());
  }
  if (!t[3].is_none()) s.output = t[3].cast<py::array>().mutable_data();
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
  py::object out = r.output ? py::cast(r.output) : py::none();
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
  m.def("set_log_level", [](int level) { SetLogLevel(static_cast<LogLevel>(level)); });
  m.def("mpi_library_version", &MpiLibraryVersion);
  m.def("mpi_version", []() {
    int major = 0, minor = 0;
    MPI_Get_version(&major, &minor);
    return py::make_tuple(major, minor);
  });
}
