// Element-wise reduction of one host buffer into another (inout[i] = in[i] op inout[i]), the
// step every host allreduce algorithm of ours repeats per chunk: the cross-memory allreduce
// (cross_memory_allreduce.h), the shared-memory one (shm_allreduce.h) and the hierarchical one.
//
// Why not MPI_Reduce_local alone: MPICH's built-in operators run a scalar loop. On the 2-core
// VM, 128 KiB of float32 Sum took 20.3 us through MPI_Reduce_local against 5.4 us for numpy's
// add, and every rank of a 2-rank cross-memory allreduce reduces half the message this way.
// Here the loops are compiled twice, for AVX2 and for the baseline, and chosen at run time.
//
// Covered: Sum (and Average, scaled afterwards) and Product of float32, float64 and every
// integer type, and Min/Max of the integer types -- the results are those of MPICH's operators
// bit for bit (IEEE addition and multiplication are commutative; integers wrap as two's
// complement). Anything else (float Min/Max, whose NaN handling is MPI's to define, 16-bit
// floats, which have their own operators: half_math.h, bool) is left to MPI_Reduce_local.
#pragma once
#include <cstdint>

#include "common/types.h"

namespace collectives {

// Reduces `in` into `inout` (count elements) and returns true, or returns false without
// touching anything when the dtype/op pair is not covered.
bool ReduceLocalFast(const void* in, void* inout, int64_t count, DataType dtype, ReduceOp op);

// For tests: the loop used ("avx2" or "portable"), and forcing the portable one.
const char* LocalReducePathName();
void SetLocalReducePortableForTesting(bool portable);

}  // namespace collectives
