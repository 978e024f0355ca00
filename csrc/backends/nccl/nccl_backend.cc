// NcclBackend: start-up, the reduction operators and the NCCL calls (nccl_backend.h).
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

const char* At(const void* base, int64_t offset) { return static_cast<const char*>(base) + offset; }
char* At(void* base, int64_t offset) { return static_cast<char*>(base) + offset; }

bool AllEqual(const std::vector<int64_t>& v) {
  return std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v[0]; });
}

// A result that lets the caller go on: success, or (non-blocking communicators) an
// operation still in progress, which Settle waits out.
bool Going(int r) { return r == gpu::ncclSuccess || r == gpu::ncclInProgress; }

}  // namespace

NcclBackend::~NcclBackend() { Shutdown(Status::Error(StatusCode::SHUT_DOWN, "collectives has been shut down"), 0.0); }

Status NcclBackend::Start(int device, bool spin, double warn_s, double timeout_s) {
  if (started()) {
    if (device == stream_.device()) return Status::Ok();
    return Status::Error(StatusCode::INVALID_ARGUMENT, "collectives uses one GPU per process: this process uses GPU " +
                                                           std::to_string(stream_.device()) + ", not GPU " +
                                                           std::to_string(device));
  }
  const gpu::CudaApi* cu = gpu::Libraries::Get().cuda();
  nccl_ = gpu::Libraries::Get().nccl();
  if (!cu || !nccl_)
    return Status::Error(StatusCode::UNSUPPORTED_TYPE,
                         "GPU tensors need the CUDA driver and NCCL: " + gpu::Libraries::Get().problem());
  Status st = stream_.Start(cu, device);
  if (!st.ok()) return st;
  comms_.Start(nccl_, timeout_s);
  completion_.Start(GpuWaitLimits{spin, warn_s, timeout_s});
  return Status::Ok();
}

void NcclBackend::Release(int32_t set_id) {
  if (!comms_.Has(set_id)) return;  // never used on a GPU
  if (!completion_.started()) {     // never started here: no communicator was made
    comms_.Destroy(set_id);
    return;
  }
  completion_.QueueRelease(set_id);
}

void NcclBackend::Shutdown(const Status& why, double grace_s) {
  if (!completion_.Stop(why, grace_s)) return;
  comms_.DestroyAll();
  stream_.ReleaseFusionBuffer();
}

bool NcclCanReduce(DataType dtype, ReduceOp op, double prescale, double postscale) {
  if (dtype == DataType::INT16) return false;
  const bool unscaled = prescale == 1.0 && postscale == 1.0;
  if (op == ReduceOp::MIN || op == ReduceOp::MAX || op == ReduceOp::PRODUCT) return unscaled;
  // Sum/Average: floats take any scale (one pre-multiplier); integers only ncclSum/ncclAvg,
  // whose integer division truncates toward zero as the host path does.
  return IsFloat(dtype) || unscaled;
}

bool NcclNeedsCustomOp(DataType dtype, ReduceOp op, double prescale, double postscale) {
  if (op != ReduceOp::SUM && op != ReduceOp::AVERAGE) return false;
  return IsFloat(dtype) && prescale * postscale != 1.0;
}

Status NcclBackend::Communicator(const ProcessSet& ps, gpu::ncclComm* out) {
  const Status usable =
      started() ? Status::Ok()
                : Status::Error(StatusCode::INTERNAL, "rank has no GPU backend: " + gpu::Libraries::Get().problem());
  return comms_.Get(ps, usable, stream_.has_copy_kernel(), out);
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
  if (!NcclNeedsCustomOp(dtype, op, prescale, postscale)) {
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
  Status st = comms_.With(set_id, "ncclRedOpCreatePreMulSum", [&](gpu::ncclComm comm) {
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
  comms_.With(set_id, "ncclRedOpDestroy", [&](gpu::ncclComm comm) { return nccl_->RedOpDestroy(op.op, comm); }, false);
}

Status NcclBackend::Allreduce(int32_t set_id, const void* in, void* out, int64_t count, DataType dtype,
                              const RedOp& op) {
  if (count == 0) return Status::Ok();
  allreduce_launches_.fetch_add(1, std::memory_order_relaxed);
  return comms_.With(set_id, "ncclAllReduce", [&](gpu::ncclComm comm) {
    return nccl_->AllReduce(in, out, static_cast<size_t>(count), NcclType(dtype), op.op, comm, stream_.get());
  });
}

Status NcclBackend::ReduceScatter(int32_t set_id, const void* in, void* out, const std::vector<int64_t>& counts,
                                  DataType dtype, const RedOp& op, int me) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total == 0) return Status::Ok();
  if (AllEqual(counts))
    return comms_.With(set_id, "ncclReduceScatter", [&](gpu::ncclComm comm) {
      return nccl_->ReduceScatter(in, out, static_cast<size_t>(counts[0]), NcclType(dtype), op.op, comm, stream_.get());
    });
  // Uneven blocks (the first dim0 % n members get a row more): one reduce to each member,
  // grouped into one launch.
  const int64_t esize = DataTypeSize(dtype);
  return comms_.With(set_id, "ncclReduce (uneven reducescatter)", [&](gpu::ncclComm comm) {
    int r = nccl_->GroupStart();
    int64_t offset = 0;
    for (size_t p = 0; p < counts.size() && Going(r); ++p) {
      if (counts[p] > 0) {
        // recvbuff is used on the root only; the others pass their send buffer as a stand-in.
        void* recv = static_cast<int>(p) == me ? out : const_cast<void*>(in);
        r = nccl_->Reduce(At(in, offset * esize), recv, static_cast<size_t>(counts[p]), NcclType(dtype), op.op,
                          static_cast<int>(p), comm, stream_.get());
      }
      offset += counts[p];
    }
    const int end = nccl_->GroupEnd();
    return Going(r) ? end : r;
  });
}

Status NcclBackend::Broadcast(int32_t set_id, const void* in, void* out, int64_t bytes, int root) {
  if (bytes == 0) return Status::Ok();
  return comms_.With(set_id, "ncclBroadcast", [&](gpu::ncclComm comm) {
    return nccl_->Broadcast(in, out, static_cast<size_t>(bytes), gpu::ncclUint8, root, comm, stream_.get());
  });
}

Status NcclBackend::Allgatherv(int32_t set_id, const void* in, void* out, const std::vector<int64_t>& counts,
                               const std::vector<int64_t>& displs, int me) {
  if (AllEqual(counts)) {
    if (counts[0] == 0) return Status::Ok();
    return comms_.With(set_id, "ncclAllGather", [&](gpu::ncclComm comm) {
      return nccl_->AllGather(in, out, static_cast<size_t>(counts[0]), gpu::ncclUint8, comm, stream_.get());
    });
  }
  // Ragged first dimensions: each member broadcasts its rows into place, in one group.
  return comms_.With(set_id, "ncclBroadcast (allgather of uneven tensors)", [&](gpu::ncclComm comm) {
    int r = nccl_->GroupStart();
    for (size_t p = 0; p < counts.size() && Going(r); ++p) {
      if (counts[p] == 0) continue;
      void* dst = At(out, displs[p]);
      const void* src = static_cast<int>(p) == me ? in : dst;
      r = nccl_->Broadcast(src, dst, static_cast<size_t>(counts[p]), gpu::ncclUint8, static_cast<int>(p), comm, stream_.get());
    }
    const int end = nccl_->GroupEnd();
    return Going(r) ? end : r;
  });
}

Status NcclBackend::Alltoallv(int32_t set_id, const void* in, const std::vector<int64_t>& send_counts,
                              const std::vector<int64_t>& send_displs, void* out, const std::vector<int64_t>& recv_counts,
                              const std::vector<int64_t>& recv_displs, int me) {
  Status st = comms_.With(set_id, "ncclSend/ncclRecv (alltoall)", [&](gpu::ncclComm comm) {
    int r = nccl_->GroupStart();
    for (size_t p = 0; p < send_counts.size() && Going(r); ++p) {
      if (static_cast<int>(p) == me) continue;  // our own rows: a copy below
      if (send_counts[p] > 0)
        r = nccl_->Send(At(in, send_displs[p]), static_cast<size_t>(send_counts[p]), gpu::ncclUint8, static_cast<int>(p),
                        comm, stream_.get());
      if (Going(r) && recv_counts[p] > 0)
        r = nccl_->Recv(At(out, recv_displs[p]), static_cast<size_t>(recv_counts[p]), gpu::ncclUint8,
                        static_cast<int>(p), comm, stream_.get());
    }
    const int end = nccl_->GroupEnd();
    return Going(r) ? end : r;
  });
  if (!st.ok()) return st;
  const size_t m = static_cast<size_t>(me);
  return stream_.CopyDeviceToDevice(At(out, recv_displs[m]), At(in, send_displs[m]), send_counts[m]);
}

}  // namespace collectives
