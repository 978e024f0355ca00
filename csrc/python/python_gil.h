// Releasing the GIL around blocking engine calls in a way that is safe at interpreter exit.
//
// CPython ends a thread that asks for the GIL back once finalization has begun (3.11-3.13:
// pthread_exit inside PyEval_RestoreThread). pybind11's gil_scoped_release asks in its
// destructor; the forced unwind of pthread_exit then leaves a noexcept function and
// std::terminate aborts the process ("terminate called without an active exception"). That
// happened to daemon threads blocked in synchronize() while the main thread exited.
//
// So a thread here asks for the GIL back only through Reacquire(), which never does so once
// Python's atexit callbacks (they run before finalization starts) have called MarkExiting():
// such a thread parks instead, without the GIL, until the process ends -- a daemon thread's fate
// at exit anyway. Threads already on their way back when MarkExiting() starts are let in
// before it returns. The thread that runs atexit (and then finalization) is exempt.
#pragma once
#include <Python.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace collectives {
namespace gil {

struct ExitGate {
  std::atomic<bool> exiting{false};
  std::atomic<int> returning{0};  // threads between the check and holding the GIL
  std::atomic<pthread_t> exiting_thread{};
};

// Never destroyed: threads may consult it while the process runs its exit handlers.
inline ExitGate& Gate() {
  static ExitGate* gate = new ExitGate;
  return *gate;
}

[[noreturn]] inline void Park() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
}

// A forked child has one thread, the one that called fork(). Threads the parent counted in
// `returning` (waiting for the GIL after a wait, as the forking thread held it) do not exist
// there, and MarkExiting() at the child's normal exit waited for them forever. Call once at
// module import, before any fork matters.
inline void ForgetOtherThreadsInForkedChildren() {
  static const bool registered = [] {
    Gate();  // created here, so that the handler never runs its initialization
    return pthread_atfork(nullptr, nullptr, [] { Gate().returning.store(0); }) == 0;
  }();
  (void)registered;
}

// Takes the GIL back after PyEval_SaveThread(), or parks forever when the interpreter exits.
// Not called from a destructor: should CPython end the thread here anyway, the unwind passes.
inline void Reacquire(PyThreadState* saved) {
  ExitGate& g = Gate();
  // Announce first, then look (both sequentially consistent): either MarkExiting() sees this
  // thread on its way and waits for it, or this thread sees the flag and stays out.
  g.returning.fetch_add(1);
  if (g.exiting.load() && !pthread_equal(g.exiting_thread.load(), pthread_self())) {
    g.returning.fetch_sub(1);
    Park();
  }
  PyEval_RestoreThread(saved);
  g.returning.fetch_sub(1);
}

// Runs fn() without the GIL; returns holding it again (or never, at interpreter exit). fn must
// not throw: engine calls report errors as Status values.
template <typename Fn>
void WithoutGil(Fn&& fn) {
  PyThreadState* saved = PyEval_SaveThread();
  fn();
  Reacquire(saved);
}

// Called with the GIL by an atexit callback. Returns once no other thread can take the GIL
// through Reacquire() any more.
inline void MarkExiting() {
  ExitGate& g = Gate();
  g.exiting_thread.store(pthread_self());
  g.exiting.store(true);
  if (g.returning.load() == 0) return;
  PyThreadState* saved = PyEval_SaveThread();  // let the threads on their way in take the GIL
  while (g.returning.load() != 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  PyEval_RestoreThread(saved);
}

}  // namespace gil
}  // namespace collectives
