// Short waits before sleeping on a condition variable: the caller waiting for its result, the
// engine waiting for the next submission. Their pauses follow wait_policy.h.
#pragma once
#include <chrono>

#include "wait/wait_policy.h"

namespace collectives {

// An event expected within microseconds: yield for up to 50 us, then give up (the caller blocks
// on its condition variable). On an oversubscribed machine the yield loop would take a contended
// core (wait_policy.h), so it gives up at once.
inline const WaitPhases& HandOffPhases() {
  static const WaitPhases phases = [] {
    WaitPhases p;
    p.yield = std::chrono::microseconds(50);
    p.yield_oversubscribed = std::chrono::microseconds(0);
    p.sleep = false;
    return p;
  }();
  return phases;
}

// Waits until pred() or the hand-off phases are over; true if pred() held.
template <typename Pred>
bool SpinFor(Pred pred) {
  Waiter waiter(HandOffPhases());
  do {
    if (pred()) return true;
  } while (waiter.Pause());
  return pred();
}

}  // namespace collectives
