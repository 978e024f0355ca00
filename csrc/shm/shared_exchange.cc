#include "shm/shared_exchange.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "shm/shared_segment.h"
#include "wait/wait_policy.h"

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

Status SharedExchange::Exchange() {
  const uint64_t k = ++exchanges_;
  const uint32_t target = static_cast<uint32_t>(k);
  LineOf(rank_)->Publish(target);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    Status st = LineOf(r)->WaitReached(target, kExchangePhases, pids_, rank_, "the negotiation on this host");
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

}  // namespace collectives
