// engine.submission and the Python classes Submission and DeviceTensor (collectives/submissions.py):
// one request with its buffers, converted to the engine's types once, here, at the boundary.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <climits>
#include <string>
#include <vector>

#include "python/bindings_common.h"

namespace collectives {
namespace {

// A tensor in GPU memory, as Python describes it (engine.DeviceTensor): device -2: unknown
// (the engine asks the driver); stream: the producer's (0 and 1: the legacy default stream, 2:
// the calling thread's default stream).
struct DeviceTensor {
  uintptr_t ptr = 0;
  std::vector<int64_t> shape;
  int32_t device = -2;
  uintptr_t stream = 0;
};

DeviceTensor MakeDeviceTensor(uintptr_t ptr, std::vector<int64_t> shape, int32_t device, uintptr_t stream) {
  if (device < -2 || device == -1) throw py::value_error("a GPU tensor's device must be >= 0 (or -2: unknown)");
  return DeviceTensor{ptr, std::move(shape), device, stream};
}

// Where a submission reads and writes: C-contiguous numpy arrays (taking pointer and shape here
// costs far less than numpy's ctypes interface in Python), DeviceTensors, or None (no output:
// the engine allocates it). Both in GPU memory or both on the host.
void SetBuffers(Submission& s, py::handle input, py::handle output) {
  Request& q = s.request;
  const bool host = (input.is_none() || py::isinstance<py::array>(input)) &&
                    (output.is_none() || py::isinstance<py::array>(output));
  if (host) {
    if (!input.is_none()) {
      const auto in = py::reinterpret_borrow<py::array>(input);
      s.input = in.data();
      q.shape.assign(in.shape(), in.shape() + in.ndim());
    }
    if (!output.is_none()) s.output = py::reinterpret_borrow<py::array>(output).mutable_data();
    return;
  }
  for (py::handle h : {input, output})
    if (!h.is_none() && !py::isinstance<DeviceTensor>(h))
      throw py::type_error("a submission's input and output are numpy arrays, or both engine.DeviceTensor (or None)");
  // The input describes the request; an output alone (no input) does.
  const auto& described = (input.is_none() ? output : input).cast<const DeviceTensor&>();
  q.shape = described.shape;
  q.device = described.device;
  s.stream = described.stream;
  if (!input.is_none()) s.input = reinterpret_cast<const void*>(input.cast<const DeviceTensor&>().ptr);
  if (!output.is_none()) s.output = reinterpret_cast<void*>(output.cast<const DeviceTensor&>().ptr);
}

// engine.submission(op, name, input=None, output=None, dtype=0, reduce_op=SUM, root=0,
// prescale=1.0, postscale=1.0, splits=(), group="", group_size=0, process_set=0): one request as
// an engine.Submission, its fields named as Request's (message.h) and converted to the engine's
// types once, here (enqueue then copies the struct). A plain CPython function: pybind11's
// dispatcher took 0.5-0.9 us for these 13 arguments, more than the rest of the Python work of an
// 8-byte allreduce_async.
constexpr const char* kSubmissionFields[] = {"op",       "name",      "input", "output", "dtype",
                                             "reduce_op", "root",     "prescale", "postscale", "splits",
                                             "group",    "group_size", "process_set"};
constexpr int kNumSubmissionFields = 13;
PyObject* g_field_names[kNumSubmissionFields];  // interned, when the module loads

int32_t Int32Field(PyObject* value, const char* field) {
  if (!PyLong_Check(value)) throw py::type_error(std::string("submission: ") + field + " must be an int");
  const long v = PyLong_AsLong(value);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (v < INT32_MIN || v > INT32_MAX) throw py::value_error(std::string("submission: ") + field + " out of range");
  return static_cast<int32_t>(v);
}

double DoubleField(PyObject* value) {
  const double v = PyFloat_AsDouble(value);
  if (v == -1.0 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

std::string TextField(PyObject* value, const char* field) {
  if (!PyUnicode_Check(value)) throw py::type_error(std::string("submission: ") + field + " must be a str");
  Py_ssize_t len = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(value, &len);
  if (utf8 == nullptr) throw py::error_already_set();
  return std::string(utf8, static_cast<size_t>(len));
}

Submission SubmissionFromFields(PyObject* const* f) {
  Submission s;
  Request& q = s.request;
  q.op = static_cast<OpType>(Int32Field(f[0], "op"));
  q.name = TextField(f[1], "name");
  SetBuffers(s, f[2] ? f[2] : Py_None, f[3] ? f[3] : Py_None);
  q.dtype = static_cast<DataType>(f[4] ? Int32Field(f[4], "dtype") : 0);
  if (f[5]) q.reduce_op = static_cast<ReduceOp>(Int32Field(f[5], "reduce_op"));
  if (f[6]) q.root = Int32Field(f[6], "root");
  if (f[7]) q.prescale = DoubleField(f[7]);
  if (f[8]) q.postscale = DoubleField(f[8]);
  if (f[9] && PyObject_Length(f[9]) != 0) q.splits = py::handle(f[9]).cast<std::vector<int64_t>>();
  if (f[10]) q.group = TextField(f[10], "group");
  if (f[11]) q.group_size = Int32Field(f[11], "group_size");
  if (f[12]) q.process_set = Int32Field(f[12], "process_set");
  return s;
}

int FieldIndex(PyObject* key) {
  for (int i = 0; i < kNumSubmissionFields; ++i)
    if (key == g_field_names[i]) return i;  // keywords written in code are interned: the same objects
  for (int i = 0; i < kNumSubmissionFields; ++i)
    if (PyUnicode_Compare(key, g_field_names[i]) == 0) return i;
  return -1;
}

PyObject* NewSubmission(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  try {
    PyObject* fields[kNumSubmissionFields] = {};
    if (nargs > kNumSubmissionFields) throw py::type_error("submission() takes at most 13 arguments");
    for (Py_ssize_t i = 0; i < nargs; ++i) fields[i] = args[i];
    const Py_ssize_t named = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < named; ++k) {
      PyObject* key = PyTuple_GET_ITEM(kwnames, k);
      const int i = FieldIndex(key);
      if (i < 0)
        throw py::type_error("submission() got an unexpected keyword argument " + py::repr(key).cast<std::string>());
      if (fields[i]) throw py::type_error(std::string("submission() got two values for ") + kSubmissionFields[i]);
      fields[i] = args[nargs + k];
    }
    if (!fields[0] || !fields[1]) throw py::type_error("submission() needs op and name");
    return py::cast(SubmissionFromFields(fields)).release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

PyMethodDef g_new_submission = {"submission",
                                reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&NewSubmission)),
                                METH_FASTCALL | METH_KEYWORDS,
                                "submission(op, name, input=None, output=None, dtype=0, reduce_op=SUM, root=0, "
                                "prescale=1.0, postscale=1.0, splits=(), group='', group_size=0, process_set=0)"};

// The engine's Submission and DeviceTensor as Python classes with named fields (collectives/submissions.py).
}  // namespace

void DefineSubmission(py::module_& m) {
  py::class_<DeviceTensor>(m, "DeviceTensor")
      .def(py::init(&MakeDeviceTensor), py::arg("ptr"), py::arg("shape"), py::arg("device"), py::arg("stream"))
      .def_readonly("ptr", &DeviceTensor::ptr)
      .def_readonly("shape", &DeviceTensor::shape)
      .def_readonly("device", &DeviceTensor::device)
      .def_readonly("stream", &DeviceTensor::stream);
  auto request = [](auto field) { return [field](const Submission& s) { return s.request.*field; }; };
  for (int i = 0; i < kNumSubmissionFields; ++i) g_field_names[i] = PyUnicode_InternFromString(kSubmissionFields[i]);
  m.attr("submission") = py::reinterpret_steal<py::object>(PyCFunction_New(&g_new_submission, nullptr));
  py::class_<Submission>(m, "Submission")  // built by engine.submission, read back by these names
      .def_property_readonly("op", [](const Submission& s) { return static_cast<int>(s.request.op); })
      .def_property_readonly("name", request(&Request::name))
      .def_property_readonly("dtype", [](const Submission& s) { return static_cast<int>(s.request.dtype); })
      .def_property_readonly("reduce_op", [](const Submission& s) { return static_cast<int>(s.request.reduce_op); })
      .def_property_readonly("root", request(&Request::root))
      .def_property_readonly("prescale", request(&Request::prescale))
      .def_property_readonly("postscale", request(&Request::postscale))
      .def_property_readonly("shape", request(&Request::shape))
      .def_property_readonly("splits", request(&Request::splits))
      .def_property_readonly("device", request(&Request::device))
      .def_property_readonly("group", request(&Request::group))
      .def_property_readonly("group_size", request(&Request::group_size))
      .def_property_readonly("process_set", request(&Request::process_set));
}

}  // namespace collectives
