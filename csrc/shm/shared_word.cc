#include "shm/shared_word.h"

#include <chrono>
#include <climits>

#include "shm/futex.h"
#include "backends/mpi/mpi_wait.h"
#include "shm/shared_segment.h"

namespace collectives {
namespace {
constexpr auto kLookEvery = std::chrono::milliseconds(20);  // a sleeper's looks at the peer's liveness
}  // namespace

void SharedWord::Publish(uint32_t v) {
  // Sequentially consistent store, then load: either a waiter about to sleep sees the new value
  // (its futex wait returns at once), or this side sees it asleep and wakes it.
  value.store(v);
  if (sleepers.load() != 0) Futex(&value, FUTEX_WAKE, INT32_MAX, nullptr, 0);
}

uint32_t SharedWord::Add(uint32_t n) {
  const uint32_t v = value.fetch_add(n) + n;
  if (sleepers.load() != 0) Futex(&value, FUTEX_WAKE, INT32_MAX, nullptr, 0);
  return v;
}

Status SharedWord::WaitReached(uint32_t target, const WaitPhases& phases, const std::vector<pid_t>& pids, int self,
                               const char* during) {
  if (Reached(value.load(std::memory_order_acquire), target)) return Status::Ok();
  {
    Waiter waiter(phases);
    while (true) {
      if (Reached(value.load(std::memory_order_acquire), target)) return Status::Ok();
      if (!waiter.Pause()) break;
    }
  }
  const timespec look{0, std::chrono::duration_cast<std::chrono::nanoseconds>(kLookEvery).count()};
  while (true) {
    sleepers.fetch_add(1);
    const uint32_t seen = value.load();
    if (!Reached(seen, target)) Futex(&value, FUTEX_WAIT, seen, &look, 0);
    sleepers.fetch_sub(1);
    if (Reached(value.load(std::memory_order_acquire), target)) return Status::Ok();
    if (WaitAborted()) return Status::Error(StatusCode::INTERNAL, "the wait was aborted");
    for (size_t r = 0; r < pids.size(); ++r)
      if (static_cast<int>(r) != self && ProcessGone(pids[r]))
        return Status::Error(StatusCode::INTERNAL, "rank " + std::to_string(r) + " (pid " + std::to_string(pids[r]) +
                                                       ") exited during " + during);
  }
}

}  // namespace collectives
