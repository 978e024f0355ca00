// What the negotiation message (fused_negotiation.h) may carry, and how a rank describes what it
// carries: the descriptor that every rank compares in the reduction, so that a payload is used
// only when every rank carried the same cache entry with the same dtype, op and count.
#pragma once
#include <cstdint>

#include "common/types.h"

namespace collectives {

struct CarriedPayload {
  // Through shared memory, where a record costs only the bytes written: up to where the
  // shared-memory allreduce (shm_allreduce.h) takes over. Between 4 and 8 KiB the ordinary path
  // (the negotiation, then MPICH's allreduce) took 18 us against MPICH's 10 us alone (np=2, the
  // 2-core VM); carried, 8 KiB costs what 4 KiB did. The MPI message carries less
  // (payload_classes.h).
  static constexpr int64_t kMaxBytes = 16 * 1024;

  DataType dtype;
  ReduceOp op;
  int64_t count;

  // Whether an allreduce of `count` elements of `dtype` with `op` can ride along in some message
  // (FusedNegotiation::Fits: in this cycle's).
  static bool Eligible(DataType dtype, ReduceOp op, int64_t count);
  // A nonzero descriptor of cache entry `bit` (bit < 2^20, count < 2^28).
  static uint64_t Describe(int bit, DataType dtype, ReduceOp op, int64_t count) {
    return static_cast<uint64_t>(bit + 1) | static_cast<uint64_t>(static_cast<uint8_t>(dtype)) << 20 |
           static_cast<uint64_t>(static_cast<uint8_t>(op)) << 28 | static_cast<uint64_t>(count) << 36;
  }
  static int DescribedBit(uint64_t descriptor) { return static_cast<int>(descriptor & 0xFFFFF) - 1; }
  // The payload a descriptor announces (what Describe packed, less the bit).
  static CarriedPayload Described(uint64_t descriptor) {
    return {static_cast<DataType>((descriptor >> 20) & 0xFF), static_cast<ReduceOp>((descriptor >> 28) & 0xFF),
            static_cast<int64_t>(descriptor >> 36)};
  }
};

}  // namespace collectives
