// Errors inside the engine are values: a code and a message. They never cross the
// engine thread as C++ exceptions; the Python boundary maps codes to exception types.
#pragma once
#include <string>
#include <utility>

namespace collectives {

enum class StatusCode : int {
  OK = 0,
  INVALID_ARGUMENT = 1,   // bad input detected locally (shape, splits, root, ...)
  UNSUPPORTED_TYPE = 2,   // dtype not allowed for this operation
  DUPLICATE_NAME = 3,     // a request with this name is already in flight
  NOT_INITIALIZED = 4,    // engine not running
  MISMATCH = 5,           // ranks disagree about a tensor (shape, dtype, op, root, ...)
  SHUT_DOWN = 6,          // engine stopped while the request was pending
  TIMEOUT = 7,            // stall shutdown
  INTERNAL = 8,           // MPI or other backend failure
  NOT_IMPLEMENTED = 9,    // valid, but not supported here (Adasum on a non-power-of-two number of ranks)
};

struct Status {
  StatusCode code = StatusCode::OK;
  std::string message;

  static Status Ok() { return Status(); }
  static Status Error(StatusCode c, std::string m) {
    Status s;
    s.code = c;
    s.message = std::move(m);
    return s;
  }
  bool ok() const { return code == StatusCode::OK; }
};

}  // namespace collectives
