#include "shared_exchange.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "futex.h"
#include "mpi_wait.h"
#include "shared_segment.h"
#include "wait_policy.h"

namespace collectives {
namespace {

// Before sleeping: a peer that is already on its way answers within microseconds (spin), one
// that is scheduled out soon after (yield, which leaves the core to whoever can use it). A short
// yield phase: a sleeper here is woken by the publisher at once (a futex wake), not by polling,
// so sleeping early costs a wake-up, not a delay.
WaitPhases ExchangePhases() {
  WaitPhases p;
  p.spin = std::chrono::microseconds(30);
  p.yield = std::chrono::microseconds(200);
  p.yield_oversubscribed = std::chrono::microseconds(20);
  p.sleep = false;  // then the futex
  return p;
}
const WaitPhases kExchangePhases = ExchangePhases();
constexpr auto kLookEvery = std::chrono::milliseconds(20);  // a sleeper's looks at the peer's liveness

// Wrapping counters: whether `value` has reached `target` (they never drift 2^31 apart).
bool Reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

}  // namespace

Status SharedExchange::Init(MPI_Comm comm, int local_size, bool enabled, size_t record_bytes) {
  Release();
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
  slot_bytes_ = (record_bytes + 127) / 128 * 128;
  bytes_ = static_cast<size_t>(size_) * sizeof(Line) + static_cast<size_t>(size_) * 2 * slot_bytes_;
  void* mapped = nullptr;
  Status st = MapJobSegment(comm, local_size, enabled, "COLLECTIVES_SHM_NEGOTIATION", bytes_, "negotiation", &mapped,
                            &pids_, &blocker_);
  if (!st.ok() || mapped == nullptr) return st;
  base_ = static_cast<char*>(mapped);
  slots_ = base_ + static_cast<size_t>(size_) * sizeof(Line);
  exchanges_ = 0;
  return Status::Ok();
}

void SharedExchange::Release() {
  if (base_ != nullptr) munmap(base_, bytes_);
  base_ = nullptr;
  slots_ = nullptr;
  blocker_ = "not set up";
}

Status SharedExchange::Exchange(const void* mine, size_t bytes) {
  const uint64_t k = ++exchanges_;
  std::memcpy(Slot(rank_, k), mine, bytes);
  Line* own = LineOf(rank_);
  const uint32_t target = static_cast<uint32_t>(k);
  // Sequentially consistent store, then load: either a peer that is about to sleep sees the new
  // count (its futex wait returns at once), or this rank sees it asleep and wakes it.
  own->published.store(target);
  if (own->sleepers.load() != 0) Futex(&own->published, FUTEX_WAKE, INT32_MAX, nullptr, 0);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || Reached(LineOf(r)->published.load(std::memory_order_acquire), target)) continue;
    Status st = WaitFor(r, target);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

Status SharedExchange::WaitFor(int rank, uint32_t target) {
  Line* line = LineOf(rank);
  Waiter waiter(kExchangePhases);
  while (true) {
    if (Reached(line->published.load(std::memory_order_acquire), target)) return Status::Ok();
    if (!waiter.Pause()) break;
  }
  const timespec look{0, std::chrono::duration_cast<std::chrono::nanoseconds>(kLookEvery).count()};
  while (true) {
    line->sleepers.fetch_add(1);
    const uint32_t seen = line->published.load();
    if (!Reached(seen, target)) Futex(&line->published, FUTEX_WAIT, seen, &look, 0);
    line->sleepers.fetch_sub(1);
    if (Reached(line->published.load(std::memory_order_acquire), target)) return Status::Ok();
    if (WaitAborted()) return Status::Error(StatusCode::INTERNAL, "the wait was aborted");
    if (ProcessGone(pids_[static_cast<size_t>(rank)]))
      return Status::Error(StatusCode::INTERNAL, "rank " + std::to_string(rank) + " (pid " +
                                                     std::to_string(pids_[static_cast<size_t>(rank)]) +
                                                     ") exited during the negotiation on this host");
  }
}

}  // namespace collectives
