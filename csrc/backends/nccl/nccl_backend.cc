// NcclBackend: start-up, communicators, the engine stream's copies and the NCCL calls.
// The completion thread and the end of communicators are in nccl_completion.cc.
#include "backends/nccl/nccl_backend.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>

#include "gpu/gpu_copy_batch.h"
#include "gpu/gpu_loader.h"
#include "host_math/half.h"
#include "common/log.h"

namespace collectives {
namespace {

using gpu::CUDA_SUCCESS;
using gpu::CudaStatus;

int NcclType(DataType t) {
  switch (t) {
    case DataType::UINT8: return gpu::ncclUint8;
    case DataType::INT8: return gpu::ncclInt8;
    case DataType::INT32: return gpu::ncclInt32;
    case DataType::INT64: return gpu::ncclInt64;
    case DataType::FLOAT16: return gpu::ncclFloat16;
    case DataType::BFLOAT16: return gpu::ncclBfloat16;
    case DataType::FLOAT32: return gpu::ncclFloat32;
    case DataType::FLOAT64: return gpu::ncclFloat64;
    case DataType::BOOL: return gpu::ncclUint8;  // 0/1 bytes: Min is logical and, Max logical or
    case DataType::INT16: break;                 // NCCL has no 16-bit integers: staged (CanReduce)
  }
  return gpu::ncclUint8;
}

gpu::CUdeviceptr Dev(const void* p) { return static_cast<gpu::CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }
const char* At(const void* base, int64_t offset) { return static_cast<const char*>(base) + offset; }
char* At(void* base, int64_t offset) { return static_cast<char*>(base) + offset; }

bool AllEqual(const std::vector<int64_t>& v) {
  return std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v[0]; });
}

// A result that lets the caller go on: success, or (non-blocking communicators) an
// operation still in progress, which Settle waits out.
bool Going(int r) { return r == gpu::ncclSuccess || r == gpu::ncclInProgress; }

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

}  // namespace

NcclBackend::~NcclBackend() { Shutdown(Status::Error(StatusCode::SHUT_DOWN, "collectives has been shut down"), 0.0); }

Status NcclBackend::Start(int device, bool spin, double warn_s, double timeout_s) {
  if (device_ >= 0) {
    if (device == device_) return Status::Ok();
    return Status::Error(StatusCode::INVALID_ARGUMENT, "collectives uses one GPU per process: this process uses GPU " +
                                                           std::to_string(device_) + ", not GPU " + std::to_string(device));
  }
  cu_ = gpu::Libraries::Get().cuda();
  nccl_ = gpu::Libraries::Get().nccl();
  if (!cu_ || !nccl_)
    return Status::Error(StatusCode::UNSUPPORTED_TYPE,
                         "GPU tensors need the CUDA driver and NCCL: " + gpu::Libraries::Get().problem());
  gpu::Runtime& rt = gpu::Runtime::Get();
  Status st = rt.InitDevice(device);
  if (!st.ok()) return st;
  // The engine thread works in this context from now on (NCCL, which uses the CUDA runtime,
  // picks up the current driver context).
  st = CudaStatus(cu_->CtxSetCurrent(rt.Context(device)), "cuCtxSetCurrent");
  if (!st.ok()) return st;
  st = rt.EngineStream(device, &stream_);
  if (!st.ok()) return st;
  rt.SetProcessDevice(device);
  st = kernel_.Load(device);  // in this thread's (the engine's) context
  if (!st.ok() && gpu::BatchedCopy::BuiltIn())
    Log(LogLevel::INFO, "the batched copy kernel is not used (" + st.message + "): fused groups copy tensor by tensor");
  device_ = device;
  spin_ = spin;
  warn_s_ = warn_s;
  timeout_s_ = timeout_s;
  completer_ = std::thread(&NcclBackend::CompletionLoop, this);
  return Status::Ok();
}

bool NcclBackend::CanReduce(DataType dtype, ReduceOp op, double prescale, double postscale) {
  if (dtype == DataType::INT16) return false;
  const bool unscaled = prescale == 1.0 && postscale == 1.0;
  if (op == ReduceOp::MIN || op == ReduceOp::MAX || op == ReduceOp::PRODUCT) return unscaled;
  // Sum/Average: floats take any scale (one pre-multiplier); integers only ncclSum/ncclAvg,
  // whose integer division truncates toward zero as the host path does.
  return IsFloat(dtype) || unscaled;
}

bool NcclBackend::NeedsCustomOp(DataType dtype, ReduceOp op, double prescale, double postscale) {
  if (op != ReduceOp::SUM && op != ReduceOp::AVERAGE) return false;
  return IsFloat(dtype) && prescale * postscale != 1.0;
}

Status NcclBackend::NcclStatus(int result, const char* call, gpu::ncclComm comm) const {
  std::string msg = std::string("NCCL error in ") + call + ": ";
  msg += nccl_ ? nccl_->GetErrorString(result) : "error " + std::to_string(result);
  if (nccl_ && nccl_->GetLastError) {
    const char* last = nccl_->GetLastError(comm);
    if (last && *last) msg += std::string(" (") + last + ")";
  }
  return Status::Error(StatusCode::INTERNAL, msg);
}

Status NcclBackend::Live(int32_t set_id, gpu::ncclComm* out) {
  auto it = comms_.find(set_id);
  if (it == comms_.end() || !it->second.comm || !it->second.error.empty())
    return Status::Error(StatusCode::INTERNAL,
                         it == comms_.end() ? "internal: no NCCL communicator for process set " + std::to_string(set_id)
                                            : "the NCCL communicator of process set " + std::to_string(set_id) +
                                                  " failed earlier: " + it->second.error);
  *out = it->second.comm;
  return Status::Ok();
}

void NcclBackend::FailLocked(int32_t set_id, const std::string& error) {
  Comm& c = comms_[set_id];
  if (c.error.empty()) {
    c.error = error;
    Log(LogLevel::ERROR, "aborting the NCCL communicator of process set " + std::to_string(set_id) + ": " + error);
  }
  if (!c.comm) return;
  if (c.busy) {
    c.abort_pending = true;  // the engine thread is inside a call on it: it aborts on return
    return;
  }
  if (nccl_) nccl_->CommAbort(c.comm);  // ends its kernels; never the process
  c.comm = nullptr;
}

void NcclBackend::Abort(int32_t set_id, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (comms_.count(set_id)) FailLocked(set_id, why);
}

int NcclBackend::Settle(gpu::ncclComm comm, int result) {
  if (result != gpu::ncclInProgress) return result;
  using namespace std::chrono;
  const auto start = steady_clock::now();
  auto pause = microseconds(10);
  while (true) {
    gpu::ncclResult state = gpu::ncclSuccess;
    const int r = nccl_->CommGetAsyncError(comm, &state);
    if (r != gpu::ncclSuccess) return r;
    if (state != gpu::ncclInProgress) return state;
    if (timeout_s_ > 0 && duration<double>(steady_clock::now() - start).count() > timeout_s_) return gpu::ncclInProgress;
    std::this_thread::sleep_for(pause);
    pause = std::min<decltype(pause)>(pause * 2, microseconds(1000));
  }
}

Status NcclBackend::WithComm(int32_t set_id, const char* what, const std::function<int(gpu::ncclComm)>& calls,
                             bool fail_comm) {
  gpu::ncclComm comm;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status st = Live(set_id, &comm);
    if (!st.ok()) return st;
    comms_[set_id].busy = true;
  }
  const int r = Settle(comm, calls(comm));  // without mu_: launches and ncclGroupEnd may block
  Status st;
  if (r == gpu::ncclInProgress)
    st = Status::Error(StatusCode::TIMEOUT, std::string(what) + " on process set " + std::to_string(set_id) +
                                                " was still in progress after " + Seconds(timeout_s_) +
                                                " (COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS)");
  else if (r != gpu::ncclSuccess)
    st = NcclStatus(r, what, comm);
  std::lock_guard<std::mutex> lock(mu_);
  Comm& c = comms_[set_id];
  c.busy = false;
  if (!st.ok() && fail_comm) FailLocked(set_id, st.message);
  if (c.abort_pending) {  // the completion thread found it failed while we were inside
    c.abort_pending = false;
    if (c.comm) nccl_->CommAbort(c.comm);
    c.comm = nullptr;
  }
  if (st.ok() && !c.error.empty())
    return Status::Error(StatusCode::INTERNAL,
                         "the NCCL communicator of process set " + std::to_string(set_id) + " failed: " + c.error);
  return st;
}

Status NcclBackend::Communicator(const ProcessSet& ps, gpu::ncclComm* out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = comms_.find(ps.id);
    if (it != comms_.end()) return Live(ps.id, out);
  }
  // Every member states whether it can take part before any of them blocks in
  // ncclCommInitRank; a member that cannot (no GPU, no NCCL) fails the set on every member
  // instead of leaving the others waiting.
  Status local;
  if (device_ < 0)
    local = Status::Error(StatusCode::INTERNAL, "rank has no GPU backend: " + gpu::Libraries::Get().problem());
  gpu::ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (local.ok() && ps.set_rank == 0) {
    int r = nccl_->GetUniqueId(&id);
    if (r != gpu::ncclSuccess) local = NcclStatus(r, "ncclGetUniqueId", nullptr);
  }
  Status st = Agree(ps, local);
  gpu::ncclComm comm = nullptr;
  if (st.ok()) {
    // The id travels over the set's MPI communicator, by the engine thread, at the same
    // response on every member.
    if (MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, ps.comm) != MPI_SUCCESS)
      return Status::Error(StatusCode::INTERNAL, "MPI_Bcast of the NCCL unique id failed");
    int r = nccl_->CommInitRank(&comm, ps.size(), id, ps.set_rank);
    if (r == gpu::ncclInProgress && comm) r = Settle(comm, r);  // NCCL_COMM_BLOCKING=0
    Status made;
    if (r != gpu::ncclSuccess) made = NcclStatus(r, "ncclCommInitRank", comm);
    // All members keep the communicator, or none does (one that half-failed would hang the others).
    st = Agree(ps, made);
    if (!st.ok() && comm) {
      nccl_->CommAbort(comm);
      comm = nullptr;
    }
  }
  int kernel_here = st.ok() && kernel_.ready() ? 1 : 0, kernel_everywhere = 0;
  if (st.ok() && MPI_Allreduce(&kernel_here, &kernel_everywhere, 1, MPI_INT, MPI_MIN, ps.comm) != MPI_SUCCESS)
    kernel_everywhere = 0;  // cannot happen after the agreement above; copies are always right
  std::lock_guard<std::mutex> lock(mu_);
  Comm& c = comms_[ps.id];
  c.comm = comm;
  c.error = st.message;
  c.kernel_everywhere = kernel_everywhere != 0;
  if (!st.ok()) return st;
  *out = comm;
  return Status::Ok();
}

Status NcclBackend::Agree(const ProcessSet& ps, const Status& local) {
  // The lowest member that failed, then its reason for everyone: two small MPI calls on the
  // set's communicator, by the engine thread, at the same response on every member.
  int mine = local.ok() ? INT_MAX : ps.set_rank, first = INT_MAX;
  if (MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, ps.comm) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "MPI_Allreduce agreeing on a GPU collective failed");
  if (first == INT_MAX) return Status::Ok();
  char reason[512] = {};
  if (first == ps.set_rank) std::strncpy(reason, local.message.c_str(), sizeof(reason) - 1);
  if (MPI_Bcast(reason, static_cast<int>(sizeof(reason)), MPI_CHAR, first, ps.comm) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "MPI_Bcast of a GPU collective's failure failed");
  reason[sizeof(reason) - 1] = '\0';
  const std::string who = "rank " + std::to_string(ps.ranks[static_cast<size_t>(first)]);
  if (!local.ok() && first == ps.set_rank)
    return Status::Error(local.code, local.message + " (" + who + "; no member of process set " +
                                         std::to_string(ps.id) + " ran this GPU collective)");
  return Status::Error(StatusCode::INTERNAL, who + " could not take part, so no member of process set " +
                                                 std::to_string(ps.id) + " ran this GPU collective: " + reason);
}

Status NcclBackend::WaitFor(const gpu::EventPtr& producer) {
  if (!producer) return Status::Ok();
  return CudaStatus(cu_->StreamWaitEvent(stream_, producer->get(), 0), "cuStreamWaitEvent (engine stream on the producer)");
}

Status NcclBackend::CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0 || dst == src) return Status::Ok();
  return CudaStatus(cu_->MemcpyDtoDAsync(Dev(dst), Dev(src), static_cast<size_t>(bytes), stream_), "cuMemcpyDtoDAsync");
}

Status NcclBackend::CopyMany(const std::vector<gpu::Copy>& copies, DataType dtype, double scale) {
  if (kernel_.ready()) {
    int kind = COLLECTIVES_COPY_BYTES;
    if (scale != 1.0) kind = dtype == DataType::FLOAT32 ? COLLECTIVES_COPY_FLOAT32 : COLLECTIVES_COPY_FLOAT64;
    return kernel_.Run(copies, kind, scale, stream_);
  }
  if (scale != 1.0) return Status::Error(StatusCode::INTERNAL, "internal: scaled copies without the copy kernel");
  for (const gpu::Copy& c : copies) {
    Status st = CopyDeviceToDevice(c.dst, c.src, c.bytes);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

bool NcclBackend::ScalesInKernel(int32_t set_id, DataType dtype) {
  if (dtype != DataType::FLOAT32 && dtype != DataType::FLOAT64) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(set_id);
  return it != comms_.end() && it->second.kernel_everywhere;
}

Status NcclBackend::Zero(void* dst, int64_t bytes) {
  if (bytes <= 0) return Status::Ok();
  return CudaStatus(cu_->MemsetD8Async(Dev(dst), 0, static_cast<size_t>(bytes), stream_), "cuMemsetD8Async");
}

Status NcclBackend::CopyDeviceToHost(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return Status::Ok();
  return CudaStatus(cu_->MemcpyDtoHAsync(dst, Dev(src), static_cast<size_t>(bytes), stream_), "cuMemcpyDtoHAsync");
}

Status NcclBackend::CopyHostToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return Status::Ok();
  return CudaStatus(cu_->MemcpyHtoDAsync(Dev(dst), src, static_cast<size_t>(bytes), stream_), "cuMemcpyHtoDAsync");
}

Status NcclBackend::Synchronize() { return CudaStatus(cu_->StreamSynchronize(stream_), "cuStreamSynchronize"); }

Status NcclBackend::FusionBuffer(int64_t bytes, void** out) {
  if (!fusion_ || fusion_->size() < bytes) {
    // Powers of two from 1 MiB: a warming-up training loop reallocates only a few times.
    int64_t grown = 1 << 20;
    while (grown < bytes) grown *= 2;
    fusion_.reset();  // freed in the engine stream's order, after the work queued on it
    Status st = gpu::DeviceBuffer::Allocate(device_, grown, stream_, &fusion_);
    if (!st.ok()) return st;
  }
  *out = fusion_->data();
  return Status::Ok();
}

Status NcclBackend::AllocateOutput(int64_t bytes, std::shared_ptr<gpu::DeviceBuffer>* out) {
  // Freed in the engine stream's order unless a consumer adopts it (and names its stream).
  return gpu::DeviceBuffer::Allocate(device_, bytes, stream_, out);
}

Status NcclBackend::MakeRedOp(int32_t set_id, DataType dtype, ReduceOp op, double prescale, double postscale,
                              int set_size, RedOp* out) {
  *out = RedOp();
  switch (op) {
    case ReduceOp::MIN: out->op = gpu::ncclMin; return Status::Ok();
    case ReduceOp::MAX: out->op = gpu::ncclMax; return Status::Ok();
    case ReduceOp::PRODUCT: out->op = gpu::ncclProd; return Status::Ok();
    default: break;
  }
  const bool average = op == ReduceOp::AVERAGE;
  if (!NeedsCustomOp(dtype, op, prescale, postscale)) {
    out->op = average ? gpu::ncclAvg : gpu::ncclSum;  // integers: CanReduce allowed no scale
    return Status::Ok();
  }
  // Scale factors (and the Average's 1/n) as one pre-multiplier: sum(f * x_r) = post * sum(pre * x_r) / n.
  double factor = prescale * postscale;
  if (average) factor /= set_size;
  union {
    uint16_t h;
    float f;
    double d;
  } scalar;
  switch (dtype) {
    case DataType::FLOAT16: scalar.h = FloatToHalf(static_cast<float>(factor)); break;
    case DataType::BFLOAT16: scalar.h = FloatToBf16(static_cast<float>(factor)); break;
    case DataType::FLOAT32: scalar.f = static_cast<float>(factor); break;
    default: scalar.d = factor; break;
  }
  int made = 0;
  // A local call: its failure is this member's alone (Agree tells the others).
  Status st = WithComm(set_id, "ncclRedOpCreatePreMulSum", [&](gpu::ncclComm comm) {
    return nccl_->RedOpCreatePreMulSum(&made, &scalar, NcclType(dtype), gpu::ncclScalarHostImmediate, comm);
  }, false);
  if (!st.ok()) return st;
  out->op = made;
  out->custom = true;
  return Status::Ok();
}

void NcclBackend::FreeRedOp(int32_t set_id, const RedOp& op) {
  if (!op.custom) return;
  // Allowed once the calls that use it have returned.
  WithComm(set_id, "ncclRedOpDestroy", [&](gpu::ncclComm comm) { return nccl_->RedOpDestroy(op.op, comm); }, false);
}

Status NcclBackend::Allreduce(int32_t set_id, const void* in, void* out, int64_t count, DataType dtype,
                              const RedOp& op) {
  if (count == 0) return Status::Ok();
  allreduce_launches_.fetch_add(1, std::memory_order_relaxed);
  return WithComm(set_id, "ncclAllReduce", [&](gpu::ncclComm comm) {
    return nccl_->AllReduce(in, out, static_cast<size_t>(count), NcclType(dtype), op.op, comm, stream_);
  });
}

Status NcclBackend::ReduceScatter(int32_t set_id, const void* in, void* out, const std::vector<int64_t>& counts,
                                  DataType dtype, const RedOp& op, int me) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total == 0) return Status::Ok();
  if (AllEqual(counts))
    return WithComm(set_id, "ncclReduceScatter", [&](gpu::ncclComm comm) {
      return nccl_->ReduceScatter(in, out, static_cast<size_t>(counts[0]), NcclType(dtype), op.op, comm, stream_);
    });
  // Uneven blocks (the first dim0 % n members get a row more): one reduce to each member,
  // grouped into one launch.
  const int64_t esize = DataTypeSize(dtype);
  return WithComm(set_id, "ncclReduce (uneven reducescatter)", [&](gpu::ncclComm comm) {
    int r = nccl_->GroupStart();
    int64_t offset = 0;
    for (size_t p = 0; p < counts.size() && Going(r); ++p) {
      if (counts[p] > 0) {
        // recvbuff is used on the root only; the others pass their send buffer as a stand-in.
        void* recv = static_cast<int>(p) == me ? out : const_cast<void*>(in);
        r = nccl_->Reduce(At(in, offset * esize), recv, static_cast<size_t>(counts[p]), NcclType(dtype), op.op,
                          static_cast<int>(p), comm, stream_);
      }
      offset += counts[p];
    }
    const int end = nccl_->GroupEnd();
    return Going(r) ? end : r;
  });
}

Status NcclBackend::Broadcast(int32_t set_id, const void* in, void* out, int64_t bytes, int root) {
  if (bytes == 0) return Status::Ok();
  return WithComm(set_id, "ncclBroadcast", [&](gpu::ncclComm comm) {
    return nccl_->Broadcast(in, out, static_cast<size_t>(bytes), gpu::ncclUint8, root, comm, stream_);
  });
}

Status NcclBackend::Allgatherv(int32_t set_id, const void* in, void* out, const std::vector<int64_t>& counts,
                               const std::vector<int64_t>& displs, int me) {
  if (AllEqual(counts)) {
    if (counts[0] == 0) return Status::Ok();
    return WithComm(set_id, "ncclAllGather", [&](gpu::ncclComm comm) {
      return nccl_->AllGather(in, out, static_cast<size_t>(counts[0]), gpu::ncclUint8, comm, stream_);
    });
  }
  // Ragged first dimensions: each member broadcasts its rows into place, in one group.
  return WithComm(set_id, "ncclBroadcast (allgather of uneven tensors)", [&](gpu::ncclComm comm) {
    int r = nccl_->GroupStart();
    for (size_t p = 0; p < counts.size() && Going(r); ++p) {
      if (counts[p] == 0) continue;
      void* dst = At(out, displs[p]);
      const void* src = static_cast<int>(p) == me ? in : dst;
      r = nccl_->Broadcast(src, dst, static_cast<size_t>(counts[p]), gpu::ncclUint8, static_cast<int>(p), comm, stream_);
    }
    const int end = nccl_->GroupEnd();
    return Going(r) ? end : r;
  });
}

Status NcclBackend::Alltoallv(int32_t set_id, const void* in, const std::vector<int64_t>& send_counts,
                              const std::vector<int64_t>& send_displs, void* out, const std::vector<int64_t>& recv_counts,
                              const std::vector<int64_t>& recv_displs, int me) {
  Status st = WithComm(set_id, "ncclSend/ncclRecv (alltoall)", [&](gpu::ncclComm comm) {
    int r = nccl_->GroupStart();
    for (size_t p = 0; p < send_counts.size() && Going(r); ++p) {
      if (static_cast<int>(p) == me) continue;  // our own rows: a copy below
      if (send_counts[p] > 0)
        r = nccl_->Send(At(in, send_displs[p]), static_cast<size_t>(send_counts[p]), gpu::ncclUint8, static_cast<int>(p),
                        comm, stream_);
      if (Going(r) && recv_counts[p] > 0)
        r = nccl_->Recv(At(out, recv_displs[p]), static_cast<size_t>(recv_counts[p]), gpu::ncclUint8,
                        static_cast<int>(p), comm, stream_);
    }
    const int end = nccl_->GroupEnd();
    return Going(r) ? end : r;
  });
  if (!st.ok()) return st;
  const size_t m = static_cast<size_t>(me);
  return CopyDeviceToDevice(At(out, recv_displs[m]), At(in, send_displs[m]), send_counts[m]);
}

}  // namespace collectives
