#include "algorithms/hierarchical.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <deque>
#include <map>

#include "common/log.h"
#include "backends/mpi/rank_agreement.h"

namespace collectives {
namespace {

// Bytes of the tensor one pipeline step carries: about 8 pieces of 1 to 4 MiB. Smaller pieces
// overlap the host's local work with the network sooner; larger ones pay each MPI call's fixed
// cost less often. Measured with this pipeline written in mpi4py, 2 hosts x 2 ranks at 1 Gbit/s:
// 64 MiB in 2, 4, 8 MiB pieces 1.08x, 1.07x, 1.10x the wire bound; 16 MiB in 1, 2, 4 MiB
// pieces 1.14x, 1.13x, 1.35x.
int64_t PieceBytes(int64_t bytes) {
  int64_t piece = 1LL << 20;
  while (piece < (4LL << 20) && piece * 8 < bytes) piece *= 2;
  return piece;
}

Status MpiCheck(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return Status::Error(StatusCode::INTERNAL,
                       std::string("hierarchical collective: ") + what + " failed: " + std::string(msg, static_cast<size_t>(len)));
}

std::vector<int64_t> Prefix(const std::vector<int64_t>& counts) {
  std::vector<int64_t> displs(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) displs[i] = displs[i - 1] + counts[i - 1];
  return displs;
}

// Large-count variants where the library has them (MPI-4); otherwise counts must fit an int.
#if MPI_VERSION >= 4
Status Gatherv(const void* send, int64_t send_bytes, void* recv, const std::vector<int64_t>& counts,
               const std::vector<int64_t>& displs, MPI_Comm comm) {
  std::vector<MPI_Count> c(counts.begin(), counts.end());
  std::vector<MPI_Aint> d(displs.begin(), displs.end());
  return MpiCheck(MPI_Gatherv_c(send, send_bytes, MPI_BYTE, recv, c.data(), d.data(), MPI_BYTE, 0, comm),
                  "MPI_Gatherv within the host");
}
Status AllgathervInPlace(void* recv, const std::vector<int64_t>& counts, const std::vector<int64_t>& displs,
                         MPI_Comm comm) {
  std::vector<MPI_Count> c(counts.begin(), counts.end());
  std::vector<MPI_Aint> d(displs.begin(), displs.end());
  return MpiCheck(MPI_Allgatherv_c(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, c.data(), d.data(), MPI_BYTE, comm),
                  "MPI_Allgatherv across hosts");
}
#else
bool Ints(const std::vector<int64_t>& v, std::vector<int>* out) {
  for (int64_t x : v) {
    if (x > INT_MAX) return false;
    out->push_back(static_cast<int>(x));
  }
  return true;
}
Status TooLarge() {
  return Status::Error(StatusCode::INVALID_ARGUMENT,
                       "hierarchical allgather: counts over 2^31-1 bytes need an MPI-4 library (large-count calls)");
}
Status Gatherv(const void* send, int64_t send_bytes, void* recv, const std::vector<int64_t>& counts,
               const std::vector<int64_t>& displs, MPI_Comm comm) {
  std::vector<int> c, d;
  if (send_bytes > INT_MAX || !Ints(counts, &c) || !Ints(displs, &d)) return TooLarge();
  return MpiCheck(MPI_Gatherv(send, static_cast<int>(send_bytes), MPI_BYTE, recv, c.data(), d.data(), MPI_BYTE, 0, comm),
                  "MPI_Gatherv within the host");
}
Status AllgathervInPlace(void* recv, const std::vector<int64_t>& counts, const std::vector<int64_t>& displs,
                         MPI_Comm comm) {
  std::vector<int> c, d;
  if (!Ints(counts, &c) || !Ints(displs, &d)) return TooLarge();
  return MpiCheck(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, c.data(), d.data(), MPI_BYTE, comm),
                  "MPI_Allgatherv across hosts");
}
#endif

}  // namespace

Status Hierarchy::Init(MPI_Comm comm, MPI_Comm local, MPI_Comm cross, bool want_allreduce, bool want_allgather) {
  local_ = local;
  cross_ = cross;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  // A host is named by its first rank; every rank learns every rank's host.
  int first = rank;
  Status st = MpiCheck(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, local), "MPI_Allreduce of the host's first rank");
  if (!st.ok()) return st;
  std::vector<int> firsts(static_cast<size_t>(size));
  st = MpiCheck(MPI_Allgather(&first, 1, MPI_INT, firsts.data(), 1, MPI_INT, comm), "MPI_Allgather of the ranks' hosts");
  if (!st.ok()) return st;
  // A knob set on some ranks only is off everywhere: every rank must take the same algorithm.
  std::vector<bool> agree;
  st = AgreeAcrossRanks(comm, {want_allreduce ? 1 : 0, want_allgather ? 1 : 0}, &agree);
  if (!st.ok()) return st;
  std::map<int, std::vector<int>> by_first;  // ordered by first rank: the order of the first ranks' cross communicator
  for (int r = 0; r < size; ++r) by_first[firsts[static_cast<size_t>(r)]].push_back(r);
  host_ranks_.clear();
  for (auto& kv : by_first) {
    if (kv.first == first) my_host_ = static_cast<int>(host_ranks_.size());
    host_ranks_.push_back(std::move(kv.second));
  }
  num_hosts_ = static_cast<int>(host_ranks_.size());
  host_major_ = true;
  bool homogeneous = true, one_each = true;
  int next = 0;
  for (const std::vector<int>& ranks : host_ranks_) {
    homogeneous = homogeneous && ranks.size() == host_ranks_[0].size();
    one_each = one_each && ranks.size() == 1;
    for (int r : ranks) host_major_ = host_major_ && r == next++;
  }

  allreduce_enabled = want_allreduce && agree[0];
  allgather_enabled = want_allgather && agree[1];
  if (rank == 0 && !(agree[0] && agree[1])) {
    Log(LogLevel::WARNING, std::string("COLLECTIVES_HIERARCHICAL_") + (!agree[0] ? "ALLREDUCE" : "ALLGATHER") +
                               " is set on some ranks only: every rank runs the flat algorithm (the ranks must agree)");
  }
  std::string layout;
  if (num_hosts_ == 1)
    layout = "all ranks are on one host";
  else if (one_each)
    layout = "every host runs one rank (nothing to combine within a host)";
  allgather_blocker_ = layout;
  allreduce_blocker_ = layout;
  if (layout.empty() && !homogeneous)
    allreduce_blocker_ = "the hosts run different numbers of ranks (the shards of equal local rank need a partner on every host)";
  if (rank == 0) {
    if (allreduce_enabled)
      Log(LogLevel::INFO, allreduce_blocker_.empty() ? "hierarchical allreduce on " + std::to_string(num_hosts_) + " hosts"
                                                     : "hierarchical allreduce falls back to flat: " + allreduce_blocker_);
    if (allgather_enabled)
      Log(LogLevel::INFO, allgather_blocker_.empty() ? "hierarchical allgather on " + std::to_string(num_hosts_) + " hosts"
                                                     : "hierarchical allgather falls back to flat: " + allgather_blocker_);
  }
  return Status::Ok();
}

void Hierarchy::Release() {
  for (auto& s : shards_) s.reset();
  staging_.reset();
}

bool Hierarchy::UseForAllreduce(int32_t process_set, int64_t count) const {
  // A process set other than the whole job has no host communicators of its own; fewer
  // elements than local ranks leave a rank without a shard.
  return allreduce_enabled && allreduce_blocker_.empty() && process_set == 0 && count >= local_size_;
}

bool Hierarchy::UseForAllgather(int32_t process_set) const {
  return allgather_enabled && allgather_blocker_.empty() && process_set == 0;
}

Status Hierarchy::Allreduce(MpiBackend& mpi, const void* input, void* output, int64_t count, DataType dtype,
                            ReduceOp op, const std::function<void(void*, int64_t)>& on_shard) {
  const int64_t esize = DataTypeSize(dtype);
  const int64_t L = local_size_;
  // Shards start on 64-byte boundaries (whole cache lines per rank); a full piece splits evenly.
  const int64_t unit = std::max<int64_t>(1, 64 / esize);
  const int64_t piece = std::max<int64_t>(L * unit, PieceBytes(count * esize) / esize / (L * unit) * (L * unit));
  const int64_t shard_cap = piece / L;
  for (auto& s : shards_)
    if (!s || s->size() < shard_cap * esize) {
      s.reset();
      s.reset(new HostBuffer(shard_cap * esize));
    }
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);

  struct Piece {
    int64_t offset;               // elements into the tensor
    std::vector<int64_t> counts;  // each local rank's shard, in elements
    char* shard;                  // this rank's shard: reduced within the host, then across hosts
    MPI_Request request;          // the allreduce across hosts
    bool even;                    // every shard has the same size: the block variants apply
  };
  // Finishing a piece: wait for its allreduce across hosts, scale this rank's shard, and put
  // the host's shards together in the output.
  auto finish = [&](Piece& p) {
    Status st = MpiCheck(MPI_Wait(&p.request, MPI_STATUS_IGNORE), "MPI_Wait for the allreduce across hosts");
    if (!st.ok()) return st;
    const int64_t mine = p.counts[static_cast<size_t>(local_rank_)];
    if (mine) on_shard(p.shard, mine);
    char* dest = out + p.offset * esize;
    if (p.even)
      return MpiCheck(MPI_Allgather(p.shard, static_cast<int>(mine * esize), MPI_BYTE, dest, static_cast<int>(mine * esize),
                                    MPI_BYTE, local_),
                      "MPI_Allgather within the host");
    std::vector<int64_t> bytes(p.counts);
    for (int64_t& b : bytes) b *= esize;
    return mpi.Allgatherv(local_, p.shard, mine * esize, dest, bytes, Prefix(bytes));
  };

  // Up to kInFlight allreduces across hosts are outstanding: when one more has started, the
  // oldest is finished, so that two cross the network while the next piece is reduced within
  // the host. One at a time leaves the link idle during its reduction steps and between pieces
  // (measured as for PieceBytes, 64 MiB in 4 MiB pieces: at most one outstanding 1.40x the wire
  // bound, two 1.13x, three 1.07x).
  std::deque<Piece> in_flight;
  int64_t next_buffer = 0;
  for (int64_t off = 0; off < count; off += piece) {
    const int64_t n = std::min(piece, count - off);
    Piece p{off, {}, static_cast<char*>(shards_[next_buffer]->data()), MPI_REQUEST_NULL, n == piece};
    next_buffer = (next_buffer + 1) % kInFlight;
    const int64_t base = ((n + L - 1) / L + unit - 1) / unit * unit;
    for (int64_t k = 0; k < L; ++k) p.counts.push_back(std::max<int64_t>(0, std::min(base, n - k * base)));
    // Full pieces split evenly and use the block variants (one count for every rank); the
    // general ones serve the last, uneven piece.
    Status st = p.even ? mpi.ReduceScatterBlock(local_, in + off * esize, p.shard, static_cast<int>(shard_cap), dtype, op)
                       : mpi.ReduceScatter(local_, in + off * esize, p.shard, p.counts, dtype, op);
    if (st.ok())
      st = mpi.StartAllreduce(cross_, p.shard, static_cast<int>(p.counts[static_cast<size_t>(local_rank_)]), dtype, op,
                              &p.request);
    if (!st.ok()) return st;
    in_flight.push_back(std::move(p));
    if (static_cast<int>(in_flight.size()) == kInFlight) {
      st = finish(in_flight.front());
      if (!st.ok()) return st;
      in_flight.pop_front();
    }
  }
  for (Piece& p : in_flight) {
    Status st = finish(p);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

Status Hierarchy::Allgatherv(MpiBackend& mpi, const void* send, void* recv, const std::vector<int64_t>& counts) {
  // The hosts' blocks in host order (each host's ranks ascending): rank order itself when
  // every host's ranks are consecutive, as launchers place them; otherwise the host's first
  // rank reorders them before spreading the result.
  std::vector<int64_t> host_bytes(static_cast<size_t>(num_hosts_), 0);
  for (int h = 0; h < num_hosts_; ++h)
    for (int r : host_ranks_[static_cast<size_t>(h)]) host_bytes[static_cast<size_t>(h)] += counts[static_cast<size_t>(r)];
  const std::vector<int64_t> host_displs = Prefix(host_bytes);
  const int64_t total = host_displs.back() + host_bytes.back();
  if (total == 0) return Status::Ok();
  char* blocks = static_cast<char*>(recv);
  if (!host_major_ && local_rank_ == 0) {
    if (!staging_ || staging_->size() < total) {
      staging_.reset();
      staging_.reset(new HostBuffer(total));
    }
    blocks = static_cast<char*>(staging_->data());
  }
  // 1. The host's rows on its first rank, in local-rank order.
  const std::vector<int>& mine = host_ranks_[static_cast<size_t>(my_host_)];
  std::vector<int64_t> local_counts;
  for (int r : mine) local_counts.push_back(counts[static_cast<size_t>(r)]);
  Status st = Gatherv(send, local_counts[static_cast<size_t>(local_rank_)], blocks + host_displs[static_cast<size_t>(my_host_)],
                      local_counts, Prefix(local_counts), local_);
  if (!st.ok()) return st;
  if (local_rank_ == 0) {
    // 2. The hosts' blocks among the hosts' first ranks.
    st = AllgathervInPlace(blocks, host_bytes, host_displs, cross_);
    if (!st.ok()) return st;
    if (blocks != recv) {
      const std::vector<int64_t> displs = Prefix(counts);
      const char* from = blocks;
      for (const std::vector<int>& ranks : host_ranks_)
        for (int r : ranks) {
          std::memcpy(static_cast<char*>(recv) + displs[static_cast<size_t>(r)], from, static_cast<size_t>(counts[static_cast<size_t>(r)]));
          from += counts[static_cast<size_t>(r)];
        }
    }
  }
  // 3. The whole result to the host's other ranks.
  return mpi.Broadcast(local_, recv, total, 0);
}

}  // namespace collectives
