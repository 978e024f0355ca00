#include "common/log.h"

#include <atomic>
#include <cstdio>

namespace collectives {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::WARNING)};
std::atomic<int> g_rank{-1};
const char* Name(LogLevel l) {
  static const char* names[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};
  return names[static_cast<int>(l)];
}
}  // namespace

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }
void SetLogRank(int rank) { g_rank = rank; }
bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void Log(LogLevel level, const std::string& message) {
  if (!LogEnabled(level)) return;
  // One fprintf per line so lines from the engine and Python threads do not interleave.
  std::fprintf(stderr, "[collectives %s rank %d] %s\n", Name(level), g_rank.load(), message.c_str());
  std::fflush(stderr);
}

}  // namespace collectives
