#include "algorithms/cross_memory_allreduce.h"

#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>

#include "common/log.h"
#include "shm/shared_segment.h"

namespace collectives {
namespace {

// Before sleeping on a shared word: peers publish a call within microseconds of each other (the
// negotiation has just agreed on it), and a chunk takes tens of microseconds; a peer later than
// the yield phase is off its core, and the futex wake (not polling) ends the sleep.
WaitPhases CallPhases() {
  WaitPhases p;
  p.spin = std::chrono::microseconds(30);
  p.yield = std::chrono::microseconds(200);
  p.yield_oversubscribed = std::chrono::microseconds(20);
  p.sleep = false;  // then the futex
  return p;
}
const WaitPhases kCallPhases = CallPhases();
constexpr const char* kDuring = "a cross-memory allreduce on this host";

// Yama's ptrace_scope 1 lets a process attach only to its descendants, unless the target names
// it; the ranks are siblings, so each lets any process of its user attach (what Open MPI's CMA
// transport does). Scopes 2 and 3 forbid it whatever we say: the probe then fails.
void AllowAttachUnderYama() {
  std::ifstream scope("/proc/sys/kernel/yama/ptrace_scope");
  int value = 0;
  if (scope >> value && value == 1) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

// Reads `bytes` at `address` of rank `rank`'s process (pids[rank]) by cross-memory attach.
Status Read(const std::vector<pid_t>& pids, int rank, uint64_t address, void* local, size_t bytes) {
  while (bytes > 0) {
    iovec here{local, bytes}, there{reinterpret_cast<void*>(address), bytes};
    const ssize_t moved = process_vm_readv(pids[static_cast<size_t>(rank)], &here, 1, &there, 1, 0);
    if (moved <= 0)
      return Status::Error(StatusCode::INTERNAL, "process_vm_readv from rank " + std::to_string(rank) + " (pid " +
                                                     std::to_string(pids[static_cast<size_t>(rank)]) +
                                                     ") failed: " + std::strerror(moved < 0 ? errno : EIO));
    local = static_cast<char*>(local) + moved;
    address += static_cast<uint64_t>(moved);
    bytes -= static_cast<size_t>(moved);
  }
  return Status::Ok();
}

// Writes `bytes` at `address` of rank `rank`'s process.
Status Write(const std::vector<pid_t>& pids, int rank, uint64_t address, const void* local, size_t bytes) {
  while (bytes > 0) {
    iovec here{const_cast<void*>(local), bytes}, there{reinterpret_cast<void*>(address), bytes};
    const ssize_t moved = process_vm_writev(pids[static_cast<size_t>(rank)], &here, 1, &there, 1, 0);
    if (moved <= 0)
      return Status::Error(StatusCode::INTERNAL, "process_vm_writev to rank " + std::to_string(rank) + " (pid " +
                                                     std::to_string(pids[static_cast<size_t>(rank)]) +
                                                     ") failed: " + std::strerror(moved < 0 ? errno : EIO));
    local = static_cast<const char*>(local) + moved;
    address += static_cast<uint64_t>(moved);
    bytes -= static_cast<size_t>(moved);
  }
  return Status::Ok();
}

}  // namespace

Status CrossMemoryAllreduce::Init(MPI_Comm comm, int local_size, bool enabled) {
  Release();
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
  bytes_ = static_cast<size_t>(size_) * sizeof(Published) + 2 * sizeof(Block);
  void* mapped = nullptr;
  Status st = MapJobSegment(comm, local_size, enabled, "COLLECTIVES_CMA_ALLREDUCE", bytes_, "cma", &mapped, &pids_,
                            &blocker_);
  if (!st.ok() || mapped == nullptr) return st;
  base_ = static_cast<char*>(mapped);
  calls_ = 0;
  AllowAttachUnderYama();
  st = Probe(comm);
  if (!st.ok()) {
    Release();
    return st;
  }
  if (base_ == nullptr) {
    Log(LogLevel::INFO, "cross-memory allreduce off: " + blocker_);
    return Status::Ok();
  }
  scratch_.assign(2 * static_cast<size_t>(kChunkBytes), 0);
  Log(LogLevel::INFO, "cross-memory allreduce on " + std::to_string(size_) + " ranks");
  return Status::Ok();
}

// Every rank reads a word from every peer and writes one into it; then all agree.
Status CrossMemoryAllreduce::Probe(MPI_Comm comm) {
  std::vector<uint64_t> mine(static_cast<size_t>(size_), 0);  // peers write their rank + 1 at [rank]
  mine[static_cast<size_t>(rank_)] = static_cast<uint64_t>(rank_) + 1;
  PublishedBy(rank_)->in = reinterpret_cast<uint64_t>(mine.data());
  if (MPI_Barrier(comm) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "MPI_Barrier probing cross-memory attach failed");
  std::string why;
  for (int r = 0; r < size_ && why.empty(); ++r) {
    if (r == rank_) continue;
    const uint64_t theirs = PublishedBy(r)->in;
    uint64_t seen = 0;
    const uint64_t token = static_cast<uint64_t>(rank_) + 1;
    Status st = Read(pids_, r, theirs + 8 * static_cast<uint64_t>(r), &seen, sizeof(seen));
    if (st.ok() && seen != static_cast<uint64_t>(r) + 1) st = Status::Error(StatusCode::INTERNAL, "read a wrong word");
    if (st.ok()) st = Write(pids_, r, theirs + 8 * static_cast<uint64_t>(rank_), &token, sizeof(token));
    if (!st.ok()) why = st.message;
  }
  if (MPI_Barrier(comm) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "MPI_Barrier probing cross-memory attach failed");
  for (int r = 0; r < size_ && why.empty(); ++r)
    if (mine[static_cast<size_t>(r)] != static_cast<uint64_t>(r) + 1) why = "a peer's write did not arrive";
  int ok = why.empty() ? 1 : 0, everyone = 0;
  if (MPI_Allreduce(&ok, &everyone, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "MPI_Allreduce agreeing on cross-memory attach failed");
  PublishedBy(rank_)->in = 0;
  if (!everyone) {
    munmap(base_, bytes_);
    base_ = nullptr;
    blocker_ = why.empty() ? "another rank could not attach to its peers' memory"
                           : "this rank could not attach to a peer's memory: " + why;
  }
  return Status::Ok();
}

void CrossMemoryAllreduce::Release() {
  if (base_ != nullptr) munmap(base_, bytes_);
  base_ = nullptr;
  blocker_ = "not set up";
}


// Elements [lo, lo + n) of the result, into every rank's output. The result does not depend on
// which rank computes it: with two ranks it is in0 op in1 (every op is commutative, and IEEE
// addition and multiplication are so bit for bit); with more, the inputs are folded in rank order.
Status CrossMemoryAllreduce::ReduceChunk(const MpiBackend& backend, const void* in, void* out, int64_t lo, int64_t n,
                                         DataType dtype, ReduceOp op, const PostReduceFn& post) {
  const int64_t esize = DataTypeSize(dtype);
  const size_t bytes = static_cast<size_t>(n * esize);
  const uint64_t off = static_cast<uint64_t>(lo * esize);
  const char* own_in = static_cast<const char*>(in) + off;
  char* own_out = static_cast<char*>(out) + off;
  char* peer_scratch = scratch_.data();
  Status st;
  if (size_ == 2) {
    const int peer = 1 - rank_;
    if (in == out) {
      st = Read(pids_, peer, PublishedBy(peer)->in + off, peer_scratch, bytes);
      if (st.ok()) st = backend.ReduceLocal(peer_scratch, own_out, n, dtype, op);
    } else {
      st = Read(pids_, peer, PublishedBy(peer)->in + off, own_out, bytes);
      if (st.ok()) st = backend.ReduceLocal(own_in, own_out, n, dtype, op);
    }
  } else {
    char* acc = in == out ? scratch_.data() + kChunkBytes : own_out;
    for (int r = 0; r < size_ && st.ok(); ++r) {
      if (r == 0) {
        if (rank_ == 0) std::memcpy(acc, own_in, bytes);
        else st = Read(pids_, 0, PublishedBy(0)->in + off, acc, bytes);
        continue;
      }
      const char* operand = own_in;
      if (r != rank_) {
        st = Read(pids_, r, PublishedBy(r)->in + off, peer_scratch, bytes);
        operand = peer_scratch;
      }
      if (st.ok()) st = backend.ReduceLocal(operand, acc, n, dtype, op);
    }
    if (st.ok() && acc != own_out) std::memcpy(own_out, acc, bytes);
  }
  if (st.ok() && post) post(own_out, n);
  for (int r = 0; r < size_ && st.ok(); ++r)
    if (r != rank_) st = Write(pids_, r, PublishedBy(r)->out + off, own_out, bytes);
  return st;
}

Status CrossMemoryAllreduce::Allreduce(const MpiBackend& backend, const void* in, void* out, int64_t count,
                                       DataType dtype, ReduceOp op, const PostReduceFn& post) {
  const uint32_t call = ++calls_;
  Block* block = BlockOf(call);
  if (rank_ == 0) {  // nobody uses this block until rank 0 has published the call (see the header)
    block->taken.value.store(0, std::memory_order_relaxed);
    block->done.value.store(0, std::memory_order_relaxed);
    block->failed_by.store(0, std::memory_order_relaxed);
  }
  Published* mine = PublishedBy(rank_);
  mine->in = reinterpret_cast<uint64_t>(in);
  mine->out = reinterpret_cast<uint64_t>(out);
  mine->call.Publish(call);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    Status st = PublishedBy(r)->call.WaitReached(call, kCallPhases, pids_, rank_, kDuring);
    if (!st.ok()) return st;
  }
  const int64_t per_chunk = kChunkBytes / DataTypeSize(dtype);
  const uint32_t chunks = static_cast<uint32_t>((count + per_chunk - 1) / per_chunk);
  // After a failure, the chunks still handed out are counted done without being computed: every
  // rank (the failing one too) still waits for the count, so none leaves while a peer may be
  // writing into its buffers.
  Status failure;
  while (true) {
    const uint32_t k = block->taken.value.fetch_add(1, std::memory_order_relaxed);
    if (k >= chunks) break;
    if (failure.ok() && block->failed_by.load(std::memory_order_relaxed) == 0) {
      const int64_t lo = static_cast<int64_t>(k) * per_chunk;
      failure = ReduceChunk(backend, in, out, lo, std::min(per_chunk, count - lo), dtype, op, post);
      if (!failure.ok()) block->failed_by.store(static_cast<uint32_t>(rank_) + 1);
    }
    block->done.Add(1);
  }
  Status st = block->done.WaitReached(chunks, kCallPhases, pids_, rank_, kDuring);
  if (!st.ok()) return st;
  if (!failure.ok()) return failure;
  const uint32_t failed_by = block->failed_by.load();
  if (failed_by != 0)
    return Status::Error(StatusCode::INTERNAL, "a cross-memory allreduce failed on rank " +
                                                   std::to_string(failed_by - 1) + ": its error says why");
  return Status::Ok();
}

}  // namespace collectives
