// What the engine's Python bindings share between their files (bindings.cc, allreduce_now.cc).
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <memory>
#include <vector>

#include "common/buffer_pool.h"
#include "core/engine.h"
#include "frontend/engine_slot.h"

namespace py = pybind11;

namespace collectives {

// A numpy array over 64-byte aligned engine memory (TensorFlow requires that alignment of
// memory it borrows; numpy's own allocations are 16-byte aligned).
inline py::array AlignedEmpty(const std::vector<int64_t>& shape, const py::dtype& dtype) {
  const int64_t bytes = NumElements(shape) * static_cast<int64_t>(dtype.itemsize());
  auto* holder = new std::shared_ptr<HostBuffer>(std::make_shared<HostBuffer>(bytes));
  void* data = (*holder)->data();
  py::capsule owner(holder, [](void* p) { delete static_cast<std::shared_ptr<HostBuffer>*>(p); });
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  return py::array(dtype, dims, data, owner);
}

// How often a thread blocked in wait() takes the GIL back to run Python's signal handlers
// (Ctrl-C's KeyboardInterrupt, SIGALRM, ...): they run only when the main thread executes Python.
constexpr auto kSignalCheck = std::chrono::milliseconds(20);

// Python owns engines through this deleter. Two are never destroyed: a forked child's copy (its
// threads and locks belong to the parent; destroying its condition variables hung the child)
// and an engine whose init timed out (its thread, stuck in MPI, still uses it).
struct EngineDeleter {
  void operator()(Engine* e) const {
    if (e->lifetime().forked_child() || e->lifetime().abandoned()) return;
    // Shut down first, so that a framework kernel waiting on it (engine_slot.h) returns.
    e->Shutdown();
    ClearSlotEngine(e);
    delete e;
  }
};

// engine.submission, engine.Submission and engine.DeviceTensor (submission_binding.cc).
void DefineSubmission(py::module_& m);

// engine.allreduce_now (allreduce_now.cc).
void DefineAllreduceNow(py::class_<Engine, std::unique_ptr<Engine, EngineDeleter>>& engine);

}  // namespace collectives
