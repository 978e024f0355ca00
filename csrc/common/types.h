// Enumerations shared by every part of the engine, and their names for messages.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace collectives {

// Values match Horovod's Python constants where Horovod has them.
enum class DataType : int32_t {
  UINT8 = 0, INT8 = 1, INT16 = 2, INT32 = 3, INT64 = 4,
  FLOAT16 = 5, BFLOAT16 = 6, FLOAT32 = 7, FLOAT64 = 8, BOOL = 9,
};
constexpr int kNumDataTypes = 10;

enum class OpType : int32_t {
  ALLREDUCE = 0, BROADCAST = 1, ALLGATHER = 2, ALLTOALL = 3, REDUCESCATTER = 4, BARRIER = 5,
  // Control operations, negotiated like the others so every rank sees them in the same order.
  JOIN = 6,                // this rank has no more data; complete when every rank joined
  PROCESS_SET_ADD = 7,     // splits: the member ranks
  PROCESS_SET_REMOVE = 8,  // root: the process set id
};

// Operations that move tensor data (and may be cached and fused), as opposed to control ones.
bool IsDataOp(OpType t);

// Horovod's numbering: Average=0, Sum=1, Adasum=2, Min=3, Max=4, Product=5.
enum class ReduceOp : int32_t {
  AVERAGE = 0, SUM = 1, ADASUM = 2, MIN = 3, MAX = 4, PRODUCT = 5,
};

int64_t DataTypeSize(DataType t);
const char* DataTypeName(DataType t);
const char* OpTypeName(OpType t);     // "ALLREDUCE", ...
const char* ReduceOpName(ReduceOp r);  // "Average", ...
bool IsFloat(DataType t);
bool IsValidDataType(int32_t t);
bool IsValidOpType(int32_t t);
bool IsValidReduceOp(int32_t r);

int64_t NumElements(const std::vector<int64_t>& shape);
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace collectives
