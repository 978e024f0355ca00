#include "abandoned_exit.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace collectives {
namespace {

// Registered after every library's handlers, so it runs first among them; its status is the
// one exit() was given, which the program's end (sys.exit, an uncaught error) chose.
[[maybe_unused]] void ExitNow(int status, void*) {
  std::fflush(nullptr);
  _exit(status);
}

}  // namespace

void EndProcessWithoutTeardownAtExit() {
  static std::once_flag registered;
  std::call_once(registered, [] {
#ifdef __GLIBC__
    // glibc's on_exit hands the handler exit()'s status; atexit could not keep it. Elsewhere
    // the process exits as before.
    on_exit(&ExitNow, nullptr);
#endif
  });
}

}  // namespace collectives
