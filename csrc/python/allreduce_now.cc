// engine.allreduce_now: the synchronous host allreduce of a numpy array in one call (issue 14,
// small-message latency).
//
// Why: the general path builds an engine.Submission in Python (collectives/submissions.py), enqueues
// it, gets handle ids back and calls wait() per id, then checks each outcome in Python:
// about 8 us of interpreter work per call on the 2-core VM, more than the MPI call itself (a raw
// 8-byte MPI_Allreduce between two ranks takes ~5 us). This function takes the array and the
// already resolved arguments, reads the array's pointer, shape and dtype, submits, waits
// (without the GIL, running cycles itself as every synchronous caller does), and returns the
// output array.
//
// It accepts only the call that cannot fail before reaching the engine: an exact numpy ndarray,
// C-contiguous (and writable in place), of a dtype the engine reduces, with an int op in range
// and finite int/float scale factors. Anything else returns None and the caller takes the general
// path (collectives/ops.py), whose checks and typed errors stay the only ones; since nothing was
// submitted, the request name is used there instead.
//
// Returns the output array; None (not this call); or a tuple (what, ...) that Python turns into
// what the general path would have done (collectives/handles.py, allreduce_now):
//   (kRefused, code, message, None): Enqueue refused the request (e.g. the engine stopped);
//   (kFailed, code, message, None): the request failed;
//   (kInterrupted, handle, output, exception): a signal handler raised while waiting; the request
//   runs on and will write `output`, so Python keeps the arrays alive in a Handle, then re-raises.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstring>

#include "python/bindings_common.h"
#include "core/engine.h"
#include "python/python_gil.h"

namespace py = pybind11;

namespace collectives {
namespace {

constexpr int kNpyHalf = 23;  // NPY_HALF (pybind11 names no constant for it)
constexpr bool kLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

// The engine dtype of a numpy type number, or -1. numpy's descriptor keeps `type_num` and
// `byteorder` at the same place in numpy 1 and 2 (pybind11's PyArrayDescr_Proxy).
int DtypeOfTypeNum(int type_num) {
  using A = py::detail::npy_api;
  switch (type_num) {
    case A::NPY_BOOL_: return static_cast<int>(DataType::BOOL);
    case A::NPY_BYTE_: return static_cast<int>(DataType::INT8);
    case A::NPY_UBYTE_: return static_cast<int>(DataType::UINT8);
    case A::NPY_SHORT_: return static_cast<int>(DataType::INT16);
    case A::NPY_INT_: return static_cast<int>(DataType::INT32);
    case A::NPY_LONG_: return static_cast<int>(sizeof(long) == 8 ? DataType::INT64 : DataType::INT32);
    case A::NPY_LONGLONG_: return static_cast<int>(DataType::INT64);
    case A::NPY_FLOAT_: return static_cast<int>(DataType::FLOAT32);
    case A::NPY_DOUBLE_: return static_cast<int>(DataType::FLOAT64);
    case kNpyHalf: return static_cast<int>(DataType::FLOAT16);
    default: return -1;  // unsigned wider than a byte, complex, bfloat16 (ml_dtypes), records, objects
  }
}

// A finite double from an exact int or float (not bool, not a numpy scalar); false otherwise.
bool ScaleFactor(PyObject* o, double* out) {
  if (PyFloat_CheckExact(o)) {
    *out = PyFloat_AS_DOUBLE(o);
  } else if (PyLong_CheckExact(o)) {
    *out = PyLong_AsDouble(o);
    if (*out == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
  } else {
    return false;
  }
  return std::isfinite(*out);
}

// The reduce op: None is Average; an int (ReduceOp is an IntEnum) in Horovod's range; not bool.
bool ReduceOpOf(PyObject* o, int* out) {
  if (o == Py_None) {
    *out = static_cast<int>(ReduceOp::AVERAGE);
    return true;
  }
  if (!PyLong_Check(o) || PyBool_Check(o)) return false;
  const long v = PyLong_AsLong(o);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  if (v < 0 || v > static_cast<long>(ReduceOp::PRODUCT)) return false;
  *out = static_cast<int>(v);
  return true;
}

// Outputs up to this size come from numpy's allocator; larger ones from the engine's pool,
// whose reused mappings are already faulted in (collectives/requests.py says the same).
constexpr int64_t kSmallOutputBytes = 64 * 1024;

enum Outcome { kRefused = 0, kFailed = 1, kInterrupted = 2 };

// numpy's ndarray type, looked up when the module loads. Not in a function-local static: the first
// calls may come from several threads at once, and one that blocked on the static's guard while
// holding the GIL, as another thread ran numpy's import under that guard (and needed the GIL
// back), deadlocked the process (daemon threads' first allreduces in tests/engine/test_lifecycle.py).
PyTypeObject* g_ndarray_type = nullptr;

py::object AllreduceNow(Engine& e, py::handle tensor, py::handle name, py::handle op, py::handle prescale,
                        py::handle postscale, bool inplace) {
  if (Py_TYPE(tensor.ptr()) != g_ndarray_type || !PyUnicode_CheckExact(name.ptr()) || e.lifetime().forked_child())
    return py::none();
  Submission s;
  Request& q = s.request;
  int reduce_op = 0;
  if (!ReduceOpOf(op.ptr(), &reduce_op) || !ScaleFactor(prescale.ptr(), &q.prescale) ||
      !ScaleFactor(postscale.ptr(), &q.postscale))
    return py::none();
  // The array's own fields, not the buffer protocol: numpy builds (and caches on the array) a
  // format string for each array it exports, ~5 us for the fresh view that a torch tensor's
  // .numpy() is on every call.
  const py::detail::PyArray_Proxy* arr = py::detail::array_proxy(tensor.ptr());
  const int flags = arr->flags;
  if (!(flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_) ||
      (inplace && !(flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_)))
    return py::none();
  const py::detail::PyArrayDescr_Proxy* descr = py::detail::array_descriptor_proxy(arr->descr);
  const int dtype = DtypeOfTypeNum(descr->type_num);
  if (dtype < 0 || descr->byteorder == (kLittleEndian ? '>' : '<')) return py::none();
  std::vector<int64_t> shape(arr->dimensions, arr->dimensions + arr->nd);
  const int64_t nbytes = NumElements(shape) * DataTypeSize(static_cast<DataType>(dtype));
  Py_ssize_t name_len = 0;
  const char* name_utf8 = PyUnicode_AsUTF8AndSize(name.ptr(), &name_len);
  if (name_utf8 == nullptr) {
    PyErr_Clear();
    return py::none();
  }

  py::object out;
  if (inplace) {
    out = py::reinterpret_borrow<py::object>(tensor);
    s.output = arr->data;
  } else {
    const py::dtype out_dtype = py::reinterpret_borrow<py::dtype>(arr->descr);
    try {
      py::array a = nbytes <= kSmallOutputBytes
                        ? py::array(out_dtype, std::vector<py::ssize_t>(shape.begin(), shape.end()))
                        : AlignedEmpty(shape, out_dtype);
      s.output = a.mutable_data();
      out = std::move(a);
    } catch (const std::bad_alloc&) {
      return py::none();  // the general path raises MemoryError and tells the other ranks
    } catch (const py::error_already_set&) {
      return py::none();
    }
  }
  s.input = arr->data;
  q.op = OpType::ALLREDUCE;
  q.name.assign(name_utf8, static_cast<size_t>(name_len));
  q.shape = std::move(shape);
  q.dtype = static_cast<DataType>(dtype);
  q.reduce_op = static_cast<ReduceOp>(reduce_op);

  std::vector<Submission> subs;
  subs.push_back(std::move(s));
  std::vector<int64_t> handles;
  const Status st = e.requests().Enqueue(std::move(subs), &handles, /*caller_waits=*/true);
  if (!st.ok()) return py::make_tuple(int{kRefused}, static_cast<int>(st.code), st.message, py::none());
  const int64_t handle = handles.at(0);
  for (bool first = true;; first = false) {
    bool done = false;
    gil::WithoutGil([&] { done = e.requests().Wait(handle, first, kSignalCheck); });
    if (done) break;
    if (PyErr_CheckSignals() != 0) {
      py::error_already_set raised;
      return py::make_tuple(int{kInterrupted}, handle, out, raised.value());
    }
  }
  Result r = e.requests().Collect(handle);
  if (!r.status.ok()) return py::make_tuple(int{kFailed}, static_cast<int>(r.status.code), r.status.message, py::none());
  return out;
}

}  // namespace

void DefineAllreduceNow(py::class_<Engine, std::unique_ptr<Engine, EngineDeleter>>& engine) {
  // Also initializes pybind11's numpy API table (a function-local static of its own) now, while
  // the module loads on one thread.
  g_ndarray_type = py::detail::npy_api::get().PyArray_Type_;
  engine.def("allreduce_now", &AllreduceNow, py::arg("tensor"), py::arg("name"), py::arg("op"), py::arg("prescale"),
             py::arg("postscale"), py::arg("inplace"));
}

}  // namespace collectives
