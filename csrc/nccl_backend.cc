#include "nccl_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "gpu_loader.h"
#include "half.h"
#include "log.h"

namespace collectives {
namespace {

using gpu::CUDA_ERROR_NOT_READY;
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

}  // namespace

NcclBackend::~NcclBackend() { Shutdown(Status::Error(StatusCode::SHUT_DOWN, "collectives has been shut down"), 0.0); }

Status NcclBackend::Start(int device, bool spin) {
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
  device_ = device;
  spin_ = spin;
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
  if (it == comms_.end() || !it->second.comm)
    return Status::Error(StatusCode::INTERNAL,
                         it == comms_.end() ? "internal: no NCCL communicator for process set " + std::to_string(set_id)
                                            : "the NCCL communicator of process set " + std::to_string(set_id) +
                                                  " failed earlier: " + it->second.error);
  *out = it->second.comm;
  return Status::Ok();
}

void NcclBackend::Fail(int32_t set_id, const std::string& error) {
  Comm& c = comms_[set_id];
  if (!c.error.empty()) return;
  c.error = error;
  Log(LogLevel::ERROR, "aborting the NCCL communicator of process set " + std::to_string(set_id) + ": " + error);
  if (c.comm && nccl_) nccl_->CommAbort(c.comm);  // ends its kernels; never the process
  c.comm = nullptr;
}

void NcclBackend::Abort(int32_t set_id, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (comms_.count(set_id)) Fail(set_id, why);
}

Status NcclBackend::Check(int result, const char* call, int32_t set_id, gpu::ncclComm comm) {
  if (result == gpu::ncclSuccess) return Status::Ok();
  Status st = NcclStatus(result, call, comm);
  Fail(set_id, st.message);
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
  std::string local_error;
  if (device_ < 0) local_error = "rank has no GPU backend: " + gpu::Libraries::Get().problem();
  gpu::ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (local_error.empty() && ps.set_rank == 0) {
    int r = nccl_->GetUniqueId(&id);
    if (r != gpu::ncclSuccess) local_error = NcclStatus(r, "ncclGetUniqueId", nullptr).message;
  }
  int ok = local_error.empty() ? 1 : 0, all_ok = 0;
  if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, ps.comm) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "MPI_Allreduce before creating an NCCL communicator failed");
  std::string error;
  gpu::ncclComm comm = nullptr;
  if (!all_ok) {
    error = local_error.empty() ? "another member of process set " + std::to_string(ps.id) +
                                      " could not set up NCCL (see its error)"
                                : local_error;
  } else {
    // The id travels over the set's MPI communicator, by the engine thread, at the same
    // response on every member.
    if (MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, ps.comm) != MPI_SUCCESS)
      return Status::Error(StatusCode::INTERNAL, "MPI_Bcast of the NCCL unique id failed");
    int r = nccl_->CommInitRank(&comm, ps.size(), id, ps.set_rank);
    if (r != gpu::ncclSuccess) {
      error = NcclStatus(r, "ncclCommInitRank", comm).message;
      comm = nullptr;
    }
    // All members keep the communicator, or none does (one that half-failed would hang the others).
    ok = error.empty() ? 1 : 0;
    if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, ps.comm) != MPI_SUCCESS)
      return Status::Error(StatusCode::INTERNAL, "MPI_Allreduce after creating an NCCL communicator failed");
    if (!all_ok && error.empty()) {
      error = "ncclCommInitRank failed on another member of process set " + std::to_string(ps.id);
      nccl_->CommAbort(comm);
      comm = nullptr;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  Comm& c = comms_[ps.id];
  c.comm = comm;
  c.error = error;
  if (!error.empty()) return Status::Error(StatusCode::INTERNAL, error);
  *out = comm;
  return Status::Ok();
}

Status NcclBackend::WaitFor(const gpu::EventPtr& producer) {
  if (!producer) return Status::Ok();
  return CudaStatus(cu_->StreamWaitEvent(stream_, producer->get(), 0), "cuStreamWaitEvent (engine stream on the producer)");
}

Status NcclBackend::CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0 || dst == src) return Status::Ok();
  return CudaStatus(cu_->MemcpyDtoDAsync(Dev(dst), Dev(src), static_cast<size_t>(bytes), stream_), "cuMemcpyDtoDAsync");
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
    if (fusion_) {
      fusion_->set_free_stream(reinterpret_cast<uintptr_t>(stream_));  // after the work queued on it
      fusion_.reset();
    }
    Status st = gpu::DeviceBuffer::Allocate(device_, grown, stream_, &fusion_);
    if (!st.ok()) return st;
    fusion_->set_free_stream(reinterpret_cast<uintptr_t>(stream_));
  }
  *out = fusion_->data();
  return Status::Ok();
}

Status NcclBackend::AllocateOutput(int64_t bytes, std::shared_ptr<gpu::DeviceBuffer>* out) {
  Status st = gpu::DeviceBuffer::Allocate(device_, bytes, stream_, out);
  // Freed after the engine's work on it unless a consumer adopts it (and names its stream).
  if (st.ok()) (*out)->set_free_stream(reinterpret_cast<uintptr_t>(stream_));
  return st;
}

Status NcclBackend::ReduceOpFor(DataType dtype, ReduceOp op, double prescale, double postscale, int set_size,
                                gpu::ncclComm comm, int* nccl_op, bool* custom) {
  *custom = false;
  switch (op) {
    case ReduceOp::MIN: *nccl_op = gpu::ncclMin; return Status::Ok();
    case ReduceOp::MAX: *nccl_op = gpu::ncclMax; return Status::Ok();
    case ReduceOp::PRODUCT: *nccl_op = gpu::ncclProd; return Status::Ok();
    default: break;
  }
  const bool average = op == ReduceOp::AVERAGE;
  double factor = prescale * postscale;
  if (!IsFloat(dtype) || factor == 1.0) {
    *nccl_op = average ? gpu::ncclAvg : gpu::ncclSum;  // integers: CanReduce allowed no scale
    return Status::Ok();
  }
  // Scale factors (and the Average's 1/n) as one pre-multiplier: sum(f * x_r) = post * sum(pre * x_r) / n.
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
  int r = nccl_->RedOpCreatePreMulSum(nccl_op, &scalar, NcclType(dtype), gpu::ncclScalarHostImmediate, comm);
  if (r != gpu::ncclSuccess) return NcclStatus(r, "ncclRedOpCreatePreMulSum", comm);
  *custom = true;
  return Status::Ok();
}

Status NcclBackend::Allreduce(int32_t set_id, const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                              double prescale, double postscale, int set_size) {
  if (count == 0) return Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  gpu::ncclComm comm;
  Status st = Live(set_id, &comm);
  if (!st.ok()) return st;
  int nop;
  bool custom;
  st = ReduceOpFor(dtype, op, prescale, postscale, set_size, comm, &nop, &custom);
  if (!st.ok()) {
    Fail(set_id, st.message);
    return st;
  }
  int r = nccl_->AllReduce(in, out, static_cast<size_t>(count), NcclType(dtype), nop, comm, stream_);
  if (custom) nccl_->RedOpDestroy(nop, comm);  // allowed once the call that uses it has returned
  return Check(r, "ncclAllReduce", set_id, comm);
}

Status NcclBackend::ReduceScatter(int32_t set_id, const void* in, void* out, const std::vector<int64_t>& counts,
                                  DataType dtype, ReduceOp op, double prescale, double postscale, int me) {
  std::lock_guard<std::mutex> lock(mu_);
  gpu::ncclComm comm;
  Status st = Live(set_id, &comm);
  if (!st.ok()) return st;
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total == 0) return Status::Ok();
  int nop;
  bool custom;
  st = ReduceOpFor(dtype, op, prescale, postscale, static_cast<int>(counts.size()), comm, &nop, &custom);
  if (!st.ok()) {
    Fail(set_id, st.message);
    return st;
  }
  int r;
  const char* call;
  if (AllEqual(counts)) {
    call = "ncclReduceScatter";
    r = nccl_->ReduceScatter(in, out, static_cast<size_t>(counts[0]), NcclType(dtype), nop, comm, stream_);
  } else {
    // Uneven blocks (the first dim0 % n members get a row more): one reduce to each member,
    // grouped into one launch.
    call = "ncclReduce (uneven reducescatter)";
    const int64_t esize = DataTypeSize(dtype);
    r = nccl_->GroupStart();
    int64_t offset = 0;
    for (size_t p = 0; p < counts.size() && r == gpu::ncclSuccess; ++p) {
      if (counts[p] > 0) {
        // recvbuff is used on the root only; the others pass their send buffer as a stand-in.
        void* recv = static_cast<int>(p) == me ? out : const_cast<void*>(in);
        r = nccl_->Reduce(At(in, offset * esize), recv, static_cast<size_t>(counts[p]), NcclType(dtype), nop,
                          static_cast<int>(p), comm, stream_);
      }
      offset += counts[p];
    }
    int end = nccl_->GroupEnd();
    if (r == gpu::ncclSuccess) r = end;
  }
  if (custom) nccl_->RedOpDestroy(nop, comm);
  return Check(r, call, set_id, comm);
}

Status NcclBackend::Broadcast(int32_t set_id, const void* in, void* out, int64_t bytes, int root) {
  if (bytes == 0) return Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  gpu::ncclComm comm;
  Status st = Live(set_id, &comm);
  if (!st.ok()) return st;
  int r = nccl_->Broadcast(in, out, static_cast<size_t>(bytes), gpu::ncclUint8, root, comm, stream_);
  return Check(r, "ncclBroadcast", set_id, comm);
}

Status NcclBackend::Allgatherv(int32_t set_id, const void* in, void* out, const std::vector<int64_t>& counts,
                               const std::vector<int64_t>& displs, int me) {
  std::lock_guard<std::mutex> lock(mu_);
  gpu::ncclComm comm;
  Status st = Live(set_id, &comm);
  if (!st.ok()) return st;
  if (AllEqual(counts)) {
    if (counts[0] == 0) return Status::Ok();
    int r = nccl_->AllGather(in, out, static_cast<size_t>(counts[0]), gpu::ncclUint8, comm, stream_);
    return Check(r, "ncclAllGather", set_id, comm);
  }
  // Ragged first dimensions: each member broadcasts its rows into place, in one group.
  int r = nccl_->GroupStart();
  for (size_t p = 0; p < counts.size() && r == gpu::ncclSuccess; ++p) {
    if (counts[p] == 0) continue;
    void* dst = At(out, displs[p]);
    const void* src = static_cast<int>(p) == me ? in : dst;
    r = nccl_->Broadcast(src, dst, static_cast<size_t>(counts[p]), gpu::ncclUint8, static_cast<int>(p), comm, stream_);
  }
  int end = nccl_->GroupEnd();
  return Check(r == gpu::ncclSuccess ? end : r, "ncclBroadcast (allgather of uneven tensors)", set_id, comm);
}

Status NcclBackend::Alltoallv(int32_t set_id, const void* in, const std::vector<int64_t>& send_counts,
                              const std::vector<int64_t>& send_displs, void* out, const std::vector<int64_t>& recv_counts,
                              const std::vector<int64_t>& recv_displs, int me) {
  std::unique_lock<std::mutex> lock(mu_);
  gpu::ncclComm comm;
  Status st = Live(set_id, &comm);
  if (!st.ok()) return st;
  int r = nccl_->GroupStart();
  for (size_t p = 0; p < send_counts.size() && r == gpu::ncclSuccess; ++p) {
    if (static_cast<int>(p) == me) continue;  // our own rows: a copy below
    if (send_counts[p] > 0)
      r = nccl_->Send(At(in, send_displs[p]), static_cast<size_t>(send_counts[p]), gpu::ncclUint8, static_cast<int>(p),
                      comm, stream_);
    if (r == gpu::ncclSuccess && recv_counts[p] > 0)
      r = nccl_->Recv(At(out, recv_displs[p]), static_cast<size_t>(recv_counts[p]), gpu::ncclUint8, static_cast<int>(p),
                      comm, stream_);
  }
  int end = nccl_->GroupEnd();
  st = Check(r == gpu::ncclSuccess ? end : r, "ncclSend/ncclRecv (alltoall)", set_id, comm);
  lock.unlock();
  if (!st.ok()) return st;
  const size_t m = static_cast<size_t>(me);
  return CopyDeviceToDevice(At(out, recv_displs[m]), At(in, send_displs[m]), send_counts[m]);
}

void NcclBackend::Complete(int32_t set_id, Done done, std::vector<std::shared_ptr<void>> keep) {
  Pending p;
  p.set_id = set_id;
  p.done = std::move(done);
  p.keep = std::move(keep);
  if (device_ < 0) {
    p.done(Status::Error(StatusCode::INTERNAL, "internal: GPU completion without a GPU backend"));
    return;
  }
  gpu::EventPtr event;
  Status st = gpu::Runtime::Get().NewEvent(device_, &event);
  if (st.ok()) st = CudaStatus(cu_->EventRecord(event->get(), stream_), "cuEventRecord on the engine stream");
  if (st.ok())
    p.event = std::move(event);
  else
    p.status = st;
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(p));
  cv_.notify_one();
}

Status NcclBackend::WaitForEvent(const Pending& p) {
  using namespace std::chrono;
  auto pause = microseconds(10);
  auto next_error_check = steady_clock::now();
  for (int polls = 0;; ++polls) {
    const gpu::CUresult r = cu_->EventQuery(p.event->get());
    if (r == CUDA_SUCCESS) break;
    // Anything but "not ready" is a device fault (sticky: the context is unusable).
    if (r != CUDA_ERROR_NOT_READY) return CudaStatus(r, "waiting for the GPU collective");
    const auto now = steady_clock::now();
    if (now >= next_error_check) {
      // A peer that died, a network failure: NCCL reports it here, and the kernels would
      // otherwise wait forever.
      next_error_check = now + milliseconds(1);
      std::lock_guard<std::mutex> lock(mu_);
      auto it = comms_.find(p.set_id);
      if (it != comms_.end() && it->second.comm) {
        gpu::ncclResult async = gpu::ncclSuccess;
        nccl_->CommGetAsyncError(it->second.comm, &async);
        if (async != gpu::ncclSuccess && async != gpu::ncclInProgress) {
          Status st = NcclStatus(async, "a collective (asynchronous error)", it->second.comm);
          Fail(p.set_id, st.message);
          return st;
        }
      }
      if (stopping_ && now >= deadline_) {
        // Shutting down and the GPU work does not finish: abort rather than hang the exit.
        for (auto& kv : comms_) Fail(kv.first, "aborted at shutdown: GPU work did not finish");
        return Status::Error(why_.code, why_.message + " (GPU work did not finish)");
      }
    }
    // Small collectives finish within microseconds: poll those quickly, then back off.
    if (spin_ && polls < 200) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min<decltype(pause)>(pause * 2, microseconds(1000));
    }
  }
  // Finished; but if the communicator was aborted meanwhile its kernels may have ended early.
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(p.set_id);
  if (it != comms_.end() && !it->second.error.empty())
    return Status::Error(StatusCode::INTERNAL, "the NCCL communicator of process set " + std::to_string(p.set_id) +
                                                   " failed: " + it->second.error);
  return Status::Ok();
}

void NcclBackend::CompletionLoop() {
  gpu::Runtime& rt = gpu::Runtime::Get();
  cu_->CtxSetCurrent(rt.Context(device_));
  while (true) {
    Pending p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || stopped_; });
      if (queue_.empty()) return;  // stopped and drained
      p = std::move(queue_.front());
      queue_.pop_front();
    }
    Status st = p.event ? WaitForEvent(p) : p.status;
    p.event.reset();
    p.done(st);  // completes handles: takes the engine's locks, never calls Python
    p.keep.clear();
  }
}

void NcclBackend::Shutdown(const Status& why, double grace_s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopping_ = true;
    stopped_ = true;
    why_ = why;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(grace_s));
  }
  cv_.notify_all();
  if (completer_.joinable()) completer_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : comms_)
    if (kv.second.comm) nccl_->CommDestroy(kv.second.comm);  // idle now: the queue is drained
  comms_.clear();
  fusion_.reset();
}

}  // namespace collectives
