// Tensors in GPU memory: the execution of their negotiated responses on the NCCL backend
// (their submission, on the caller's thread, is PrepareDeviceSubmission in
// device_submission.cc), or, for the few reductions NCCL cannot do
// (int16, scaled Min/Max/Product, scaled integers), staged through host memory and MPI with
// the host path's own arithmetic. Handles complete from the backend's completion thread once
// the GPU has finished.
//
// Every member of a process set launches the same NCCL calls or none: a step that can fail
// on one member alone (allocating the fusion buffer or an output, making a PreMulSum
// operator) is followed by an agreement over MPI before anything is launched. The response
// alone decides whether a group has such a step, so all members agree at the same point.
#include <cstring>

#include "execution/device_executor.h"
#include "gpu/gpu_loader.h"
#include "common/log.h"

namespace collectives {
namespace {

int64_t Bytes(const Response& r) { return NumElements(r.shape) * DataTypeSize(r.dtype); }

std::vector<int64_t> Prefix(const std::vector<int64_t>& counts) {
  std::vector<int64_t> displs(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) displs[i] = displs[i - 1] + counts[i - 1];
  return displs;
}

std::string DeviceEvent(OpType op) { return std::string("NCCL_") + OpTypeName(op); }

char* At(void* base, int64_t offset) { return static_cast<char*>(base) + offset; }

// Bytes of one row (first-dimension slice) of a request's tensor.
int64_t RowBytes(const Request& q) {
  const int64_t n = NumElements(q.shape);
  int64_t row_elems = 1;
  if (!q.shape.empty())
    row_elems = q.shape[0] == 0 ? NumElements(std::vector<int64_t>(q.shape.begin() + 1, q.shape.end())) : n / q.shape[0];
  return row_elems * DataTypeSize(q.dtype);
}

bool Staged(const Response& r) {
  return (r.op == OpType::ALLREDUCE || r.op == OpType::REDUCESCATTER) &&
         !NcclCanReduce(r.dtype, r.reduce_op, r.prescale, r.postscale);
}

}  // namespace

void DeviceExecutor::Load(const std::string& cuda_driver_library, const std::string& nccl_library,
                          const std::string& nccl_problem) {
  gpu::Libraries::Get().Load(cuda_driver_library, nccl_library, nccl_problem);
  nccl_.reset(new NcclBackend());
}

void DeviceExecutor::Shutdown(const Status& why) {
  if (nccl_) nccl_->Shutdown(why);
  nccl_.reset();
}

void DeviceExecutor::ExecuteGroup(const ExecutionContext& ctx, StagedHostPath& host, const ProcessSet& ps,
                                  const std::vector<const Response*>& group, const std::vector<Pending*>& entries) {
  if (ctx.timeline.active())
    for (Pending* p : entries)
      if (p) ctx.timeline.Begin(p->request.name, DeviceEvent(group[0]->op));
  std::vector<Result> results(group.size());
  std::vector<std::shared_ptr<void>> keep;
  Status st = RunGroup(ctx, host, ps, group, entries, &results, &keep);
  if (!st.ok() && st.code == StatusCode::INTERNAL) Log(LogLevel::ERROR, st.message);

  struct Item {
    int64_t handle;
    std::string name;
    Result result;
  };
  auto items = std::make_shared<std::vector<Item>>();
  for (size_t k = 0; k < group.size(); ++k)
    if (entries[k]) items->push_back(Item{entries[k]->handle, entries[k]->request.name, std::move(results[k])});
  ExecutionListener* engine = &ctx.engine;
  auto finish = [engine, items](const Status& outcome) {
    for (Item& it : *items) {
      if (!outcome.ok()) it.result = Result();
      it.result.status = outcome;
      engine->FinishDevice(it.handle, it.name, std::move(it.result));
    }
  };
  if (!nccl_ || !nccl_->started()) {
    finish(st);  // nothing was put on a GPU stream
    return;
  }
  // Even after a failure, work may be queued on the stream over the callers' buffers: the
  // handles complete only once the stream has passed it.
  nccl_->completion().Complete(ps.id, [finish, st](const Status& done) { finish(st.ok() ? done : st); }, std::move(keep));
}

Status DeviceExecutor::RunStaged(const ExecutionContext& ctx, StagedHostPath& host, const ProcessSet& ps,
                                 const Response& r, Pending* p, Result* result,
                                 std::vector<std::shared_ptr<void>>* keep) {
  const Request& q = p->request;
  const int64_t esize = DataTypeSize(q.dtype);
  const int64_t n = NumElements(q.shape);
  int64_t out_n = n;
  if (r.op == OpType::REDUCESCATTER) {
    const int64_t dim0 = q.shape[0], members = ps.size();
    out_n = (dim0 / members + (ps.set_rank < dim0 % members ? 1 : 0)) * (RowBytes(q) / esize);
  }
  auto in = std::make_shared<HostBuffer>(n * esize);
  auto out = std::make_shared<HostBuffer>(out_n * esize);
  keep->push_back(in);
  keep->push_back(out);
  Status local = nccl_->Start(p->gpu_device, settings_.spin, settings_.stall_check_s, settings_.stall_shutdown_s);
  if (local.ok()) local = nccl_->stream().WaitFor(p->ready);
  if (local.ok()) local = nccl_->stream().CopyDeviceToHost(in->data(), p->input, n * esize);
  if (local.ok()) local = nccl_->stream().Synchronize();
  // The other members are about to enter the MPI call: take part even after a local failure.
  if (!local.ok() && n) std::memset(in->data(), 0, static_cast<size_t>(n * esize));
  Pending staged = *p;
  staged.input = in->data();
  staged.output = out->data();
  Status st = host.RunOnHost(ctx, ps, r, &staged, result);
  if (!local.ok()) return local;
  if (!st.ok()) return st;
  return nccl_->stream().CopyHostToDevice(p->output, out->data(), out_n * esize);
}

Status DeviceExecutor::RunGroup(const ExecutionContext& ctx, StagedHostPath& host, const ProcessSet& ps,
                                const std::vector<const Response*>& group, const std::vector<Pending*>& entries,
                                std::vector<Result>* results, std::vector<std::shared_ptr<void>>* keep) {
  const Response& r = *group[0];
  if (Staged(r)) {
    // No NCCL involved: every member decides the same from the response alone. (Only empty
    // tensors share a fusion group here: MaxFusedBytes is 0 for these.)
    Status first;
    for (size_t k = 0; k < group.size(); ++k) {
      // A joined rank contributes zeros over MPI, like the others' staged data.
      Status st = entries[k] ? RunStaged(ctx, host, ps, *group[k], entries[k], &(*results)[k], keep)
                             : host.RunOnHost(ctx, ps, *group[k], nullptr, nullptr);
      if (first.ok()) first = st;
    }
    return first;
  }
  // This process's GPU; a joined rank that never submitted a GPU tensor takes its local
  // rank's device, the usual binding.
  int dev = ctx.gpu_device;
  if (dev < 0 && gpu::Libraries::Get().available()) {
    const int count = gpu::Runtime::Get().DeviceCount();
    if (count > 0) dev = settings_.local_rank % count;
  }
  Status local = dev >= 0 ? nccl_->Start(dev, settings_.spin, settings_.stall_check_s, settings_.stall_shutdown_s)
                          : Status::Error(StatusCode::UNSUPPORTED_TYPE,
                                          "this rank cannot take part in a GPU collective: " +
                                              (gpu::Libraries::Get().available() ? std::string("no GPU device")
                                                                                 : gpu::Libraries::Get().problem()));
  gpu::ncclComm comm;
  Status st = nccl_->Communicator(ps, &comm);  // collective the first time for this set
  if (!st.ok()) return local.ok() ? st : local;
  for (Pending* p : entries) {
    if (!p) continue;
    if (local.ok()) local = nccl_->stream().WaitFor(p->ready);
    p->ready.reset();  // the wait is enqueued; the event may be recorded again
  }

  // Local preparation, then (where it can fail on one member alone) the agreement, then the
  // launch. A member whose part cannot run without an agreement step aborts the set's
  // communicator: the others launched, and what follows on it must fail, not run out of step.
  auto agree_or_abort = [&](bool agreement) {
    if (agreement) return NcclCommunicators::Agree(ps, local);
    if (!local.ok()) nccl_->communicators().Abort(ps.id, local.message);
    return local;
  };
  const int64_t esize = DataTypeSize(r.dtype);
  switch (r.op) {
    case OpType::ALLREDUCE: {
      // join_mode is the same on every rank: a joined one reduces zeros from the fusion buffer.
      const bool fused = group.size() > 1 || ctx.join_mode;
      const bool custom = NcclNeedsCustomOp(r.dtype, r.reduce_op, r.prescale, r.postscale);
      // A fused group's scale factors go into its copies (the prescale when packing, the
      // postscale when unpacking, Horovod's order) where every member has the copy kernel:
      // agreed per set, so every member launches the same reduction operator.
      const bool scale_in_copies = fused && custom && nccl_->communicators().ScalesInKernel(ps.id, r.dtype);
      NcclBackend::RedOp op;
      if (local.ok())
        local = scale_in_copies ? nccl_->MakeRedOp(ps.id, r.dtype, r.reduce_op, 1.0, 1.0, ps.size(), &op)
                                : nccl_->MakeRedOp(ps.id, r.dtype, r.reduce_op, r.prescale, r.postscale, ps.size(), &op);
      if (!fused) {
        st = agree_or_abort(custom);
        if (st.ok()) {
          Pending* p = entries[0];
          st = nccl_->Allreduce(ps.id, p->input, p->output, NumElements(r.shape), r.dtype, op);
        }
        nccl_->FreeRedOp(ps.id, op);
        return st;
      }
      // Fused (or a joined rank's zeros): one NCCL call over the device fusion buffer.
      int64_t total = 0;
      for (const Response* g : group) total += Bytes(*g);
      void* buf = nullptr;
      if (local.ok()) local = nccl_->stream().FusionBuffer(total, &buf);
      // One batched copy in, one out (a joined rank's zeros are a memset).
      std::vector<gpu::Copy> in, out;
      int64_t off = 0;
      for (size_t k = 0; k < group.size() && local.ok(); ++k) {
        const int64_t b = Bytes(*group[k]);
        if (entries[k]) {
          in.push_back(gpu::Copy{At(buf, off), entries[k]->input, b});
          out.push_back(gpu::Copy{entries[k]->output, At(buf, off), b});
        } else {
          local = nccl_->stream().Zero(At(buf, off), b);
        }
        off += b;
      }
      if (local.ok()) local = nccl_->stream().CopyMany(in, r.dtype, scale_in_copies ? r.prescale : 1.0);
      st = agree_or_abort(true);
      if (st.ok()) st = nccl_->Allreduce(ps.id, buf, buf, total / esize, r.dtype, op);
      nccl_->FreeRedOp(ps.id, op);
      if (st.ok()) st = nccl_->stream().CopyMany(out, r.dtype, scale_in_copies ? r.postscale : 1.0);
      return st;
    }
    case OpType::BROADCAST: {
      st = agree_or_abort(false);
      if (!st.ok()) return st;
      Pending* p = entries[0];
      return nccl_->Broadcast(ps.id, p->input, p->output, NumElements(p->request.shape) * esize, ps.IndexOf(r.root));
    }
    case OpType::ALLGATHER: {
      Pending* p = entries[0];
      const Request& q = p->request;
      const int64_t row_bytes = RowBytes(q);
      std::vector<int64_t> counts;
      int64_t rows = 0;
      for (int64_t d : r.rank_dim0) {
        counts.push_back(d * row_bytes);
        rows += d;
      }
      Result& res = (*results)[0];
      if (local.ok()) local = nccl_->stream().AllocateOutput(rows * row_bytes, &res.device_output);
      st = agree_or_abort(true);
      if (!st.ok()) {
        res.device_output.reset();
        return st;
      }
      res.output_shape = q.shape;
      res.output_shape[0] = rows;
      res.device_output->shape = res.output_shape;
      res.device_output->dtype = q.dtype;
      return nccl_->Allgatherv(ps.id, p->input, res.device_output->data(), counts, Prefix(counts), ps.set_rank);
    }
    case OpType::ALLTOALL: {
      Pending* p = entries[0];
      const Request& q = p->request;
      const int64_t row_bytes = RowBytes(q);
      const int n_set = ps.size(), me = ps.set_rank;
      Result& res = (*results)[0];
      std::vector<int64_t> send_counts, recv_counts;
      int64_t rows = 0;
      for (int peer = 0; peer < n_set; ++peer) {
        send_counts.push_back(r.split_matrix[static_cast<size_t>(me * n_set + peer)] * row_bytes);
        const int64_t recv_rows = r.split_matrix[static_cast<size_t>(peer * n_set + me)];
        recv_counts.push_back(recv_rows * row_bytes);
        res.received_splits.push_back(recv_rows);
        rows += recv_rows;
      }
      if (local.ok()) local = nccl_->stream().AllocateOutput(rows * row_bytes, &res.device_output);
      st = agree_or_abort(true);
      if (!st.ok()) {
        res.device_output.reset();
        return st;
      }
      res.output_shape = q.shape;
      res.output_shape[0] = rows;
      res.device_output->shape = res.output_shape;
      res.device_output->dtype = q.dtype;
      return nccl_->Alltoallv(ps.id, p->input, send_counts, Prefix(send_counts), res.device_output->data(), recv_counts,
                              Prefix(recv_counts), me);
    }
    case OpType::REDUCESCATTER: {
      Pending* p = entries[0];
      const Request& q = p->request;
      const int64_t dim0 = q.shape[0], row_elems = RowBytes(q) / esize;
      const int n_set = ps.size();
      std::vector<int64_t> counts;
      for (int peer = 0; peer < n_set; ++peer) counts.push_back((dim0 / n_set + (peer < dim0 % n_set ? 1 : 0)) * row_elems);
      NcclBackend::RedOp op;
      if (local.ok()) local = nccl_->MakeRedOp(ps.id, r.dtype, r.reduce_op, r.prescale, r.postscale, n_set, &op);
      st = agree_or_abort(NcclNeedsCustomOp(r.dtype, r.reduce_op, r.prescale, r.postscale));
      if (st.ok()) st = nccl_->ReduceScatter(ps.id, p->input, p->output, counts, r.dtype, op, ps.set_rank);
      nccl_->FreeRedOp(ps.id, op);
      return st;
    }
    default:
      return Status::Error(StatusCode::INTERNAL, std::string("internal: ") + OpTypeName(r.op) + " on the GPU path");
  }
}

}  // namespace collectives
