// Element-wise work the engine does on host buffers: scaling (prescale, postscale,
// Average) and integer division for integer averages.
#pragma once
#include <cstdint>

#include "common/types.h"

namespace collectives {

// buf[i] = buf[i] * factor, computed in double (float for 16-bit floats) and converted
// back; integers truncate toward zero, as Horovod does.
void ScaleBuffer(void* buf, int64_t count, DataType dtype, double factor);

// buf[i] = buf[i] / divisor for integer types (truncating division).
void DivideIntegers(void* buf, int64_t count, DataType dtype, int64_t divisor);

// What follows a reduction among `set_size` ranks: Average's division by the set's size (joined
// ranks included: they contributed zeros), then the postscale.
void ScaleReduced(void* buf, int64_t count, DataType dtype, ReduceOp op, double postscale, int set_size);

// dst = src * factor without modifying src (count elements).
void ScaledCopy(void* dst, const void* src, int64_t count, DataType dtype, double factor);

}  // namespace collectives
