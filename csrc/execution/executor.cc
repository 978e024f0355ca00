// Running negotiated responses on the MPI backend: fusion of compatible allreduces into one
// buffer, the other collectives one by one, scaling, control operations (join, process
// sets: the engine runs them, Engine::ExecuteControl), and handing each outcome to the engine,
// which completes the handle. Every rank walks the same response list; a rank runs the
// responses of the process sets it belongs to, and a joined rank contributes zeros to
// allreduces it did not submit.
#include "execution/executor.h"

#include <cstring>

#include "host_math/buffer_math.h"
#include "common/log.h"

namespace collectives {
namespace {

int64_t Bytes(const Response& r) { return NumElements(r.shape) * DataTypeSize(r.dtype); }

bool Fusable(const Response& r) { return r.op == OpType::ALLREDUCE && r.error.empty(); }

// Host tensors larger than this are reduced where they lie instead of through the fusion
// buffer: copying in and out (about 13 us for 64 KiB at 10 GB/s) costs more than the MPI call
// that fusion saves (a few us). Measured on 161 ResNet-50 gradients at np=2: fusing
// everything 61 ms, fusing tensors up to 64 KiB 45 ms (mpi4py one call per tensor: 39 ms).
constexpr int64_t kMaxFusedTensorBytes = 64 * 1024;

bool SameFusionKey(const Response& a, const Response& b) {
  return a.dtype == b.dtype && a.reduce_op == b.reduce_op && a.prescale == b.prescale &&
         a.postscale == b.postscale && a.device == b.device && a.process_set == b.process_set;
}

std::string BackendEvent(OpType op) {
  switch (op) {
    case OpType::ALLREDUCE: return "MPI_ALLREDUCE";
    case OpType::BROADCAST: return "MPI_BCAST";
    case OpType::ALLGATHER: return "MPI_ALLGATHER";
    case OpType::ALLTOALL: return "MPI_ALLTOALL";
    case OpType::REDUCESCATTER: return "MPI_REDUCESCATTER";
    case OpType::BARRIER: return "BARRIER";
    default: return "CONTROL";
  }
}

// The call the watchdog names while a data operation runs.
BackendCall WatchedCallFor(OpType op) {
  switch (op) {
    case OpType::ALLREDUCE: return BackendCall::ALLREDUCE;
    case OpType::BROADCAST: return BackendCall::BROADCAST;
    case OpType::ALLGATHER: return BackendCall::ALLGATHER;
    case OpType::ALLTOALL: return BackendCall::ALLTOALL;
    case OpType::REDUCESCATTER: return BackendCall::REDUCESCATTER;
    default: return BackendCall::NONE;
  }
}

std::vector<int64_t> Prefix(const std::vector<int64_t>& counts) {
  std::vector<int64_t> displs(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) displs[i] = displs[i - 1] + counts[i - 1];
  return displs;
}

const ProcessSet* FindSet(const std::map<int32_t, ProcessSet>& sets, int32_t id) {
  auto it = sets.find(id);
  return it == sets.end() ? nullptr : &it->second;
}

}  // namespace

Status Executor::Init(MPI_Comm comm, MPI_Comm local, MPI_Comm cross, const ExecutorConfig& config,
                      std::atomic<const char*>* step) {
  config_ = config;
  device_.Configure({config.local_rank, config.spin, config.stall_check_s, config.stall_shutdown_s});
  Status st = backend_.Init();
  if (!st.ok()) return st;
  HostAlgorithmSettings settings;
  settings.local_size = config_.local_size;
  settings.hierarchical_allreduce = config_.hierarchical_allreduce;
  settings.hierarchical_allgather = config_.hierarchical_allgather;
  settings.shm_allreduce = config_.shm_allreduce;
  settings.cma_allreduce = config_.cma_allreduce;
  return algorithms_.Init(comm, local, cross, settings, step);
}

void Executor::Release() {
  backend_.Finalize();
  fusion_.reset();
  algorithms_.Release();
}

Status Executor::RunOnHost(const ExecutionContext& ctx, const ProcessSet& ps, const Response& resp, Pending* p,
                           Result* result) {
  return p ? ExecuteOne(ctx, ps, resp, *p, result) : ExecuteJoinedAllreduce(ctx, ps, resp);
}

void* Executor::FusionBuffer(int64_t bytes) {
  if (!fusion_ || fusion_->size() < bytes) {
    // Grow in powers of two so a warming-up training loop reallocates only a few times.
    int64_t grown = 1 << 20;
    while (grown < bytes) grown *= 2;
    fusion_.reset();  // free first: the old and new buffers need not coexist
    fusion_.reset(new HostBuffer(grown));
  }
  return fusion_->data();
}

std::vector<std::vector<size_t>> Executor::PlanFusion(const std::vector<Response>& responses,
                                                      int64_t fusion_threshold) const {
  // Greedy, in execution order: each unassigned allreduce collects later compatible ones
  // while the total stays within the fusion threshold. It reads only the responses, which
  // every rank has, so the plan is the same on every rank (joined and non-member ones too).
  std::vector<std::vector<size_t>> plan;
  std::vector<bool> assigned(responses.size(), false);
  for (size_t i = 0; i < responses.size(); ++i) {
    if (assigned[i]) continue;
    assigned[i] = true;
    plan.push_back({i});
    if (!Fusable(responses[i])) continue;
    int64_t bytes = Bytes(responses[i]);
    // The same for every response of this key.
    const int64_t cap = MaxFusedBytes(responses[i], fusion_threshold);
    if (bytes > cap) continue;
    for (size_t j = i + 1; j < responses.size(); ++j) {
      if (assigned[j] || !Fusable(responses[j]) || !SameFusionKey(responses[i], responses[j])) continue;
      const int64_t b = Bytes(responses[j]);
      if (b > cap || bytes + b > fusion_threshold) continue;
      bytes += b;
      assigned[j] = true;
      plan.back().push_back(j);
    }
  }
  return plan;
}

int64_t Executor::MaxFusedBytes(const Response& r, int64_t fusion_threshold) const {
  if (r.device < 0) return kMaxFusedTensorBytes;
  // GPU: copies run at hundreds of GB/s while each NCCL launch costs tens of microseconds,
  // so everything up to the threshold is fused (Horovod's rule); reductions NCCL cannot do
  // are staged through the host one by one.
  return NcclCanReduce(r.dtype, r.reduce_op, r.prescale, r.postscale) ? fusion_threshold : 0;
}

void Executor::PostReduce(const ProcessSet& ps, const Response& r, void* buf, int64_t n) {
  ScaleReduced(buf, n, r.dtype, r.reduce_op, r.postscale, ps.size());
}

Status Executor::Allreduce(const ProcessSet& ps, const Response& r, const void* input, void* output, int64_t n,
                           const std::vector<int64_t>* segments) {
  if (n == 0) return Status::Ok();
  if (r.prescale != 1.0) {
    ScaledCopy(output, input, n, r.dtype, r.prescale);
    input = output;
  }
  // The first host algorithm that takes it (host_algorithms.h); each scales where it suits it.
  const AllreduceFacts facts{ps.id, n, r.dtype, r.reduce_op};
  const ScaleReducedFn scale = [&](void* data, int64_t k) { PostReduce(ps, r, data, k); };
  return algorithms_.ForAllreduce(facts).Run({facts, backend_, ps.comm, input, output, segments, scale});
}

Status Executor::ExecuteJoinedAllreduce(const ExecutionContext& ctx, const ProcessSet& ps, const Response& r) {
  const int64_t n = NumElements(r.shape);
  if (n == 0) return Status::Ok();
  HostBuffer zeros(n * DataTypeSize(r.dtype));
  std::memset(zeros.data(), 0, static_cast<size_t>(zeros.size()));
  WatchedCall watched(ctx.watchdog, BackendCall::ALLREDUCE, ps.id, &r.name);
  return Allreduce(ps, r, zeros.data(), zeros.data(), n);  // the same algorithm as the ranks that submitted
}

Status Executor::ExecuteFused(const ExecutionContext& ctx, const ProcessSet& ps,
                              const std::vector<const Response*>& group, const std::vector<Pending*>& entries) {
  const Response& first = *group[0];
  const int64_t esize = DataTypeSize(first.dtype);
  int64_t total = 0;
  for (const Response* r : group) total += Bytes(*r);
  char* buf = static_cast<char*>(FusionBuffer(total));
  Timeline& timeline = ctx.timeline;
  const bool tl = timeline.active();
  auto phase = [&](const char* name) {
    if (tl)
      for (Pending* p : entries)
        if (p) timeline.Begin(p->request.name, name);
  };
  auto end_phase = [&] {
    if (tl)
      for (Pending* p : entries)
        if (p) timeline.End(p->request.name);
  };

  phase("MEMCPY_IN_FUSION_BUFFER");
  int64_t off = 0;
  for (size_t k = 0; k < group.size(); ++k) {
    const int64_t b = Bytes(*group[k]);
    if (b && entries[k]) std::memcpy(buf + off, entries[k]->input, static_cast<size_t>(b));
    if (b && !entries[k]) std::memset(buf + off, 0, static_cast<size_t>(b));  // joined: zeros
    off += b;
  }
  end_phase();

  phase("MPI_ALLREDUCE");
  Status st;
  {
    WatchedCall watched(ctx.watchdog, BackendCall::ALLREDUCE, ps.id, &first.name, static_cast<int>(group.size()));
    std::vector<int64_t> segments;  // the tensors' element counts: Adasum combines each on its own
    for (const Response* r : group) segments.push_back(NumElements(r->shape));
    st = Allreduce(ps, first, buf, buf, total / esize, &segments);
  }
  end_phase();
  if (!st.ok()) return st;

  phase("MEMCPY_OUT_FUSION_BUFFER");
  off = 0;
  for (size_t k = 0; k < group.size(); ++k) {
    const int64_t b = Bytes(*group[k]);
    if (b && entries[k]) std::memcpy(entries[k]->output, buf + off, static_cast<size_t>(b));
    off += b;
  }
  end_phase();
  return Status::Ok();
}

Status Executor::ExecuteOne(const ExecutionContext& ctx, const ProcessSet& ps, const Response& r, Pending& p,
                            Result* result) {
  const Request& q = p.request;
  const int64_t esize = DataTypeSize(q.dtype);
  const int64_t n = NumElements(q.shape);
  const int64_t row_elems = q.shape.empty() ? 1 : (q.shape[0] == 0 ? NumElements(std::vector<int64_t>(q.shape.begin() + 1, q.shape.end())) : n / q.shape[0]);
  const int64_t row_bytes = row_elems * esize;
  Timeline& timeline = ctx.timeline;
  const bool tl = timeline.active();
  WatchedCall watched(ctx.watchdog, WatchedCallFor(r.op), ps.id, &q.name);
  if (tl && r.op != OpType::BARRIER) timeline.Begin(q.name, BackendEvent(r.op));
  Status st;
  switch (r.op) {
    case OpType::ALLREDUCE:
      st = Allreduce(ps, r, p.input, p.output, n);
      break;
    case OpType::BROADCAST:
      // The root is a global rank (Horovod's convention); MPI wants its place in the set.
      if (config_.rank == r.root && p.input != p.output && n)
        std::memcpy(p.output, p.input, static_cast<size_t>(n * esize));
      st = backend_.Broadcast(ps.comm, p.output, n * esize, ps.IndexOf(r.root));
      break;
    case OpType::ALLGATHER: {
      std::vector<int64_t> counts;
      int64_t rows = 0;
      for (int64_t d : r.rank_dim0) {
        counts.push_back(d * row_bytes);
        rows += d;
      }
      result->output = std::make_shared<HostBuffer>(rows * row_bytes);
      result->output_shape = q.shape;
      result->output_shape[0] = rows;
      st = algorithms_.ForAllgather(ps.id).Run({ps.id, backend_, ps.comm, p.input, n * esize, result->output->data(),
                                                counts});
      break;
    }
    case OpType::ALLTOALL: {
      std::vector<int64_t> send_counts, recv_counts;
      int64_t rows = 0;
      const int n_set = ps.size(), me = ps.set_rank;
      for (int peer = 0; peer < n_set; ++peer) {
        send_counts.push_back(r.split_matrix[static_cast<size_t>(me * n_set + peer)] * row_bytes);
        const int64_t recv_rows = r.split_matrix[static_cast<size_t>(peer * n_set + me)];
        recv_counts.push_back(recv_rows * row_bytes);
        result->received_splits.push_back(recv_rows);
        rows += recv_rows;
      }
      result->output = std::make_shared<HostBuffer>(rows * row_bytes);
      result->output_shape = q.shape;
      result->output_shape[0] = rows;
      st = backend_.Alltoallv(ps.comm, p.input, send_counts, Prefix(send_counts), result->output->data(), recv_counts,
                              Prefix(recv_counts));
      break;
    }
    case OpType::REDUCESCATTER: {
      // The first dim0 % n members get one extra row.
      const int64_t dim0 = q.shape[0];
      const int n_set = ps.size();
      std::vector<int64_t> counts;
      int64_t total = 0;
      for (int peer = 0; peer < n_set; ++peer) {
        counts.push_back((dim0 / n_set + (peer < dim0 % n_set ? 1 : 0)) * row_elems);
        total += counts.back();
      }
      if (total == 0) break;
      const void* send = p.input;
      if (r.prescale != 1.0) {
        void* tmp = FusionBuffer(n * esize);
        ScaledCopy(tmp, p.input, n, q.dtype, r.prescale);
        send = tmp;
      }
      st = backend_.ReduceScatter(ps.comm, send, p.output, counts, q.dtype, r.reduce_op);
      if (st.ok()) PostReduce(ps, r, p.output, counts[static_cast<size_t>(ps.set_rank)]);
      break;
    }
    case OpType::BARRIER:
      break;  // every rank submitted it, which is all a barrier promises
    default:
      st = Status::Error(StatusCode::INTERNAL, "control operation on the data path");
  }
  if (tl && r.op != OpType::BARRIER) timeline.End(q.name);
  return st;
}

void Executor::Execute(CyclePlan& plan, const ExecutionContext& ctx) {
  const std::vector<Response>& responses = *plan.responses;
  if (responses.empty()) return;
  const size_t n = responses.size();
  Timeline& timeline = ctx.timeline;
  const std::vector<Pending*>& entries = plan.entries;  // this rank's, from the negotiator
  std::vector<const ProcessSet*> sets(n, nullptr);  // null: this rank takes no part
  const bool tl = timeline.active();
  for (size_t i = 0; i < n; ++i) {
    const Response& r = responses[i];
    const ProcessSet* ps = FindSet(ctx.sets, r.process_set);
    if (!ps || !ps->includes_me()) continue;  // another set's collective
    if (entries[i]) {
      sets[i] = ps;
      if (tl) {
        timeline.End(r.name);  // NEGOTIATE_<OP>
        timeline.Begin(r.name, OpTypeName(r.op));
        timeline.Begin(r.name, "QUEUE");
      }
    } else if (ctx.joined && r.op == OpType::ALLREDUCE && r.error.empty()) {
      sets[i] = ps;  // joined: contribute zeros
    } else if (r.op != OpType::JOIN && r.error.empty()) {
      Log(LogLevel::ERROR, "internal: response for unknown tensor '" + r.name + "'");
    }
  }

  std::vector<std::string>& orphans = plan.orphans;  // waiting requests of a removed process set
  for (const std::vector<size_t>& group : PlanFusion(responses, ctx.fusion_threshold)) {
    if (tl)
      for (size_t i : group)
        if (entries[i]) timeline.End(responses[i].name);  // QUEUE
    const size_t i = group[0];
    if (!sets[i]) continue;  // members of a fused group share the process set
    if (responses[i].device >= 0 && IsDataOp(responses[i].op) && responses[i].op != OpType::BARRIER &&
        responses[i].error.empty()) {
      // GPU memory: NCCL on the engine stream; handles complete when the GPU is done.
      std::vector<const Response*> rs;
      std::vector<Pending*> ps;
      for (size_t k : group) {
        rs.push_back(&responses[k]);
        ps.push_back(entries[k]);
      }
      device_.ExecuteGroup(ctx, *this, *sets[i], rs, ps);
      continue;
    }
    if (group.size() > 1) {
      std::vector<const Response*> rs;
      std::vector<Pending*> ps;
      for (size_t k : group) {
        rs.push_back(&responses[k]);
        ps.push_back(entries[k]);
      }
      Status st = ExecuteFused(ctx, *sets[i], rs, ps);
      for (Pending* p : ps) {
        if (!p) continue;
        Result res;
        res.status = st;
        ctx.engine.Finish(*p, std::move(res));
      }
      continue;
    }
    const Response& r = responses[i];
    Result res;
    if (!r.error.empty())
      res.status = Status::Error(StatusCode::MISMATCH, r.error);
    else if (!IsDataOp(r.op)) {
      res.status = ctx.engine.ExecuteControl(r, &res, &orphans);
      if (r.op == OpType::PROCESS_SET_REMOVE && res.status.ok())
        for (size_t k = i + 1; k < n; ++k)
          if (responses[k].process_set == r.root) sets[k] = nullptr;  // left to the orphans below
    }
    else if (entries[i])
      res.status = ExecuteOne(ctx, *sets[i], r, *entries[i], &res);
    else
      res.status = ExecuteJoinedAllreduce(ctx, *sets[i], r);
    if (!res.status.ok() && res.status.code == StatusCode::INTERNAL) Log(LogLevel::ERROR, res.status.message);
    if (entries[i]) ctx.engine.Finish(*entries[i], std::move(res));
  }
  // What ran here leaves the negotiator's table; it fails the orphans and updates the cache
  // (Negotiator::EndExecution).
  for (size_t i = 0; i < n; ++i)
    if (entries[i] && sets[i]) plan.ran[i] = 1;
}

}  // namespace collectives
