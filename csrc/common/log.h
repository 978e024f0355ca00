// Engine log lines on stderr, filtered by COLLECTIVES_LOG_LEVEL.
#pragma once
#include <string>

namespace collectives {

enum class LogLevel : int { TRACE = 0, DEBUG = 1, INFO = 2, WARNING = 3, ERROR = 4, FATAL = 5 };

void SetLogLevel(LogLevel level);
void SetLogRank(int rank);
bool LogEnabled(LogLevel level);
void Log(LogLevel level, const std::string& message);

}  // namespace collectives
