// A TensorFlow op that reduces a training step's gradients through the engine without Python:
// CollectivesReduceGradients, registered at run time through TensorFlow's C API
// (tensorflow_c_api.h), so the engine is still built without TensorFlow.
//
// Why: inside a tf.function (Keras model.fit's train step, DistributedGradientTape) the
// adapter otherwise reaches the engine through one tf.py_function per step, which costs about
// 0.5 ms of TensorFlow's own Python hand-off plus the numpy conversions and the hop's Python
// (issue 14, item 4). This kernel does what that hop's numpy function does
// (adapters/tensorflow/gradient_reducer.py, gradient_buckets.py), in the same layout and
// under the same names:
//   - each group of inputs is packed, one flat 64-byte aligned buffer per dtype (in order of
//     first use), each member starting at a 64-byte boundary, gaps zeroed;
//   - a group with one buffer is one request named `<base>.g<j>`; a group with several is a
//     grouped request `<base>.g<j>` of members `<base>.g<j>_<b+1>of<n>`; each is reduced in place;
//   - the outputs are tensors over the buffer's memory (no copy back), which keep it alive;
//   - before the first reduction of a layout on this engine, the layout check (layout_check.h)
//     under the attribute `layout_check`'s name: ranks whose gradients' shapes differ fail
//     there, every one with FailedPreconditionError, instead of waiting for each other.
// Errors come back as TensorFlow statuses of the types Horovod's ops use (as
// adapters/tensorflow/errors.py maps them); bad input found here before submitting fails the
// names on the other ranks too, as the Python layer's failing_together does.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "common/buffer_pool.h"
#include "core/engine.h"
#include "frontend/engine_slot.h"
#include "frontend/layout_check.h"
#include "tensorflow/tensorflow_c_api.h"
#include "tensorflow/tensorflow_kernels.h"

namespace collectives {
namespace {

const tf::Api* g_tf = nullptr;

constexpr const char* kOpName = "CollectivesReduceGradients";
constexpr int64_t kAlignment = 64;

// The engine dtype of a TensorFlow dtype; false for one the op does not take.
bool EngineDtype(int tf_dtype, DataType* out) {
  switch (tf_dtype) {
    case tf::kFloat: *out = DataType::FLOAT32; return true;
    case tf::kDouble: *out = DataType::FLOAT64; return true;
    case tf::kInt32: *out = DataType::INT32; return true;
    case tf::kUint8: *out = DataType::UINT8; return true;
    case tf::kInt16: *out = DataType::INT16; return true;
    case tf::kInt8: *out = DataType::INT8; return true;
    case tf::kInt64: *out = DataType::INT64; return true;
    case tf::kBool: *out = DataType::BOOL; return true;
    case tf::kBfloat16: *out = DataType::BFLOAT16; return true;
    case tf::kHalf: *out = DataType::FLOAT16; return true;
    default: return false;
  }
}

// The TensorFlow error type Horovod's ops give each engine status (adapters/tensorflow/errors.py).
int TfCode(StatusCode code) {
  switch (code) {
    case StatusCode::OK: return tf::kOk;
    case StatusCode::INVALID_ARGUMENT:
    case StatusCode::UNSUPPORTED_TYPE:
    case StatusCode::DUPLICATE_NAME: return tf::kInvalidArgument;
    case StatusCode::NOT_INITIALIZED:
    case StatusCode::MISMATCH: return tf::kFailedPrecondition;
    case StatusCode::SHUT_DOWN:
    case StatusCode::TIMEOUT: return tf::kAborted;
    default: return tf::kUnknown;
  }
}

// A TF_Status owned here.
struct TfStatus {
  TF_Status* s = g_tf->NewStatus();
  ~TfStatus() { g_tf->DeleteStatus(s); }
  bool ok() const { return g_tf->GetCode(s) == tf::kOk; }
};

void Fail(TF_OpKernelContext* ctx, int code, const std::string& message) {
  TfStatus st;
  g_tf->SetStatus(st.s, code, message.c_str());
  g_tf->OpKernelContext_Failure(ctx, st.s);
}

// What the op's attributes say, read once per kernel instance.
struct ReduceAttrs {
  std::string base_name;
  std::vector<int32_t> group_sizes;
  ReduceOp reduce_op = ReduceOp::AVERAGE;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t process_set = 0;
  // The one-time check that every rank reduces the same layout (layout_check.h): its name
  // (empty: none) and this rank's record, made by the Python side when the graph was traced
  // (the op takes only fully known shapes).
  std::string layout_check;
  std::string layout;
};

// One input's place in a packed buffer, in elements.
struct Member {
  int input = 0;
  int64_t start = 0;
  int64_t count = 0;
};

// One flat buffer of a group: its dtype, members, gaps and request.
struct Bucket {
  int tf_dtype = 0;
  DataType dtype = DataType::FLOAT32;
  std::vector<Member> members;
  std::vector<std::pair<int64_t, int64_t>> gaps;  // [start, stop) in elements, zeroed
  int64_t total = 0;
  std::shared_ptr<HostBuffer> buffer;
};

// One input as the kernel sees it.
struct Input {
  TF_Tensor* tensor = nullptr;
  int tf_dtype = 0;
  DataType dtype = DataType::FLOAT32;
  std::vector<int64_t> dims;
  int64_t count = 0;
};

// A string attribute; false (with `st` set) when it cannot be read.
bool GetStringAttr(TF_OpKernelConstruction* ctx, const char* name, std::string* out, TF_Status* st) {
  int32_t list_size = 0, total_size = 0;
  g_tf->OpKernelConstruction_GetAttrSize(ctx, name, &list_size, &total_size, st);
  if (g_tf->GetCode(st) != tf::kOk) return false;
  out->assign(static_cast<size_t>(total_size), '\0');
  if (total_size > 0) g_tf->OpKernelConstruction_GetAttrString(ctx, name, &(*out)[0], out->size(), st);
  return g_tf->GetCode(st) == tf::kOk;
}

void* CreateReduce(TF_OpKernelConstruction* ctx) {
  TfStatus st;
  auto attrs = std::make_unique<ReduceAttrs>();
  int32_t list_size = 0, total_size = 0;
  if (GetStringAttr(ctx, "base_name", &attrs->base_name, st.s) &&
      GetStringAttr(ctx, "layout_check", &attrs->layout_check, st.s))
    GetStringAttr(ctx, "layout", &attrs->layout, st.s);
  if (st.ok()) g_tf->OpKernelConstruction_GetAttrSize(ctx, "group_sizes", &list_size, &total_size, st.s);
  if (st.ok()) {
    attrs->group_sizes.resize(static_cast<size_t>(list_size));
    g_tf->OpKernelConstruction_GetAttrInt32List(ctx, "group_sizes", attrs->group_sizes.data(), list_size, st.s);
  }
  int32_t op = 0;
  if (st.ok()) g_tf->OpKernelConstruction_GetAttrInt32(ctx, "reduce_op", &op, st.s);
  attrs->reduce_op = static_cast<ReduceOp>(op);
  if (st.ok()) g_tf->OpKernelConstruction_GetAttrInt32(ctx, "process_set", &attrs->process_set, st.s);
  // Two doubles as Python's repr writes them (exact; a TensorFlow float attribute has 32 bits).
  std::string scales;
  if (st.ok() && GetStringAttr(ctx, "scales", &scales, st.s)) {
    char* end = nullptr;
    attrs->prescale = std::strtod(scales.c_str(), &end);
    attrs->postscale = std::strtod(end, nullptr);
    return attrs.release();
  }
  g_tf->OpKernelConstruction_Failure(ctx, st.s);
  return nullptr;
}

void DeleteReduce(void* state) { delete static_cast<ReduceAttrs*>(state); }

// The buckets of inputs [first, first + n): one per dtype, in order of first use.
std::vector<Bucket> PlanGroup(const std::vector<Input>& inputs, int first, int n) {
  std::vector<Bucket> buckets;
  for (int i = first; i < first + n; ++i) {
    Bucket* b = nullptr;
    for (Bucket& c : buckets)
      if (c.tf_dtype == inputs[i].tf_dtype) b = &c;
    if (b == nullptr) {
      buckets.emplace_back();
      b = &buckets.back();
      b->tf_dtype = inputs[i].tf_dtype;
      b->dtype = inputs[i].dtype;
    }
    const int64_t step = std::max<int64_t>(1, kAlignment / DataTypeSize(b->dtype));
    const int64_t stop = b->total + inputs[i].count;
    b->members.push_back({i, b->total, inputs[i].count});
    const int64_t end = (stop + step - 1) / step * step;
    if (end > stop) b->gaps.emplace_back(stop, end);
    b->total = end;
  }
  return buckets;
}

void Pack(Bucket* b, const std::vector<Input>& inputs) {
  const int64_t item = DataTypeSize(b->dtype);
  b->buffer = std::make_shared<HostBuffer>(std::max<int64_t>(b->total * item, 1));
  char* flat = static_cast<char*>(b->buffer->data());
  for (const Member& m : b->members)
    if (m.count > 0) std::memcpy(flat + m.start * item, g_tf->TensorData(inputs[m.input].tensor), m.count * item);
  for (const auto& gap : b->gaps) std::memset(flat + gap.first * item, 0, (gap.second - gap.first) * item);
}

Request GroupRequest(const ReduceAttrs& a, const Bucket& b, const std::string& group, size_t index, size_t n) {
  Request q;
  q.op = OpType::ALLREDUCE;
  // Horovod's names for a group's members, as collectives/arguments.py member_names gives them
  q.name = n == 1 ? group : group + "_" + std::to_string(index + 1) + "of" + std::to_string(n);
  q.dtype = b.dtype;
  q.reduce_op = a.reduce_op;
  q.prescale = a.prescale;
  q.postscale = a.postscale;
  q.shape = {b.total};
  q.process_set = a.process_set;
  if (n > 1) {
    q.group = group;
    q.group_size = static_cast<int32_t>(n);
  }
  return q;
}

void ReleaseView(void*, size_t, void* holder) { delete static_cast<std::shared_ptr<HostBuffer>*>(holder); }

// Hands member `m` of `b` to TensorFlow as output `m.input`, over the buffer's memory.
bool SetOutputView(TF_OpKernelContext* ctx, const Bucket& b, const Member& m, const Input& in) {
  TfStatus st;
  const int64_t item = DataTypeSize(b.dtype);
  const size_t bytes = static_cast<size_t>(m.count * item);
  if (bytes == 0) {
    TF_Tensor* t = g_tf->AllocateOutput(ctx, m.input, in.tf_dtype, in.dims.data(), static_cast<int>(in.dims.size()),
                                        0, st.s);
    if (t != nullptr) g_tf->DeleteTensor(t);
  } else {
    char* data = static_cast<char*>(b.buffer->data()) + m.start * item;
    TF_Tensor* t = g_tf->NewTensor(in.tf_dtype, in.dims.data(), static_cast<int>(in.dims.size()), data, bytes,
                                   ReleaseView, new std::shared_ptr<HostBuffer>(b.buffer));
    if (t == nullptr) {
      g_tf->SetStatus(st.s, tf::kInternal, "collectives: TensorFlow refused an output view");
    } else {
      g_tf->SetOutput(ctx, m.input, t, st.s);
      g_tf->DeleteTensor(t);
    }
  }
  if (!st.ok()) g_tf->OpKernelContext_Failure(ctx, st.s);
  return st.ok();
}

void ComputeReduce(void* state, TF_OpKernelContext* ctx) {
  const ReduceAttrs& a = *static_cast<const ReduceAttrs*>(state);
  const int n = g_tf->NumInputs(ctx);
  std::vector<Input> inputs(static_cast<size_t>(n));
  struct Release {
    std::vector<Input>* inputs;
    ~Release() {
      for (Input& in : *inputs)
        if (in.tensor != nullptr) g_tf->DeleteTensor(in.tensor);
    }
  } release{&inputs};
  for (int i = 0; i < n; ++i) {
    TfStatus st;
    g_tf->GetInput(ctx, i, &inputs[i].tensor, st.s);
    if (!st.ok()) return g_tf->OpKernelContext_Failure(ctx, st.s);
    Input& in = inputs[i];
    in.tf_dtype = g_tf->TensorType(in.tensor);
    if (!EngineDtype(in.tf_dtype, &in.dtype)) return Fail(ctx, tf::kInvalidArgument, "collectives: unsupported dtype");
    in.dims.resize(static_cast<size_t>(g_tf->NumDims(in.tensor)));
    for (size_t d = 0; d < in.dims.size(); ++d) in.dims[d] = g_tf->Dim(in.tensor, static_cast<int>(d));
    in.count = NumElements(in.dims);
  }

  EngineLease lease;
  Engine* e = lease.get();
  if (e == nullptr || e->lifetime().forked_child())
    return Fail(ctx, tf::kFailedPrecondition,
                e == nullptr ? "collectives has not been initialized; call init() first"
                             : "collectives: this process was forked from the one that called init()");
  EngineRequests& calls = e->requests();

  // The first time on this engine that this layout is reduced, every rank checks that the others
  // reduce the same one (a shape that differs would give them different names, and a stall):
  // before anything is submitted, so that a mismatch leaves nothing pending.
  if (!a.layout_check.empty()) {
    const Status checked = CheckLayout(e, a.layout_check, a.layout, a.process_set, [&calls](int64_t h) {
      for (bool first = true; !calls.Wait(h, first, std::chrono::milliseconds(1000), /*run_cycles=*/false); first = false) {
      }
    });
    if (!checked.ok()) return Fail(ctx, TfCode(checked.code), checked.message);
  }

  // Plan every group and its requests first, so that a failure to pack can name them all.
  std::vector<std::vector<Bucket>> groups;
  std::vector<std::vector<Request>> requests;
  int first = 0;
  for (size_t j = 0; j < a.group_sizes.size(); ++j) {
    const int size = a.group_sizes[j];
    if (size < 0 || first + size > n) return Fail(ctx, tf::kInvalidArgument, "collectives: bad group_sizes");
    groups.push_back(PlanGroup(inputs, first, size));
    const std::string group = a.base_name + ".g" + std::to_string(j);
    std::vector<Request> reqs;
    for (size_t b = 0; b < groups.back().size(); ++b)
      reqs.push_back(GroupRequest(a, groups.back()[b], group, b, groups.back().size()));
    requests.push_back(std::move(reqs));
    first += size;
  }

  std::vector<int64_t> handles;
  Status failure;
  int failure_code = tf::kOk;  // the TensorFlow type of `failure`
  // After a failure at group j, the other ranks must not wait for the groups not sent.
  auto announce_from = [&](size_t j) {
    std::vector<Request> unsent;
    for (size_t k = j; k < requests.size(); ++k) unsent.insert(unsent.end(), requests[k].begin(), requests[k].end());
    if (!unsent.empty()) calls.AnnounceFailure(std::move(unsent), failure.message);
  };
  for (size_t j = 0; j < groups.size() && failure.ok(); ++j) {
    try {
      for (Bucket& b : groups[j]) Pack(&b, inputs);
    } catch (const std::bad_alloc&) {
      failure = Status::Error(StatusCode::INTERNAL, "collectives: no memory for the gradients' buffer (MemoryError)");
      failure_code = tf::kResourceExhausted;
      announce_from(j);
      break;
    }
    std::vector<Submission> subs;
    for (size_t b = 0; b < groups[j].size(); ++b) {
      Submission s;
      s.request = requests[j][b];
      s.input = s.output = groups[j][b].buffer->data();
      subs.push_back(std::move(s));
    }
    std::vector<int64_t> ids;
    failure = calls.Enqueue(std::move(subs), &ids, /*caller_waits=*/false);
    handles.insert(handles.end(), ids.begin(), ids.end());
    if (!failure.ok()) {
      failure_code = TfCode(failure.code);
      announce_from(j + 1);  // group j: Enqueue announces the names whose input it rejects
    }
  }
  // Every submitted request writes into its buffer until it completes: wait for all of them.
  // The engine thread runs the cycles, not this TensorFlow thread: in model.fit, cycles run
  // inline on it waited for the peer and for their wake-ups behind TensorFlow's other threads
  // (an MLP's 670k gradients, np=2: 5.9-13 ms per step against 4.9-5.1 ms; stage means of
  // negotiation 0.8-1.5 ms against 0.3-0.4 ms, hand-back 0.5-5.8 ms against 0.03-0.07 ms).
  for (const int64_t h : handles) {
    for (bool first = true; !calls.Wait(h, first, std::chrono::milliseconds(1000), /*run_cycles=*/false); first = false) {
    }
    Result r = calls.Collect(h);
    if (!r.status.ok() && failure.ok()) {
      failure = r.status;
      failure_code = TfCode(failure.code);
    }
  }
  if (!failure.ok()) return Fail(ctx, failure_code, failure.message);

  for (const auto& group : groups)
    for (const Bucket& b : group)
      for (const Member& m : b.members)
        if (!SetOutputView(ctx, b, m, inputs[m.input])) return;
}

// Output i has input i's shape.
void SameShapes(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  const int64_t n = g_tf->ShapeInferenceContextNumInputs(ctx);
  TF_ShapeHandle* shape = g_tf->NewShapeHandle();
  for (int i = 0; i < n && g_tf->GetCode(status) == tf::kOk; ++i) {
    g_tf->ShapeInferenceContextGetInput(ctx, i, shape, status);
    if (g_tf->GetCode(status) == tf::kOk) g_tf->ShapeInferenceContextSetOutput(ctx, i, shape, status);
  }
  g_tf->DeleteShapeHandle(shape);
}

std::string Register() {
  std::string why;
  g_tf = tf::LoadApi(&why);
  if (g_tf == nullptr) return why;
  TfStatus st;
  TF_OpDefinitionBuilder* op = g_tf->NewOpDefinitionBuilder(kOpName);
  g_tf->OpDefinitionBuilderAddInput(op, "tensors: T");
  g_tf->OpDefinitionBuilderAddOutput(op, "reduced: T");
  g_tf->OpDefinitionBuilderAddAttr(op, "T: list({float, double, int32, uint8, int16, int8, int64, bool, bfloat16, half})");
  g_tf->OpDefinitionBuilderAddAttr(op, "group_sizes: list(int)");
  g_tf->OpDefinitionBuilderAddAttr(op, "base_name: string");
  g_tf->OpDefinitionBuilderAddAttr(op, "reduce_op: int");
  g_tf->OpDefinitionBuilderAddAttr(op, "scales: string");
  g_tf->OpDefinitionBuilderAddAttr(op, "process_set: int");
  g_tf->OpDefinitionBuilderAddAttr(op, "layout_check: string = ''");
  g_tf->OpDefinitionBuilderAddAttr(op, "layout: string = ''");
  // Stateful: never pruned, merged or constant-folded, and run in program order in a tf.function.
  g_tf->OpDefinitionBuilderSetIsStateful(op, true);
  g_tf->OpDefinitionBuilderSetShapeInferenceFunction(op, SameShapes);
  g_tf->RegisterOpDefinition(op, st.s);
  if (!st.ok()) return std::string("registering the op: ") + g_tf->Message(st.s);
  TF_KernelBuilder* kernel = g_tf->NewKernelBuilder(kOpName, "CPU", CreateReduce, ComputeReduce, DeleteReduce);
  g_tf->RegisterKernelBuilder("CollectivesReduceGradientsCpu", kernel, st.s);
  if (!st.ok()) return std::string("registering the kernel: ") + g_tf->Message(st.s);
  return "";
}

}  // namespace

std::string RegisterTensorflowKernels() {
  static std::once_flag once;
  static std::string problem;
  std::call_once(once, [] { problem = Register(); });
  return problem;
}

}  // namespace collectives
