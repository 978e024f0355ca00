// Allreduce of host tensors through memory shared by the ranks of one host, used when the
// whole job runs on one host (the global process set only).
//
// Why: MPICH moves an intra-host allreduce through its point-to-point shared-memory cells,
// copying every byte through small cells and handshaking each; reducing straight out of a
// shared segment costs one copy in, one reduction of each rank's share, one copy out. Measured
// in the engine on the 2-core VM (np=2, float32 Sum, benchmarks/interleaved_bench.py with
// COLLECTIVES_SHM_ALLREDUCE on and off, two pairs of runs at load 1.6): 64 KiB 85 vs 118 us in
// place; out of place 8-30% faster from 64 KiB to 16 MiB; but in place from 1 MiB up MPICH's
// in-place algorithm, which copies less, was as fast or faster (1 MiB 500 vs 419 us, 16 MiB
// 6.9 vs 6.5 ms). So allreduces above one slot go elsewhere (by cross-memory attach,
// cross_memory_allreduce.h, or on MPI where that is off): whether a call is in place differs
// between ranks (a joined rank's zeros, allreduce_ on one rank and allreduce on another), and
// every rank must take the same path, so the choice can only follow the size.
//
// Layout: per rank, two slots of kSlotBytes (alternating calls, so that a rank may fill its
// next slot while the others still copy results out of the previous one) and one cache line
// holding the rank's barrier counter. A piece of the tensor goes: each rank copies its part into
// its slot; barrier; rank r reduces share r of the piece (all slots, in rank order) into its own
// slot; barrier; every rank copies each share out of its owner's slot. Every share is computed
// once, so every rank receives bit-identical results.
//
// The segment is a POSIX shared-memory object created by rank 0, opened by the others and
// unlinked at once, so nothing is left in /dev/shm whatever happens later; tearing down is a
// local munmap (no collective call that a dead rank could block).
#pragma once
#include <mpi.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/host_algorithm.h"
#include "backends/mpi/mpi_backend.h"
#include "common/status.h"
#include "common/types.h"

namespace collectives {

// Where things lie in the shared segment: a counter per rank, each apart from the others', then
// two slots per rank (alternate calls use alternate slots).
class ShmSegmentLayout {
 public:
  // Bytes of a piece: two slots per rank stay in a core's L2 cache on the machines measured.
  static constexpr int64_t kSlotBytes = 512 * 1024;
  static constexpr size_t kLine = 128;  // a counter's share (two lines: adjacent prefetch)

  static size_t Bytes(int size) {
    return static_cast<size_t>(size) * kLine + static_cast<size_t>(size) * 2 * static_cast<size_t>(kSlotBytes);
  }
  // The mapping of Bytes(size) at `base`, or null: none.
  void Place(char* base, int size) {
    base_ = base;
    slots_ = base ? base + static_cast<size_t>(size) * kLine : nullptr;
  }
  char* base() const { return base_; }
  char* Slot(int rank, uint64_t piece) const {
    return slots_ + (static_cast<size_t>(rank) * 2 + (piece & 1)) * static_cast<size_t>(kSlotBytes);
  }
  std::atomic<uint64_t>* Counter(int rank) const {
    return reinterpret_cast<std::atomic<uint64_t>*>(base_ + static_cast<size_t>(rank) * kLine);
  }

 private:
  char* base_ = nullptr;  // the mapping: counters, then slots
  char* slots_ = nullptr;
};

class ShmAllreduce final : public HostAllreduceAlgorithm {
 public:
  static constexpr int64_t kSlotBytes = ShmSegmentLayout::kSlotBytes;
  // Smaller allreduces stay on MPI: there the fixed cost of the barriers is what counts, and the
  // cached small ones ride in the negotiation anyway (fused_negotiation.h).
  static constexpr int64_t kMinBytes = 8 * 1024;
  // Larger ones go elsewhere (see above): one piece at most.
  static constexpr int64_t kMaxBytes = kSlotBytes;

  ~ShmAllreduce() { Release(); }

  // Collective over `comm`. Sets the segment up when `enabled`, the job has more than one rank and
  // every rank of `comm` is on this host (`local_size == size`); otherwise (or when any rank fails
  // to map it: every rank then agrees) allreduces stay on MPI, and blocker() says why.
  // A waiting rank treats its core as wait_policy.h says.
  Status Init(MPI_Comm comm, int local_size, bool enabled);
  void Release();

  bool active() const { return segment_.base() != nullptr; }
  const std::string& blocker() const { return blocker_; }
  // The same answer on every rank for the same call (it depends on the set and size only).
  bool UseFor(int process_set_id, int64_t bytes) const {
    return segment_.base() != nullptr && process_set_id == 0 && bytes >= kMinBytes && bytes <= kMaxBytes;
  }

  // in == out for in place. Returns INTERNAL when a rank of the host exited while this one
  // waited for it.
  Status Allreduce(const MpiBackend& backend, const void* in, void* out, int64_t count, DataType dtype, ReduceOp op);

  // In the executor's list (host_algorithm.h); scaled after the call.
  const char* name() const override { return "shared memory"; }
  bool Available() const override { return active(); }
  bool Applies(const AllreduceFacts& f) const override { return UseFor(f.process_set, f.bytes()); }
  Status Run(const HostAllreduce& call) override;

 private:
  Status Barrier();

  ShmSegmentLayout segment_;  // the mapping
  size_t bytes_ = 0;
  int rank_ = 0, size_ = 0;
  uint64_t barriers_ = 0;  // barriers this rank has passed: the same count on every rank
  uint64_t pieces_ = 0;    // calls done, whose parity picks the slot
  std::vector<pid_t> pids_;
  std::string blocker_ = "not set up";
};

}  // namespace collectives
