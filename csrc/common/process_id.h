// This process's id, kept current across fork() without a system call per use: a forked
// child inherits the engine object of its parent but none of its threads, and must not use it.
#pragma once
#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace collectives {

inline std::atomic<int>& CachedPid() {
  static std::atomic<int> pid{static_cast<int>(getpid())};
  return pid;
}

inline void RefreshPidAfterFork() { CachedPid().store(static_cast<int>(getpid())); }

// Call once before any fork can matter (module import): afterwards CurrentPid() is right in
// every child too.
inline void TrackForks() {
  static const bool registered = [] {
    CachedPid();
    return pthread_atfork(nullptr, nullptr, &RefreshPidAfterFork) == 0;
  }();
  (void)registered;
}

inline int CurrentPid() { return CachedPid().load(std::memory_order_relaxed); }

}  // namespace collectives
