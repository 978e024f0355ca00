#include "algorithms/shm_allreduce.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/log.h"
#include "shm/shared_segment.h"
#include "wait/wait_policy.h"

namespace collectives {
namespace {

// How a waiting rank treats the core (wait_policy.h): a call takes tens of microseconds, so it
// first spins, then yields the core between looks, which leaves it to any other thread that can
// run there (a framework thread, a data loader, a late peer). On a machine with a core to spare
// it must not sleep early: every call has two barriers, and sleeps of even 20-250 us at each of
// them (mpi_wait.h's phases for one long MPI call) doubled the time of a 64 MiB allreduce (then
// cut in slot-sized pieces) at load 7 on the 2-core VM. So its yield phase is long: a peer later
// than that is computing or descheduled, and then sleeping costs nothing. On an oversubscribed
// machine a yield loop takes a contended core (wait_policy.h): it sleeps after a few yields.
WaitPhases BarrierPhases() {
  WaitPhases p;
  p.spin = std::chrono::microseconds(25);
  p.yield = std::chrono::milliseconds(2);
  p.yield_oversubscribed = std::chrono::microseconds(20);
  p.first_sleep = std::chrono::microseconds(20);
  p.longest_sleep = std::chrono::microseconds(250);
  return p;
}
const WaitPhases kBarrierPhases = BarrierPhases();
constexpr auto kLivenessEvery = std::chrono::milliseconds(20);

}  // namespace

Status ShmAllreduce::Init(MPI_Comm comm, int local_size, bool enabled) {
  Release();
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
  bytes_ = ShmSegmentLayout::Bytes(size_);
  void* mapped = nullptr;
  Status st = MapJobSegment(comm, local_size, enabled, "COLLECTIVES_SHM_ALLREDUCE", bytes_, "shm", &mapped, &pids_,
                            &blocker_);
  if (!st.ok()) return st;
  if (mapped == nullptr) {
    if (enabled && size_ > 1 && local_size == size_) Log(LogLevel::INFO, "shared-memory allreduce off: " + blocker_);
    return Status::Ok();
  }
  segment_.Place(static_cast<char*>(mapped), size_);
  barriers_ = 0;
  pieces_ = 0;
  Log(LogLevel::INFO, "shared-memory allreduce on " + std::to_string(size_) + " ranks");
  return Status::Ok();
}

Status ShmAllreduce::Run(const HostAllreduce& c) {
  Status st = Allreduce(c.mpi, c.input, c.output, c.facts.count, c.facts.dtype, c.facts.op);
  if (st.ok()) c.scale(c.output, c.facts.count);
  return st;
}

void ShmAllreduce::Release() {
  if (segment_.base() != nullptr) munmap(segment_.base(), bytes_);
  segment_.Place(nullptr, 0);
  blocker_ = "not set up";
}

Status ShmAllreduce::Barrier() {
  const uint64_t target = ++barriers_;
  segment_.Counter(rank_)->store(target, std::memory_order_release);
  Waiter waiter(kBarrierPhases);  // one wait, whichever peers it waits for
  auto next_check = std::chrono::steady_clock::now() + kLivenessEvery;
  unsigned looks = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    std::atomic<uint64_t>* c = segment_.Counter(r);
    while (c->load(std::memory_order_acquire) < target) {
      waiter.Pause();
      if (++looks % 64 != 0) continue;  // the clock and /proc only now and then
      const auto now = std::chrono::steady_clock::now();
      if (now >= next_check) {
        next_check = now + kLivenessEvery;
        if (c->load(std::memory_order_acquire) < target && ProcessGone(pids_[static_cast<size_t>(r)]))
          return Status::Error(StatusCode::INTERNAL, "rank " + std::to_string(r) + " (pid " +
                                                         std::to_string(pids_[static_cast<size_t>(r)]) +
                                                         ") exited during a shared-memory allreduce on this host");
      }
    }
  }
  return Status::Ok();
}

Status ShmAllreduce::Allreduce(const MpiBackend& backend, const void* in, void* out, int64_t count, DataType dtype,
                               ReduceOp op) {
  // One piece: UseFor admits at most kMaxBytes == kSlotBytes. Successive calls alternate slots,
  // so that a rank may fill its next slot while the others still copy out of this one.
  const int64_t esize = DataTypeSize(dtype);
  const uint64_t piece = pieces_++;
  std::memcpy(segment_.Slot(rank_, piece), in, static_cast<size_t>(count * esize));
  Status st = Barrier();
  if (!st.ok()) return st;
  // Shares start on 64-byte boundaries: no two ranks write one cache line.
  const int64_t align = std::max<int64_t>(1, 64 / esize);
  const int64_t share = (((count + size_ - 1) / size_) + align - 1) / align * align;
  const int64_t lo = std::min(count, rank_ * share), hi = std::min(count, lo + share);
  if (lo < hi) {
    char* mine = segment_.Slot(rank_, piece) + lo * esize;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      st = backend.ReduceLocal(segment_.Slot(r, piece) + lo * esize, mine, hi - lo, dtype, op);
      if (!st.ok()) return st;
    }
  }
  st = Barrier();
  if (!st.ok()) return st;
  char* dst = static_cast<char*>(out);
  for (int r = 0; r < size_; ++r) {
    const int64_t rlo = std::min(count, r * share), rhi = std::min(count, rlo + share);
    if (rlo < rhi) std::memcpy(dst + rlo * esize, segment_.Slot(r, piece) + rlo * esize, static_cast<size_t>((rhi - rlo) * esize));
  }
  return Status::Ok();
}

}  // namespace collectives
