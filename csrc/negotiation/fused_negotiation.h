// The negotiation allreduce with a small allreduce riding along (issue 14, small-message latency).
//
// A cycle's first MPI call is an allreduce(AND) of the ready bits. When every rank is about to
// say "cache entry b is ready" and b is a small host allreduce, the data can travel in that same
// call: each rank appends its input and a descriptor of entry b to the bit vector, and one
// user-defined reduction ANDs the bits, keeps the descriptor only where all ranks' descriptors are
// equal, and reduces the payload. When the descriptors agree, every rank submitted b, b is ready
// everywhere, and the payload is its result: the cycle completes b without a second MPI call.
// When they do not (some rank was not ready, or speculated on another entry), the result holds
// nothing usable: the payload is ignored and b runs on the ordinary path in this or a later cycle,
// exactly as without this module. Every rank sees the same reduced descriptor and bits, so all
// take the same branch.
//
// The message is one element of a contiguous derived datatype: MPI applies a user reduction to
// whole elements, so the function always sees the complete layout (an implementation may split a
// buffer of many elements between ranks, never one element). The layout is the same on every rank
// in a given cycle, so the call matches everywhere whether or not a rank carries data.
//
// Payload capacity follows the sizes in use. A 4 KiB payload makes every cycle's message cost
// what a 4 KiB allreduce costs (9.6 against 5.7 us for 8 B, raw MPI, np=2 on the 2-core VM), so
// a cycle offers one of three capacities, 64 B, 512 B or 4 KiB. Each rank announces in the flags
// word the class its candidate needs, whether or not it fits this cycle; the next cycle's
// capacity grows at once to the largest class announced, and shrinks after kShrinkAfterCycles
// cycles in which nobody needed it. Every rank computes this from the same reduced flags, so all
// use the same layout in every cycle. A candidate too large for this cycle runs on the ordinary
// path, as one that did not ride along.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shm/shared_exchange.h"
#include "common/status.h"
#include "common/types.h"

namespace collectives {

class FusedNegotiation {
 public:
  // Largest payload carried by the MPI message: covers the latency cases (8 B .. 4 KiB).
  static constexpr int64_t kPayloadBytes = 4096;
  // Through shared memory, where a record costs only the bytes written: up to where the
  // shared-memory allreduce (shm_allreduce.h) takes over. Between 4 and 8 KiB the ordinary path
  // (the negotiation, then MPICH's allreduce) took 18 us against MPICH's 10 us alone (np=2, the
  // 2-core VM); carried, 8 KiB costs what 4 KiB did.
  static constexpr int64_t kSharedPayloadBytes = 16 * 1024;
  // The capacities a cycle may offer, smallest first.
  static constexpr int kClasses = 3;
  static constexpr int64_t kClassBytes[kClasses] = {64, 512, kPayloadBytes};
  static constexpr int kShrinkAfterCycles = 64;
  // Flags-word bits (inverted in the word, as the negotiation's own flags, csrc/negotiation/negotiator.cc,
  // which uses the bits below these): "some rank's candidate needs class 1 / class 2".
  static constexpr uint64_t kFlagWantClass1 = 1ull << 8, kFlagWantClass2 = 1ull << 9;

  // Collective over `comm`. `bit_words`: the length of the negotiation bit vector (flags, ready
  // bits, invalidations). With `shared` and every rank on this host (`local_size` of them), the
  // message travels through shared memory (shared_exchange.h) instead of MPI.
  Status Init(int bit_words, MPI_Comm comm, int local_size, bool shared);
  void Free();
  bool initialized() const { return op_ != MPI_OP_NULL; }

  // Whether an allreduce of `count` elements of `dtype` with `op` can ride along in some message
  // (Fits: in this cycle's).
  static bool Eligible(DataType dtype, ReduceOp op, int64_t count);
  // A nonzero descriptor of cache entry `bit` (bit < 2^20, count < 2^28).
  static uint64_t Describe(int bit, DataType dtype, ReduceOp op, int64_t count);
  static int DescribedBit(uint64_t descriptor) { return static_cast<int>(descriptor & 0xFFFFF) - 1; }
  // The payload a descriptor announces (what Describe packed, less the bit).
  struct Payload {
    DataType dtype;
    ReduceOp op;
    int64_t count;
  };
  static Payload Described(uint64_t descriptor) {
    return {static_cast<DataType>((descriptor >> 20) & 0xFF), static_cast<ReduceOp>((descriptor >> 28) & 0xFF),
            static_cast<int64_t>(descriptor >> 36)};
  }

  // Before Run: this rank's candidate has `bytes` of payload; the next cycles' capacity takes it
  // into account. Whether it rides along in this cycle: Fits.
  void Announce(int64_t bytes);
  bool Fits(int64_t bytes) const { return bytes <= capacity(); }
  // Shared memory costs no more for the largest payload: copies are of the bytes carried only.
  int64_t capacity() const { return shared_.active() ? kSharedPayloadBytes : kClassBytes[class_]; }
  // Why the last Run failed, when it was the shared-memory exchange (a peer exited); else empty.
  const std::string& failure() const { return failure_; }
  // Whether the message travels through shared memory rather than MPI.
  bool shared() const { return shared_.active(); }
  // For the stage report (latency_stages.h): how it travelled, and how often the MPI message's
  // payload capacity changed (kept after Free).
  const char* transport() const { return transport_; }
  uint64_t resizes() const { return resizes_; }

  // The negotiation allreduce: `bits` (bit_words words, the first one the inverted flags) ANDed
  // in place; `descriptor` 0 when this rank carries nothing, else `payload` holds
  // `payload_bytes` (which Fits) of input, already prescaled. Returns the MPI status; *agreed is
  // the reduced descriptor (0: no agreement).
  int Run(MPI_Comm comm, uint64_t* bits, uint64_t descriptor, const void* payload, int64_t payload_bytes,
          uint64_t* agreed);
  // After an agreed Run, before the next: writes the reduced payload (its descriptor's count of
  // elements) to `out`, which may be the input the Run carried.
  void ReduceInto(void* out) const;

 private:
  static constexpr int kHeaderWords = 2;  // [layout, descriptor]
  static void Combine(void* in, void* inout, int* len, MPI_Datatype* type);

  static int ClassOf(int64_t bytes);
  // After a shared exchange: the records' descriptors and bits combined into buf_, as Combine
  // would; their payloads stay in the records until ReduceInto.
  void CombineShared();
  // After a cycle: the capacity of the next one, from the classes announced everywhere.
  void Resize(uint64_t global_flags);

  int bit_words_ = 0, size_ = 0;
  std::vector<uint64_t> buf_;
  SharedExchange shared_;
  std::string failure_;
  const char* transport_ = "MPI";
  uint64_t resizes_ = 0;
  MPI_Datatype types_[kClasses] = {MPI_DATATYPE_NULL, MPI_DATATYPE_NULL, MPI_DATATYPE_NULL};
  int class_ = 0;             // this cycle's capacity (the same on every rank)
  int announced_ = -1;        // the class this rank's candidate needs in this cycle (-1: none)
  int quiet_ = 0;             // cycles since anybody needed class_
  int needed_meanwhile_ = -1;  // the largest class needed in those cycles
  MPI_Op op_ = MPI_OP_NULL;
};

}  // namespace collectives
