// Element-wise arithmetic on float16 and bfloat16 buffers, computed in float: the reductions
// of the MPI user operations and the scaling of Average and scale factors. One build runs
// everywhere: the vector paths (F16C conversions for float16, AVX2 bit arithmetic for
// bfloat16) are chosen at run time when the CPU has them; otherwise the portable loops of
// half.h run. Both round to nearest even, so they give the same bits (NaN payloads aside).
#pragma once
#include <cstdint>

namespace collectives {

enum class HalfKind { FLOAT16, BFLOAT16 };
// The reductions MPI asks of a user operation (Average is a Sum, divided afterwards).
enum class HalfOp { SUM = 0, MIN = 1, MAX = 2, PRODUCT = 3 };

// inout[i] = op(in[i], inout[i]).
void ReduceHalf(HalfKind kind, HalfOp op, const uint16_t* in, uint16_t* inout, int64_t n);
// dst[i] = src[i] * f (dst may be src).
void ScaleHalf(HalfKind kind, uint16_t* dst, const uint16_t* src, int64_t n, float f);

// "f16c+avx2", "f16c", "avx2" or "portable": the vector paths in use for this process.
const char* HalfPathName();
// Tests: force the portable loops (true) or the CPU's best paths (false).
void SetHalfPortableForTesting(bool portable);

}  // namespace collectives
