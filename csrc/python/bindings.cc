// The Python boundary of the engine. Statuses come back as (code, message) tuples and the
// Python layer turns them into typed exceptions; nothing here knows any framework. Files: this
// one (the module, the Engine class), submission_binding.cc (engine.submission and its classes),
// allreduce_now.cc (the synchronous allreduce's fast path), dlpack_export.cc.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <climits>

#include "python/bindings_common.h"
#include "python/dlpack_export.h"
#include "core/engine.h"
#include "gpu/gpu_loader.h"
#include "host_math/half_math.h"
#include "frontend/layout_check.h"
#include "host_math/local_reduce.h"
#include "common/log.h"
#include "core/process_exit.h"
#include "common/process_id.h"
#include "python/python_gil.h"
#include "tensorflow/tensorflow_kernels.h"

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
  if (d.contains("init_timeout_s")) c.init_timeout_s = d["init_timeout_s"].cast<double>();
  if (d.contains("finalize_timeout_s")) c.finalize_timeout_s = d["finalize_timeout_s"].cast<double>();
  if (d.contains("buffer_pool_bytes")) c.buffer_pool_bytes = d["buffer_pool_bytes"].cast<int64_t>();
  if (d.contains("hierarchical_allreduce")) c.hierarchical_allreduce = d["hierarchical_allreduce"].cast<bool>();
  if (d.contains("hierarchical_allgather")) c.hierarchical_allgather = d["hierarchical_allgather"].cast<bool>();
  if (d.contains("shm_allreduce")) c.shm_allreduce = d["shm_allreduce"].cast<bool>();
  if (d.contains("cma_allreduce")) c.cma_allreduce = d["cma_allreduce"].cast<bool>();
  if (d.contains("shm_negotiation")) c.shm_negotiation = d["shm_negotiation"].cast<bool>();
  if (d.contains("caller_cycles")) c.caller_cycles = d["caller_cycles"].cast<bool>();
  if (d.contains("gpu_fusion_wait")) c.gpu_fusion_wait = d["gpu_fusion_wait"].cast<bool>();
  if (d.contains("gpu_fusion_wait_ms")) c.gpu_fusion_wait_ms = d["gpu_fusion_wait_ms"].cast<double>();
  if (d.contains("autotune")) c.autotune.enabled = d["autotune"].cast<bool>();
  if (d.contains("autotune_log")) c.autotune.log_path = d["autotune_log"].cast<std::string>();
  if (d.contains("autotune_warmup_samples")) c.autotune.warmup_samples = d["autotune_warmup_samples"].cast<int>();
  if (d.contains("autotune_steps_per_sample")) c.autotune.steps_per_sample = d["autotune_steps_per_sample"].cast<int>();
  if (d.contains("autotune_bayes_opt_max_samples"))
    c.autotune.max_samples = d["autotune_bayes_opt_max_samples"].cast<int>();
  if (d.contains("autotune_fixed")) {  // knobs the user set: not tuned (collectives/config.py)
    for (const auto& key : d["autotune_fixed"].cast<std::vector<std::string>>()) {
      c.autotune.fusion_threshold_fixed |= key == "fusion_threshold";
      c.autotune.cycle_time_fixed |= key == "cycle_time_ms";
      c.autotune.hierarchical_allreduce_fixed |= key == "hierarchical_allreduce";
      c.autotune.hierarchical_allgather_fixed |= key == "hierarchical_allgather";
    }
  }
  if (d.contains("cuda_driver_library")) c.cuda_driver_library = d["cuda_driver_library"].cast<std::string>();
  if (d.contains("nccl_library")) c.nccl_library = d["nccl_library"].cast<std::string>();
  if (d.contains("nccl_problem")) c.nccl_problem = d["nccl_problem"].cast<std::string>();
  return c;
}

py::tuple ResultTuple(Result&& r) {
  py::object out = r.device_output ? py::cast(r.device_output) : r.output ? py::cast(r.output) : py::none();
  return py::make_tuple(static_cast<int>(r.status.code), r.status.message, out, r.output_shape, r.received_splits,
                        r.value);
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

std::string ForkedChildMessage(int parent_pid) {
  return "collectives was initialized in the parent process (pid " + std::to_string(parent_pid) +
         "); a forked child (a DataLoader or multiprocessing worker, os.fork()) cannot use it: run collective "
         "operations in the parent, and call collectives.init() only in processes that mpirun or collectivesrun "
         "started";
}

// Py_AtExit: runs after the interpreter finalized (after mpi4py's own exit code would, which
// basics.py turns off when the engine initializes MPI).
void FinalizeMpiAtExit() {
  if (ProcessShouldFinalizeMpi()) FinalizeMpiWithinTimeout();
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
      .def("__dlpack__", &DeviceBufferDlpack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def_property_readonly("__cuda_array_interface__", &DeviceBufferArrayInterface);

  TrackForks();
  gil::ForgetOtherThreadsInForkedChildren();
  Py_AtExit(&FinalizeMpiAtExit);
  // Before the interpreter finalizes, stop letting blocked threads take the GIL back (python_gil.h).
  py::module_::import("atexit").attr("register")(py::cpp_function([]() { gil::MarkExiting(); }));

  DefineSubmission(m);
  py::class_<Engine, std::unique_ptr<Engine, EngineDeleter>> engine(m, "Engine");
  DefineAllreduceNow(engine);
  engine
      .def(py::init<>())
      .def("start",
           [](Engine& e, uintptr_t comm_address, const py::dict& config) {
             // The caller passes the address of an MPI_Comm (mpi4py's _addressof), or 0 for
             // MPI_COMM_WORLD: works whatever type the MPI library uses for handles.
             MPI_Comm comm = comm_address ? *reinterpret_cast<MPI_Comm*>(comm_address) : MPI_COMM_WORLD;
             EngineConfig c = ConfigFromDict(config);
             Status st;
             gil::WithoutGil([&] { st = e.Start(comm, c); });
             if (st.ok()) SetSlotEngine(&e);  // the engine framework kernels submit to
             return StatusTuple(st);
           })
      .def(
          "shutdown",
          // exiting: called from the process's exit (the other ranks learn that this rank is gone
          // for good, so their init() does not wait for it).
          [](Engine& e, bool exiting) { gil::WithoutGil([&] { e.Shutdown(exiting); }); }, py::arg("exiting") = false)
      .def_property_readonly("running", [](const Engine& e) { return e.lifetime().running(); })
      // (stopped, restartable, code, message): why the engine stopped and whether init() may
      // start another one (Engine::StopInfo).
      .def("stop_info",
           [](Engine& e) {
             const Engine::StopInfo info = e.stop_info();
             return py::make_tuple(info.stopped, info.restartable, static_cast<int>(info.reason.code),
                                   info.reason.message);
           })
      .def_property_readonly("forked_child", [](const Engine& e) { return e.lifetime().forked_child(); })
      .def_property_readonly("owner_pid", [](const Engine& e) { return e.lifetime().owner_pid(); })
      .def_property_readonly("rank", [](const Engine& e) { return e.job().rank; })
      .def_property_readonly("size", [](const Engine& e) { return e.job().size; })
      .def_property_readonly("local_rank", [](const Engine& e) { return e.job().local_rank; })
      .def_property_readonly("local_size", [](const Engine& e) { return e.job().local_size; })
      .def_property_readonly("cross_rank", [](const Engine& e) { return e.job().cross_rank; })
      .def_property_readonly("cross_size", [](const Engine& e) { return e.job().cross_size; })
      .def_property_readonly("homogeneous", [](const Engine& e) { return e.job().homogeneous; })
      .def_property_readonly("mpi_thread_level", [](const Engine& e) { return e.job().thread_level; })
      .def("set_hierarchical",  // benchmarks: see engine_monitoring.h
           [](Engine& e, bool allreduce, bool allgather) { e.monitoring().SetHierarchical(allreduce, allgather); })
      .def("autotune_state",  // collectives/autotune.py
           [](Engine& e) {
             const AutotuneState s = e.monitoring().autotune_state();
             py::dict d;
             d["enabled"] = s.enabled;
             d["tuning"] = s.tuning;
             d["fusion_threshold"] = s.params.fusion_threshold;
             d["cycle_time_ms"] = s.params.cycle_time_ms;
             d["hierarchical_allreduce"] = s.params.hierarchical_allreduce;
             d["hierarchical_allgather"] = s.params.hierarchical_allgather;
             d["samples"] = s.samples;
             d["best_score"] = s.best_score;
             return d;
           })
      .def_property_readonly("gpu_device", [](Engine& e) { return e.monitoring().gpu_device(); })
      // NCCL allreduce launches so far (benchmarks: how well GPU gradients fused).
      .def_property_readonly("gpu_allreduce_launches",
                             [](Engine& e) { return e.monitoring().gpu_allreduce_launches(); })
      .def("enqueue",
           // caller_waits: the caller waits for these next (a synchronous verb; EngineRequests::Enqueue).
           [](Engine& e, const py::list& submissions, bool caller_waits) {
             std::vector<Submission> subs;
             subs.reserve(submissions.size());
             for (const auto& item : submissions) subs.push_back(item.cast<const Submission&>());
             std::vector<int64_t> handles;
             Status st = e.requests().Enqueue(std::move(subs), &handles, caller_waits);
             return py::make_tuple(static_cast<int>(st.code), st.message, handles);
           },
           py::arg("submissions"), py::arg("caller_waits") = false)
      .def("announce_failure",
           // The requests (engine.Submission: op, name, group, group_size, process_set) this rank
           // could not submit; the other ranks fail those names with `reason` (EngineRequests::AnnounceFailure).
           [](Engine& e, const py::list& specs, const std::string& reason) {
             std::vector<Request> reqs;
             for (const auto& item : specs) reqs.push_back(item.cast<const Submission&>().request);
             e.requests().AnnounceFailure(std::move(reqs), reason);
           })
      .def("check_layout",
           // (code, message): the one-time check that every rank of the set reduces the same
           // gradient layout (layout_check.h; adapters/tensorflow/gradient_reducer.py). Waits
           // without the GIL, running Python's signal handlers as wait() does.
           [](Engine& e, const std::string& name, const std::string& record, int32_t process_set) {
             if (e.lifetime().forked_child())
               return StatusTuple(Status::Error(StatusCode::NOT_INITIALIZED, ForkedChildMessage(e.lifetime().owner_pid())));
             const Status st = CheckLayout(&e, name, record, process_set, [&](int64_t handle) {
               for (bool first = true;; first = false) {
                 bool done = false;
                 gil::WithoutGil([&] { done = e.requests().Wait(handle, first, kSignalCheck); });
                 if (done) return;
                 if (PyErr_CheckSignals() != 0) throw py::error_already_set();
               }
             });
             return StatusTuple(st);
           },
           py::arg("name"), py::arg("record"), py::arg("process_set"))
      .def("poll", [](Engine& e, int64_t handle) { return e.requests().Poll(handle); })
      .def("wait",
           // Blocks without the GIL, then removes the handle and returns
           // (code, message, engine_output_or_None, output_shape, received_splits, value); value is
           // join's last rank to join, or a new process set's id. Python's signal handlers run
           // while it blocks; one that raises (KeyboardInterrupt) leaves the handle uncollected, so
           // a later wait still returns its outcome.
           [](Engine& e, int64_t handle) {
             if (e.lifetime().forked_child()) {
               Result r;
               r.status = Status::Error(StatusCode::NOT_INITIALIZED, ForkedChildMessage(e.lifetime().owner_pid()));
               return ResultTuple(std::move(r));
             }
             for (bool first = true;; first = false) {
               bool done = false;
               gil::WithoutGil([&] { done = e.requests().Wait(handle, first, kSignalCheck); });
               if (done) break;
               if (PyErr_CheckSignals() != 0) throw py::error_already_set();
             }
             return ResultTuple(e.requests().Collect(handle));
           })
      .def("start_timeline",
           [](Engine& e, const std::string& path, bool mark_cycles) {
             return StatusTuple(e.monitoring().StartTimeline(path, mark_cycles));
           })
      .def("stop_timeline", [](Engine& e) { gil::WithoutGil([&] { e.monitoring().StopTimeline(); }); });

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
  m.def("forked_child_message", &ForkedChildMessage, py::arg("parent_pid"));
  // "" once TensorFlow's ops are registered (tensorflow_kernels.h), else why they are not.
  m.def("register_tensorflow_kernels", &RegisterTensorflowKernels);
  m.def("set_log_level", [](int level) { SetLogLevel(static_cast<LogLevel>(level)); });
  // float16/bfloat16 arithmetic as the MPI reductions and scaling run it (tests compare the
  // vector and the portable paths against numpy): op 0-3 reduces `in` into `inout` (Sum, Min,
  // Max, Product); op -1 scales `inout` by `factor`.
  m.def("half_math_for_testing", [](bool bf16, int op, py::array_t<uint16_t> in, py::array_t<uint16_t> inout,
                                    double factor, bool portable) {
    if (in.size() != inout.size()) throw py::value_error("in and inout differ in size");
    SetHalfPortableForTesting(portable);
    const HalfKind kind = bf16 ? HalfKind::BFLOAT16 : HalfKind::FLOAT16;
    uint16_t* out = inout.mutable_data();
    if (op < 0)
      ScaleHalf(kind, out, out, inout.size(), static_cast<float>(factor));
    else
      ReduceHalf(kind, static_cast<HalfOp>(op), in.data(), out, inout.size());
    const char* path = HalfPathName();
    SetHalfPortableForTesting(false);
    return std::string(path);
  });
  // The host reductions' vector loops (local_reduce.h), for tests that compare them with MPI's
  // operators: reduces `in` into `inout` (numpy arrays of one dtype); returns the loop used, or
  // None when the pair is left to MPI_Reduce_local (and nothing was done).
  m.def("local_reduce_for_testing", [](int dtype, int op, py::array in, py::array inout, bool portable) -> py::object {
    if (in.nbytes() != inout.nbytes() || !(inout.flags() & py::array::c_style) || !(in.flags() & py::array::c_style))
      throw py::value_error("in and inout must be C-contiguous and of one size");
    if (!IsValidDataType(dtype) || !IsValidReduceOp(op)) throw py::value_error("bad dtype or op");
    const int64_t count = static_cast<int64_t>(in.nbytes()) / DataTypeSize(static_cast<DataType>(dtype));
    SetLocalReducePortableForTesting(portable);
    const bool done = ReduceLocalFast(in.data(), inout.mutable_data(), count, static_cast<DataType>(dtype),
                                      static_cast<ReduceOp>(op));
    const std::string path = LocalReducePathName();
    SetLocalReducePortableForTesting(false);
    if (!done) return py::none();
    return py::str(path);
  });
  // The host buffer pool's counters (buffer_pool.h), for tests and memory diagnostics.
  m.def("buffer_pool_stats", []() {
    const BufferPoolStats s = GetBufferPoolStats();
    py::dict d;
    d["limit_bytes"] = s.limit_bytes;
    d["idle_bytes"] = s.idle_bytes;
    d["idle_buffers"] = s.idle_buffers;
    d["in_use_bytes"] = s.in_use_bytes;
    d["in_use_buffers"] = s.in_use_buffers;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["evictions"] = s.evictions;
    return d;
  });
  m.def("mpi_library_version", &MpiLibraryVersion);
  m.def("mpi_version", []() {
    int major = 0, minor = 0;
    MPI_Get_version(&major, &minor);
    return py::make_tuple(major, minor);
  });
}
