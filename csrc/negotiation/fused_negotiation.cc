#include "negotiation/fused_negotiation.h"

#include <cstring>

#include "host_math/half_math.h"
#include "backends/mpi/mpi_wait.h"

namespace collectives {
namespace {


// out[i] = acc[i] op in[i], where acc holds the lower ranks' combination (so every rank combines
// in rank order, alike); acc may be out. Integers combine in their unsigned type (wrapping, never
// undefined), floats as themselves.
template <typename T, typename U>
void CombineTyped(const void* acc_v, const void* in_v, void* out_v, int64_t n, ReduceOp op) {
  const T* acc = static_cast<const T*>(acc_v);
  const T* a = static_cast<const T*>(in_v);
  T* out = static_cast<T*>(out_v);
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVERAGE:  // divided afterwards (Executor::PostReduce), as on the ordinary path
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<U>(acc[i]) + static_cast<U>(a[i]));
      break;
    case ReduceOp::PRODUCT:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<U>(acc[i]) * static_cast<U>(a[i]));
      break;
    case ReduceOp::MIN:
      for (int64_t i = 0; i < n; ++i) out[i] = acc[i] < a[i] ? acc[i] : a[i];  // MPICH's MPI_MIN order
      break;
    case ReduceOp::MAX:
      for (int64_t i = 0; i < n; ++i) out[i] = acc[i] > a[i] ? acc[i] : a[i];
      break;
    default:
      break;
  }
}

// 16-bit floats through the reductions their MPI operators use (half_math.h), so a carried
// payload combines to the bits the ordinary path gives: out = op(in, acc), widened to float and
// rounded back per step.
void CombineHalf(const void* acc, const void* in, void* out, HalfKind kind, ReduceOp op, int64_t n) {
  const HalfOp half_op = op == ReduceOp::MIN   ? HalfOp::MIN
                         : op == ReduceOp::MAX ? HalfOp::MAX
                         : op == ReduceOp::PRODUCT ? HalfOp::PRODUCT
                                                   : HalfOp::SUM;  // Sum, and Average (divided afterwards)
  if (out != acc) std::memcpy(out, acc, static_cast<size_t>(n) * 2);
  ReduceHalf(kind, half_op, static_cast<const uint16_t*>(in), static_cast<uint16_t*>(out), n);
}

void CombinePayload(const void* acc, const void* in, void* out, DataType dtype, ReduceOp op, int64_t n) {
  switch (dtype) {
    case DataType::FLOAT16: CombineHalf(acc, in, out, HalfKind::FLOAT16, op, n); break;
    case DataType::BFLOAT16: CombineHalf(acc, in, out, HalfKind::BFLOAT16, op, n); break;
    case DataType::UINT8: CombineTyped<uint8_t, uint32_t>(acc, in, out, n, op); break;
    case DataType::INT8: CombineTyped<int8_t, uint32_t>(acc, in, out, n, op); break;
    case DataType::INT16: CombineTyped<int16_t, uint32_t>(acc, in, out, n, op); break;
    case DataType::INT32: CombineTyped<int32_t, uint32_t>(acc, in, out, n, op); break;
    case DataType::INT64: CombineTyped<int64_t, uint64_t>(acc, in, out, n, op); break;
    case DataType::FLOAT32: CombineTyped<float, float>(acc, in, out, n, op); break;
    case DataType::FLOAT64: CombineTyped<double, double>(acc, in, out, n, op); break;
    default: break;  // not Eligible
  }
}

}  // namespace

void FusedNegotiation::Combine(void* in_v, void* inout_v, int* len, MPI_Datatype*) {
  const uint64_t* in = static_cast<const uint64_t*>(in_v);
  uint64_t* inout = static_cast<uint64_t*>(inout_v);
  for (int e = 0; e < *len; ++e) {
    // The layout word is identical on every rank: bit-vector length in its low half, payload
    // words in its high half.
    const int64_t bit_words = static_cast<int64_t>(inout[0] & 0xFFFFFFFFu);
    const int64_t payload_words = static_cast<int64_t>(inout[0] >> 32);
    const int64_t total = kHeaderWords + bit_words + payload_words;
    for (int64_t w = kHeaderWords; w < kHeaderWords + bit_words; ++w) inout[w] &= in[w];
    if (inout[1] != in[1]) {
      inout[1] = 0;  // not every rank carries the same entry: nothing here is used
    } else if (inout[1] != 0) {
      const CarriedPayload p = CarriedPayload::Described(inout[1]);
      uint64_t* acc = inout + kHeaderWords + bit_words;
      CombinePayload(acc, in + kHeaderWords + bit_words, acc, p.dtype, p.op, p.count);
    }
    in += total;
    inout += total;
  }
}

Status FusedNegotiation::Init(int bit_words, MPI_Comm comm, int local_size, bool shared) {
  bit_words_ = bit_words;
  MPI_Comm_size(comm, &size_);
  Status st = shared_.Init(comm, local_size, shared, (kHeaderWords + bit_words + CarriedPayload::kMaxBytes / 8) * 8);
  if (!st.ok()) return st;
  transport_ = shared_.active() ? "shared memory" : "MPI";
  buf_.assign(static_cast<size_t>(kHeaderWords + bit_words + kPayloadBytes / 8), 0);
  for (int c = 0; c < PayloadClasses::kClasses; ++c) {
    const int words = kHeaderWords + bit_words + static_cast<int>(PayloadClasses::kClassBytes[c] / 8);
    if (MPI_Type_contiguous(words, MPI_UINT64_T, &types_[c]) != MPI_SUCCESS || MPI_Type_commit(&types_[c]) != MPI_SUCCESS)
      return Status::Error(StatusCode::INTERNAL, "MPI_Type_contiguous for the negotiation message failed");
  }
  if (MPI_Op_create(&FusedNegotiation::Combine, 1, &op_) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "MPI_Op_create for the negotiation message failed");
  return Status::Ok();
}

void FusedNegotiation::Free() {
  shared_.Release();
  if (op_ != MPI_OP_NULL) MPI_Op_free(&op_);
  for (MPI_Datatype& t : types_)
    if (t != MPI_DATATYPE_NULL) MPI_Type_free(&t);
}

void FusedNegotiation::CombineShared() {
  uint64_t* b = buf_.data();
  const uint64_t* first = shared_.Record(0);
  uint64_t descriptor = first[1];
  std::memcpy(b + kHeaderWords, first + kHeaderWords, static_cast<size_t>(bit_words_) * 8);
  for (int r = 1; r < size_; ++r) {
    const uint64_t* rec = shared_.Record(r);
    if (rec[1] != descriptor) descriptor = 0;
    for (int w = kHeaderWords; w < kHeaderWords + bit_words_; ++w) b[w] &= rec[w];
  }
  b[1] = descriptor;
}

void FusedNegotiation::ReduceInto(void* out) const {
  const CarriedPayload p = CarriedPayload::Described(buf_[1]);
  const size_t bytes = static_cast<size_t>(p.count * DataTypeSize(p.dtype));
  if (!shared_.active()) {  // MPI reduced it into buf_
    std::memcpy(out, buf_.data() + kHeaderWords + bit_words_, bytes);
    return;
  }
  // Straight from the records, which stay valid until this rank's next exchange: one pass over
  // the output for two ranks, where copying the result through buf_ took four.
  const auto payload = [&](int r) { return shared_.Record(r) + kHeaderWords + bit_words_; };
  if (size_ == 1) {
    std::memcpy(out, payload(0), bytes);
    return;
  }
  CombinePayload(payload(0), payload(1), out, p.dtype, p.op, p.count);
  for (int r = 2; r < size_; ++r) CombinePayload(out, payload(r), out, p.dtype, p.op, p.count);
}

int FusedNegotiation::Run(MPI_Comm comm, uint64_t* bits, uint64_t descriptor, const void* payload,
                          int64_t payload_bytes, uint64_t* agreed) {
  // Through shared memory the message is written straight into this rank's record.
  uint64_t* b = shared_.active() ? static_cast<uint64_t*>(shared_.Outgoing()) : buf_.data();
  const int cls = classes_.current();
  b[0] = static_cast<uint64_t>(bit_words_) | static_cast<uint64_t>(PayloadClasses::kClassBytes[cls] / 8) << 32;
  b[1] = descriptor;
  std::memcpy(b + kHeaderWords, bits, static_cast<size_t>(bit_words_) * 8);
  classes_.MarkFlags(&b[kHeaderWords]);
  if (descriptor != 0) std::memcpy(b + kHeaderWords + bit_words_, payload, static_cast<size_t>(payload_bytes));
  int rc = MPI_SUCCESS;
  failure_.clear();
  if (shared_.active()) {
    Status st = shared_.Exchange();
    if (st.ok()) {
      CombineShared();
    } else {
      failure_ = st.message;
      rc = MPI_ERR_OTHER;
    }
    b = buf_.data();
  } else {
    rc = AllreduceWaiting(MPI_IN_PLACE, b, 1, types_[cls], op_, comm);  // mpi_wait.h: no busy wait
  }
  std::memcpy(bits, b + kHeaderWords, static_cast<size_t>(bit_words_) * 8);
  *agreed = b[1];
  if (rc == MPI_SUCCESS && !shared_.active()) classes_.Resize(~bits[0]);
  return rc;
}

}  // namespace collectives
