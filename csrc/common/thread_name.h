// Names the calling thread as `top -H`, `ps -L`, debuggers and /proc/<pid>/task/*/comm show it,
// so that the engine's threads can be told from the framework's and Python's (which all show
// as "python" otherwise). Linux keeps 15 characters; elsewhere this does nothing.
#pragma once
#if defined(__linux__)
#include <sys/prctl.h>
#endif

namespace collectives {

inline void NameThisThread(const char* name) {
#if defined(__linux__)
  prctl(PR_SET_NAME, name, 0, 0, 0);
#else
  (void)name;
#endif
}

}  // namespace collectives
