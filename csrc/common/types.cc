#include "common/types.h"

#include <sstream>

namespace collectives {

int64_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::UINT8: case DataType::INT8: case DataType::BOOL: return 1;
    case DataType::INT16: case DataType::FLOAT16: case DataType::BFLOAT16: return 2;
    case DataType::INT32: case DataType::FLOAT32: return 4;
    case DataType::INT64: case DataType::FLOAT64: return 8;
  }
  return 0;
}

const char* DataTypeName(DataType t) {
  switch (t) {
    case DataType::UINT8: return "uint8";
    case DataType::INT8: return "int8";
    case DataType::INT16: return "int16";
    case DataType::INT32: return "int32";
    case DataType::INT64: return "int64";
    case DataType::FLOAT16: return "float16";
    case DataType::BFLOAT16: return "bfloat16";
    case DataType::FLOAT32: return "float32";
    case DataType::FLOAT64: return "float64";
    case DataType::BOOL: return "bool";
  }
  return "unknown";
}

const char* OpTypeName(OpType t) {
  switch (t) {
    case OpType::ALLREDUCE: return "ALLREDUCE";
    case OpType::BROADCAST: return "BROADCAST";
    case OpType::ALLGATHER: return "ALLGATHER";
    case OpType::ALLTOALL: return "ALLTOALL";
    case OpType::REDUCESCATTER: return "REDUCESCATTER";
    case OpType::BARRIER: return "BARRIER";
    case OpType::JOIN: return "JOIN";
    case OpType::PROCESS_SET_ADD: return "PROCESS_SET_ADD";
    case OpType::PROCESS_SET_REMOVE: return "PROCESS_SET_REMOVE";
  }
  return "UNKNOWN";
}

const char* ReduceOpName(ReduceOp r) {
  switch (r) {
    case ReduceOp::AVERAGE: return "Average";
    case ReduceOp::SUM: return "Sum";
    case ReduceOp::ADASUM: return "Adasum";
    case ReduceOp::MIN: return "Min";
    case ReduceOp::MAX: return "Max";
    case ReduceOp::PRODUCT: return "Product";
  }
  return "Unknown";
}

bool IsFloat(DataType t) {
  return t == DataType::FLOAT16 || t == DataType::BFLOAT16 || t == DataType::FLOAT32 ||
         t == DataType::FLOAT64;
}

bool IsValidDataType(int32_t t) { return t >= 0 && t < kNumDataTypes; }
bool IsValidOpType(int32_t t) { return t >= 0 && t <= static_cast<int32_t>(OpType::PROCESS_SET_REMOVE); }
bool IsDataOp(OpType t) { return static_cast<int32_t>(t) <= static_cast<int32_t>(OpType::BARRIER); }
bool IsValidReduceOp(int32_t r) { return r >= 0 && r <= static_cast<int32_t>(ReduceOp::PRODUCT); }

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

}  // namespace collectives
