// What the negotiation message may carry (carried_payload.h).
#include "negotiation/carried_payload.h"

namespace collectives {

bool CarriedPayload::Eligible(DataType dtype, ReduceOp op, int64_t count) {
  switch (dtype) {
    case DataType::UINT8: case DataType::INT8: case DataType::INT16: case DataType::INT32:
    case DataType::INT64: case DataType::FLOAT32: case DataType::FLOAT64: case DataType::FLOAT16:
    case DataType::BFLOAT16:
      break;
    default:
      return false;  // bool: the ordinary path
  }
  if (op != ReduceOp::SUM && op != ReduceOp::AVERAGE && op != ReduceOp::MIN && op != ReduceOp::MAX &&
      op != ReduceOp::PRODUCT)
    return false;
  return count > 0 && count * DataTypeSize(dtype) <= kMaxBytes;  // Fits says for this cycle
}

}  // namespace collectives
