// Checks of one submission that need no other rank: made at enqueue, on the caller's thread.
#include "core/validation.h"

#include <algorithm>

#include "algorithms/adasum.h"

namespace collectives {
namespace {

Status ValidateControl(const Request& q, int job_size, const std::string& where) {
  if (q.process_set != 0)
    return Status::Error(StatusCode::INVALID_ARGUMENT, std::string(OpTypeName(q.op)) + " involves every rank" + where);
  if (q.op == OpType::PROCESS_SET_ADD) {
    if (q.splits.empty()) return Status::Error(StatusCode::INVALID_ARGUMENT, "a process set needs at least one rank");
    for (size_t i = 0; i < q.splits.size(); ++i) {
      if (q.splits[i] < 0 || q.splits[i] >= job_size)
        return Status::Error(StatusCode::INVALID_ARGUMENT, "process set rank " + std::to_string(q.splits[i]) +
                                                               " is out of range for " + std::to_string(job_size) + " ranks");
      if (i && q.splits[i] <= q.splits[i - 1])
        return Status::Error(StatusCode::INVALID_ARGUMENT, "process set ranks must be distinct and ascending: " +
                                                               ShapeString(q.splits));
    }
  }
  if (q.op == OpType::PROCESS_SET_REMOVE && q.root <= 0)
    return Status::Error(StatusCode::INVALID_ARGUMENT, "the global process set (id 0) cannot be removed");
  return Status::Ok();
}

}  // namespace

Status ValidateSubmission(Request* request, bool has_buffers, const std::vector<int>& members, int job_size) {
  Request& q = *request;
  const std::string where = " (tensor '" + q.name + "')";
  const int size = static_cast<int>(members.size());
  if (q.name.empty()) return Status::Error(StatusCode::INVALID_ARGUMENT, "a request needs a non-empty name");
  if (!IsValidOpType(static_cast<int32_t>(q.op)))
    return Status::Error(StatusCode::INVALID_ARGUMENT, "unknown operation" + where);
  if (!IsDataOp(q.op)) return ValidateControl(q, job_size, where);
  if (!IsValidDataType(static_cast<int32_t>(q.dtype)))
    return Status::Error(StatusCode::UNSUPPORTED_TYPE, "unsupported data type" + where);
  for (int64_t d : q.shape)
    if (d < 0) return Status::Error(StatusCode::INVALID_ARGUMENT, "negative dimension in shape " + ShapeString(q.shape) + where);
  if (q.op == OpType::ALLREDUCE || q.op == OpType::REDUCESCATTER) {
    if (!IsValidReduceOp(static_cast<int32_t>(q.reduce_op)))
      return Status::Error(StatusCode::INVALID_ARGUMENT, "unknown reduce op" + where);
    if (q.reduce_op == ReduceOp::ADASUM) {
      Status st = ValidateAdasum(q, size);
      if (!st.ok()) return st;
    }
    if (q.dtype == DataType::BOOL && q.reduce_op != ReduceOp::MIN && q.reduce_op != ReduceOp::MAX)
      return Status::Error(StatusCode::UNSUPPORTED_TYPE,
                           std::string("bool tensors support only Min and Max reductions, not ") +
                               ReduceOpName(q.reduce_op) + where);
    if (q.dtype == DataType::BOOL && (q.prescale != 1.0 || q.postscale != 1.0))
      return Status::Error(StatusCode::UNSUPPORTED_TYPE, "bool tensors cannot be scaled" + where);
  }
  if (q.op == OpType::BROADCAST && (q.root < 0 || q.root >= job_size))
    return Status::Error(StatusCode::INVALID_ARGUMENT,
                         "root rank " + std::to_string(q.root) + " is out of range for " + std::to_string(job_size) +
                             " ranks" + where);
  if (q.op == OpType::BROADCAST && std::find(members.begin(), members.end(), q.root) == members.end())
    return Status::Error(StatusCode::INVALID_ARGUMENT, "root rank " + std::to_string(q.root) +
                                                           " is not a member of process set " +
                                                           std::to_string(q.process_set) + where);
  if ((q.op == OpType::ALLGATHER || q.op == OpType::ALLTOALL || q.op == OpType::REDUCESCATTER) && q.shape.empty())
    return Status::Error(StatusCode::INVALID_ARGUMENT,
                         std::string(OpTypeName(q.op)) + " needs a tensor with at least one dimension" + where);
  if (q.op == OpType::ALLTOALL) {
    const int64_t dim0 = q.shape[0];
    if (q.splits.empty()) {
      if (dim0 % size != 0)
        return Status::Error(StatusCode::INVALID_ARGUMENT,
                             "alltoall without splits needs a first dimension divisible by the number of ranks (" +
                                 std::to_string(dim0) + " rows, " + std::to_string(size) + " ranks)" + where);
      q.splits.assign(static_cast<size_t>(size), dim0 / size);
    }
    if (static_cast<int>(q.splits.size()) != size)
      return Status::Error(StatusCode::INVALID_ARGUMENT,
                           "alltoall needs one split per rank: got " + std::to_string(q.splits.size()) + " for " +
                               std::to_string(size) + " ranks" + where);
    int64_t total = 0;
    for (int64_t x : q.splits) {
      if (x < 0) return Status::Error(StatusCode::INVALID_ARGUMENT, "alltoall splits must not be negative" + where);
      // Splits near 2^63 must not wrap around to a sum that happens to match.
      if (__builtin_add_overflow(total, x, &total))
        return Status::Error(StatusCode::INVALID_ARGUMENT, "alltoall splits sum to more than 2^63 - 1" + where);
    }
    // Fewer rows than the tensor has are allowed, as in Horovod: the rows after the splits' sum
    // are not sent (and get a zero gradient).
    if (total > dim0)
      return Status::Error(StatusCode::INVALID_ARGUMENT,
                           "alltoall splits sum to " + std::to_string(total) + ", more than the first dimension " +
                               std::to_string(dim0) + where);
  }
  const bool engine_allocates = q.op == OpType::ALLGATHER || q.op == OpType::ALLTOALL || q.op == OpType::BARRIER;
  if (!engine_allocates && NumElements(q.shape) > 0 && !has_buffers)
    return Status::Error(StatusCode::INVALID_ARGUMENT, "missing input or output buffer" + where);
  return Status::Ok();
}


}  // namespace collectives
