// The MPI negotiation message's payload capacity (fused_negotiation.h), which follows the sizes
// in use. A 4 KiB payload makes every cycle's message cost what a 4 KiB allreduce costs (9.6
// against 5.7 us for 8 B, raw MPI, np=2 on the 2-core VM), so a cycle offers one of three
// capacities, 64 B, 512 B or 4 KiB. Each rank announces in the flags word the class its candidate
// needs, whether or not it fits this cycle; the next cycle's capacity grows at once to the
// largest class announced, and shrinks after kShrinkAfterCycles cycles in which nobody needed
// it. Every rank computes this from the same reduced flags, so all use the same layout in every
// cycle. Engine thread.
#pragma once
#include <cstdint>

namespace collectives {

class PayloadClasses {
 public:
  static constexpr int kClasses = 3;
  // The capacities a cycle may offer, smallest first; the largest covers the latency cases
  // (8 B .. 4 KiB).
  static constexpr int64_t kClassBytes[kClasses] = {64, 512, 4096};
  static constexpr int kShrinkAfterCycles = 64;
  // Flags-word bits (inverted in the word, as the negotiation's own flags, negotiator.cc, which
  // uses the bits below these): "some rank's candidate needs class 1 / class 2".
  static constexpr uint64_t kFlagWantClass1 = 1ull << 8, kFlagWantClass2 = 1ull << 9;

  // This cycle's class (the same on every rank).
  int current() const { return class_; }
  // This rank's candidate has `bytes` of payload (whether or not it fits this cycle).
  void Announce(int64_t bytes);
  // Writes this cycle's announcement into the inverted flags word, and forgets it.
  void MarkFlags(uint64_t* inverted_flags);
  // After a cycle: the capacity of the next one, from the classes announced everywhere.
  void Resize(uint64_t global_flags);
  // How often the capacity changed.
  uint64_t resizes() const { return resizes_; }

 private:
  static int ClassOf(int64_t bytes);  // -1: larger than any

  int class_ = 0;
  int announced_ = -1;         // the class this rank's candidate needs in this cycle (-1: none)
  int quiet_ = 0;              // cycles since anybody needed class_
  int needed_meanwhile_ = -1;  // the largest class needed in those cycles
  uint64_t resizes_ = 0;
};

}  // namespace collectives
