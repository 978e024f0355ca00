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
// Payload capacity follows the sizes in use (payload_classes.h); what may ride along and its
// descriptor: carried_payload.h. A candidate too large for this cycle runs on the ordinary path,
// as one that did not ride along.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/types.h"
#include "negotiation/carried_payload.h"
#include "negotiation/payload_classes.h"
#include "shm/shared_exchange.h"

namespace collectives {

class FusedNegotiation {
 public:
  // Largest payload carried: by the MPI message, through shared memory (carried_payload.h).
  static constexpr int64_t kPayloadBytes = PayloadClasses::kClassBytes[PayloadClasses::kClasses - 1];

  // Collective over `comm`. `bit_words`: the length of the negotiation bit vector (flags, ready
  // bits, invalidations). With `shared` and every rank on this host (`local_size` of them), the
  // message travels through shared memory (shared_exchange.h) instead of MPI.
  Status Init(int bit_words, MPI_Comm comm, int local_size, bool shared);
  void Free();
  bool initialized() const { return op_ != MPI_OP_NULL; }

  // Before Run: this rank's candidate has `bytes` of payload; the next cycles' capacity takes it
  // into account. Whether it rides along in this cycle: Fits.
  void Announce(int64_t bytes) { classes_.Announce(bytes); }
  bool Fits(int64_t bytes) const { return bytes <= capacity(); }
  // Shared memory costs no more for the largest payload: copies are of the bytes carried only.
  int64_t capacity() const {
    return shared_.active() ? CarriedPayload::kMaxBytes : PayloadClasses::kClassBytes[classes_.current()];
  }
  // Why the last Run failed, when it was the shared-memory exchange (a peer exited); else empty.
  const std::string& failure() const { return failure_; }
  // Whether the message travels through shared memory rather than MPI.
  bool shared() const { return shared_.active(); }
  // For the stage report (latency_stages.h): how it travelled, and how often the MPI message's
  // payload capacity changed (kept after Free).
  const char* transport() const { return transport_; }
  uint64_t resizes() const { return classes_.resizes(); }

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

  // After a shared exchange: the records' descriptors and bits combined into buf_, as Combine
  // would; their payloads stay in the records until ReduceInto.
  void CombineShared();

  int bit_words_ = 0, size_ = 0;
  std::vector<uint64_t> buf_;
  SharedExchange shared_;
  std::string failure_;
  const char* transport_ = "MPI";
  PayloadClasses classes_;  // the MPI message's capacity in this cycle and the next ones
  MPI_Datatype types_[PayloadClasses::kClasses] = {MPI_DATATYPE_NULL, MPI_DATATYPE_NULL, MPI_DATATYPE_NULL};
  MPI_Op op_ = MPI_OP_NULL;
};

}  // namespace collectives
