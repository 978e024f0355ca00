// Short spins before sleeping on a condition variable.
#pragma once
#include <chrono>
#include <thread>

namespace collectives {

// How long a thread spins (yielding) for an event expected within microseconds before it
// sleeps: the caller waiting for its result, the engine waiting for the next submission.
constexpr auto kSpin = std::chrono::microseconds(50);

// Spins until pred() or the spin time is over; true if pred() held.
template <typename Pred>
bool SpinFor(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  do {
    if (pred()) return true;
    std::this_thread::yield();
  } while (std::chrono::steady_clock::now() < until);
  return pred();
}

}  // namespace collectives
