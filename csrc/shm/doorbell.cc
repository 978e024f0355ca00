#include "shm/doorbell.h"

#include <climits>
#include <ctime>

#include "shm/futex.h"
#include "shm/shared_segment.h"

namespace collectives {
namespace {

// Which sleepers a ring wakes (FUTEX_WAKE_BITSET against each sleeper's FUTEX_WAIT_BITSET mask).
constexpr uint32_t kPeerRing = 1;
constexpr uint32_t kOwnRing = 2;

}  // namespace

Doorbell::Doorbell() = default;

// The bells stay mapped: a thread of this process may still be inside Sleep when the engine
// stops (as the waiters' count of wait_policy.h); a re-init maps new ones.
Doorbell::~Doorbell() = default;

Status Doorbell::Init(MPI_Comm comm, MPI_Comm local_comm) {
  int size = 0, local_size = 0, local_rank = 0, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(local_comm, &local_size);
  MPI_Comm_rank(local_comm, &local_rank);
  local_index_.assign(static_cast<size_t>(size), -1);
  static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
                "counters shared between processes");
  void* mapped = nullptr;
  std::string why;
  const size_t bytes = sizeof(Bell) * static_cast<size_t>(local_size);
  Status st = MapSharedSegment(local_comm, bytes, "doorbells", &mapped, &why);
  if (!st.ok()) return st;
  std::vector<int> ranks(static_cast<size_t>(local_size), -1);
  if (MPI_Allgather(&rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, local_comm) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "the doorbells' MPI_Allgather failed");
  if (mapped != nullptr) {
    bells_ = static_cast<Bell*>(mapped);  // zero-filled: all counts 0
    mine_ = &bells_[local_rank];
    for (int i = 0; i < local_size; ++i) local_index_[static_cast<size_t>(ranks[static_cast<size_t>(i)])] = i;
  }
  for (int r = 0; r < size; ++r)
    if (r != rank && local_index_[static_cast<size_t>(r)] < 0) mpi_peers_ = true;
  return Status::Ok();
}

bool Doorbell::RingsPeer(int rank) const {
  return bells_ != nullptr && rank >= 0 && static_cast<size_t>(rank) < local_index_.size() &&
         local_index_[static_cast<size_t>(rank)] >= 0;
}

uint32_t Doorbell::Seen() const { return mine_->count.load(); }

void Doorbell::Sleep(uint32_t seen, std::chrono::steady_clock::time_point until, bool hear_peers) {
  // FUTEX_WAIT_BITSET's timeout is absolute, on CLOCK_MONOTONIC: steady_clock's on Linux.
  static_assert(std::chrono::steady_clock::is_steady, "CLOCK_MONOTONIC");
  const auto since_boot = until.time_since_epoch();
  if (since_boot <= std::chrono::steady_clock::now().time_since_epoch()) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(since_boot).count();
  // Counted before the last look at the word, and a ringer bumps the word before it looks at
  // the count (both sequentially consistent): either the ringer sees this sleeper and wakes it,
  // or this sleeper sees the new count and does not sleep.
  mine_->sleepers.fetch_add(1);
  if (hear_peers) mine_->listeners.fetch_add(1);
  if (mine_->count.load() == seen) {
    timespec ts;
    ts.tv_sec = static_cast<time_t>(ns / 1000000000);
    ts.tv_nsec = static_cast<long>(ns % 1000000000);
    // Returns on a ring it hears, at `until`, or on a signal.
    Futex(&mine_->count, FUTEX_WAIT_BITSET, seen, &ts, hear_peers ? (kPeerRing | kOwnRing) : kOwnRing);
  }
  if (hear_peers) mine_->listeners.fetch_sub(1);
  mine_->sleepers.fetch_sub(1);
}

void Doorbell::Ring(Bell* bell, uint32_t wakes, const std::atomic<uint32_t>& waiting) {
  bell->count.fetch_add(1);
  if (waiting.load() > 0) Futex(&bell->count, FUTEX_WAKE_BITSET, INT_MAX, nullptr, wakes);
}

void Doorbell::RingOwn() { Ring(mine_, kOwnRing | kPeerRing, mine_->sleepers); }

void Doorbell::RingPeer(int rank, uint64_t cycle) {
  Bell* bell = &bells_[local_index_[static_cast<size_t>(rank)]];
  uint64_t seen = bell->announced.load();
  while (seen < cycle && !bell->announced.compare_exchange_weak(seen, cycle)) {
  }
  // Only sleepers that hear peers can be woken: while a rank's callers run its cycles, its engine
  // thread sleeps deaf to them, and each synchronous call would otherwise cost a system call here.
  Ring(bell, kPeerRing, bell->listeners);
}

bool Doorbell::PeerStarted(uint64_t cycle) const { return mine_->announced.load() >= cycle; }

}  // namespace collectives
