// The MPI negotiation message's payload capacity (payload_classes.h).
#include "negotiation/payload_classes.h"

#include <algorithm>

namespace collectives {

int PayloadClasses::ClassOf(int64_t bytes) {
  for (int c = 0; c < kClasses; ++c)
    if (bytes <= kClassBytes[c]) return c;
  return -1;
}

void PayloadClasses::Announce(int64_t bytes) { announced_ = std::max(announced_, ClassOf(bytes)); }

void PayloadClasses::MarkFlags(uint64_t* inverted_flags) {
  if (announced_ >= 1) *inverted_flags &= ~kFlagWantClass1;  // inverted: AND acts as OR
  if (announced_ >= 2) *inverted_flags &= ~kFlagWantClass2;
  announced_ = -1;
}

void PayloadClasses::Resize(uint64_t global_flags) {
  const int before = class_;
  const int needed = (global_flags & kFlagWantClass2) ? 2 : (global_flags & kFlagWantClass1) ? 1 : 0;
  // Class 0 is never announced as such: a cycle where nobody carries anything needs no more.
  needed_meanwhile_ = std::max(needed_meanwhile_, needed);
  if (needed >= class_) {
    class_ = needed;
    quiet_ = 0;
    needed_meanwhile_ = -1;
  } else if (++quiet_ >= kShrinkAfterCycles) {
    class_ = std::max(needed_meanwhile_, 0);
    quiet_ = 0;
    needed_meanwhile_ = -1;
  }
  if (class_ != before) ++resizes_;
}

}  // namespace collectives
