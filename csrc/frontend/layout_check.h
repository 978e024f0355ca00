// A one-time check that every rank of a process set reduces the same list of tensors: the
// TensorFlow gradient reducers (the engine's op, tensorflow_kernels.cc, and the py_function hop,
// adapters/tensorflow/gradient_reducer.py through engine.check_layout) run it before the first
// reduction of each gradient layout.
//
// Why: the reducers name their requests `<prefix>.<digest of every gradient's dtype and shape>`
// (stable across steps, distinct between two tapes or optimizers). When a gradient's shape
// differs between ranks (the model differs, a user bug), the ranks' names differ and each would
// wait for the others forever. The check's name leaves the shapes out (the reducer's prefix and
// a digest of the count and dtypes of its tensors), so those ranks meet there and every one of
// them fails with TensorMismatchError naming the first gradient that differs and its shape on
// each rank, before any gradient is submitted: nothing is left pending.
//
// Cost: one allgather at the first use of a layout (24 bytes per rank: its rank, hash and length;
// a second one of the records only where they differ); afterwards a lookup in the engine's set of agreed
// layouts (core/agreed_layouts.h), no collective. The set belongs to the engine, so it is the same
// on every rank: a layout agreed everywhere is never checked again by any rank (a retrace, a new
// kernel or a new hop on one rank only does not check alone), and a new engine checks again.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace collectives {

class Engine;

// Blocks until the handle completes. May throw (the Python binding raises a signal handler's
// exception, e.g. KeyboardInterrupt); the handle is then left to the engine.
using LayoutWait = std::function<void(int64_t handle)>;

// `name`: the check's request name, the same on every rank whatever the shapes; `record`: this
// rank's layout, one "label\tvalue" line per tensor ("gradient 3\tfloat32[4, 5]"). OK when every
// rank of `process_set` has the same record (at once when this engine already found it so);
// MISMATCH with the message on every rank when they differ; else the failure of the allgathers.
Status CheckLayout(Engine* e, const std::string& name, const std::string& record, int32_t process_set,
                   const LayoutWait& wait);

// The message for records that differ (`ranks[i]` sent `records[i]`).
std::string LayoutMismatchMessage(const std::string& name, const std::vector<int64_t>& ranks,
                                  const std::vector<std::string>& records);

}  // namespace collectives
