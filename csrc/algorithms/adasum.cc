// The Adasum reduction over MPI (see adasum.h for the algorithm).
#include "algorithms/adasum.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "common/buffer_pool.h"
#include "host_math/half.h"

namespace collectives {
namespace {

// Point-to-point messages of the reduction; the engine's wake-up messages on the same
// communicator use another tag (engine.cc), so the two never match each other.
constexpr int kAdasumTag = 7479;
// Largest piece of one MPI_Sendrecv, so that byte counts fit in an int.
constexpr int64_t kMaxMessageBytes = 1LL << 30;

// Squared norms below this count as zero (the vector is then taken as it is): Horovod's bound,
// the square root of the smallest normal double, so that dot / norm cannot overflow.
const double kTinyNormSq = std::sqrt(DBL_MIN);

bool IsPowerOfTwo(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// Element access in double for the three element types.
template <typename T>
struct PlainElem {
  using Storage = T;
  static double Load(T v) { return static_cast<double>(v); }
  static T Store(double x) { return static_cast<T>(x); }
};
struct Float16Elem {
  using Storage = uint16_t;
  static double Load(uint16_t v) { return HalfToFloat(v); }
  static uint16_t Store(double x) { return FloatToHalf(static_cast<float>(x)); }
};

Status MpiFailure(int rc, const char* what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return Status::Error(StatusCode::INTERNAL,
                       std::string(what) + " failed during the Adasum reduction: " + std::string(msg, static_cast<size_t>(len)));
}

// Sends `send_bytes` to `peer` while receiving `recv_bytes` from it, in pieces. The peer makes
// the mirror call (its send is our receive), so both loop the same number of times.
Status Exchange(MPI_Comm comm, int peer, const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes) {
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  const int64_t longest = std::max(send_bytes, recv_bytes);
  for (int64_t off = 0; off < longest; off += kMaxMessageBytes) {
    const int64_t sn = std::max<int64_t>(0, std::min(kMaxMessageBytes, send_bytes - off));
    const int64_t rn = std::max<int64_t>(0, std::min(kMaxMessageBytes, recv_bytes - off));
    int rc = MPI_Sendrecv(sn ? s + off : s, static_cast<int>(sn), MPI_BYTE, peer, kAdasumTag, rn ? r + off : r,
                          static_cast<int>(rn), MPI_BYTE, peer, kAdasumTag, comm, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return MpiFailure(rc, "MPI_Sendrecv");
  }
  return Status::Ok();
}

// Sums `v` over the aligned block of `block` ranks containing `rank` (recursive doubling).
// Each step adds the partner's values to ours while the partner adds ours to its own; the
// two sums are the same numbers (addition commutes exactly), so every rank of the block ends
// with identical totals and the partners of the next level use identical coefficients.
Status SumWithinBlock(MPI_Comm comm, int rank, int block, std::vector<double>* v, std::vector<double>* tmp) {
  const int n = static_cast<int>(v->size());
  tmp->resize(v->size());
  for (int d = 1; d < block; d <<= 1) {
    int rc = MPI_Sendrecv(v->data(), n, MPI_DOUBLE, rank ^ d, kAdasumTag, tmp->data(), n, MPI_DOUBLE, rank ^ d,
                          kAdasumTag, comm, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return MpiFailure(rc, "MPI_Sendrecv of the dot products");
    for (int i = 0; i < n; ++i) (*v)[i] += (*tmp)[i];
  }
  return Status::Ok();
}

struct Slice {
  int64_t lo = 0;   // first element, in the whole buffer
  int64_t len = 0;  // elements
};

template <typename E>
Status Reduce(MPI_Comm comm, int rank, int size, typename E::Storage* data, const std::vector<int64_t>& segments) {
  using S = typename E::Storage;
  const size_t k = segments.size();
  std::vector<int64_t> starts(k, 0);
  for (size_t i = 1; i < k; ++i) starts[i] = starts[i - 1] + segments[i - 1];
  const int64_t total = k ? starts[k - 1] + segments[k - 1] : 0;
  if (total == 0 || size == 1) return Status::Ok();

  // The halves received: at most the half kept at level 1 (pooled, so repeated steps reuse it).
  HostBuffer scratch((total + 1) / 2 * static_cast<int64_t>(sizeof(S)));
  S* received = static_cast<S*>(scratch.data());
  std::vector<Slice> held;  // the slice held before each level, for the way back
  std::vector<double> sums(3 * k), tmp;
  Slice mine{0, total};

  for (int level = 1; level < size; level <<= 1) {
    const int peer = rank ^ level;
    // The lower rank of a pair keeps the first half and is the pair's "left" vector.
    const bool left = (rank & level) == 0;
    const int64_t first = mine.len / 2;
    const Slice keep = left ? Slice{mine.lo, first} : Slice{mine.lo + first, mine.len - first};
    const Slice give = left ? Slice{mine.lo + first, mine.len - first} : Slice{mine.lo, first};
    Status st = Exchange(comm, peer, data + give.lo, give.len * static_cast<int64_t>(sizeof(S)), received,
                         keep.len * static_cast<int64_t>(sizeof(S)));
    if (!st.ok()) return st;
    held.push_back(mine);
    mine = keep;

    // Per tensor, over its part inside `keep`: (a.b, |left|^2, |right|^2).
    for (size_t i = 0; i < k; ++i) {
      const int64_t a = std::max(keep.lo, starts[i]), b = std::min(keep.lo + keep.len, starts[i] + segments[i]);
      double dot = 0, own = 0, other = 0;
      for (int64_t j = a; j < b; ++j) {
        const double x = E::Load(data[j]), y = E::Load(received[static_cast<size_t>(j - keep.lo)]);
        dot += x * y;
        own += x * x;
        other += y * y;
      }
      sums[3 * i] = dot;
      sums[3 * i + 1] = left ? own : other;
      sums[3 * i + 2] = left ? other : own;
    }
    st = SumWithinBlock(comm, rank, 2 * level, &sums, &tmp);
    if (!st.ok()) return st;

    for (size_t i = 0; i < k; ++i) {
      const int64_t a = std::max(keep.lo, starts[i]), b = std::min(keep.lo + keep.len, starts[i] + segments[i]);
      if (a >= b) continue;
      const double dot = sums[3 * i], left_sq = sums[3 * i + 1], right_sq = sums[3 * i + 2];
      const double left_coef = left_sq >= kTinyNormSq ? 1.0 - dot / (2.0 * left_sq) : 1.0;
      const double right_coef = right_sq >= kTinyNormSq ? 1.0 - dot / (2.0 * right_sq) : 1.0;
      const double own_coef = left ? left_coef : right_coef, other_coef = left ? right_coef : left_coef;
      for (int64_t j = a; j < b; ++j)
        data[j] = E::Store(own_coef * E::Load(data[j]) + other_coef * E::Load(received[static_cast<size_t>(j - keep.lo)]));
    }
  }

  // The way back: at each level the partner holds the rest of the slice both held before it.
  for (int level = size >> 1; level >= 1; level >>= 1) {
    const Slice whole = held.back();
    held.pop_back();
    const bool left = (rank & level) == 0;
    const int64_t first = whole.len / 2;
    const Slice theirs = left ? Slice{whole.lo + first, whole.len - first} : Slice{whole.lo, first};
    Status st = Exchange(comm, rank ^ level, data + mine.lo, mine.len * static_cast<int64_t>(sizeof(S)),
                         data + theirs.lo, theirs.len * static_cast<int64_t>(sizeof(S)));
    if (!st.ok()) return st;
    mine = whole;
  }
  return Status::Ok();
}

}  // namespace

Status ValidateAdasum(const Request& q, int set_size) {
  const std::string where = " (tensor '" + q.name + "')";
  if (q.op != OpType::ALLREDUCE)
    return Status::Error(StatusCode::INVALID_ARGUMENT,
                         std::string(OpTypeName(q.op)) + " does not support the Adasum reduction" + where);
  if (q.device != -1)
    return Status::Error(StatusCode::NOT_IMPLEMENTED,
                         "Adasum is not supported for tensors in GPU memory; reduce a host (CPU) copy" + where);
  if (q.process_set != 0)
    return Status::Error(StatusCode::NOT_IMPLEMENTED, "Adasum does not support non-global process sets yet" + where);
  if (!IsPowerOfTwo(set_size))
    return Status::Error(StatusCode::NOT_IMPLEMENTED, "Running Adasum with non-power of 2 ranks is not supported yet (" +
                                                          std::to_string(set_size) + " ranks)" + where);
  if (q.dtype != DataType::FLOAT16 && q.dtype != DataType::FLOAT32 && q.dtype != DataType::FLOAT64)
    return Status::Error(StatusCode::UNSUPPORTED_TYPE, std::string("Adasum reduces float16, float32 and float64 tensors, not ") +
                                                           DataTypeName(q.dtype) + where);
  return Status::Ok();
}

Status AdasumAllreduce(MPI_Comm comm, void* buf, const std::vector<int64_t>& segments, DataType dtype) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (!IsPowerOfTwo(size))  // refused at enqueue (ValidateAdasum); never reached
    return Status::Error(StatusCode::INTERNAL, "Adasum needs a power-of-two number of ranks");
  switch (dtype) {
    case DataType::FLOAT16: return Reduce<Float16Elem>(comm, rank, size, static_cast<uint16_t*>(buf), segments);
    case DataType::FLOAT32: return Reduce<PlainElem<float>>(comm, rank, size, static_cast<float*>(buf), segments);
    case DataType::FLOAT64: return Reduce<PlainElem<double>>(comm, rank, size, static_cast<double*>(buf), segments);
    default: return Status::Error(StatusCode::INTERNAL, std::string("Adasum cannot reduce ") + DataTypeName(dtype));
  }
}

Status Adasum::Run(const HostAllreduce& c) {
  const AllreduceFacts& f = c.facts;
  if (c.input != c.output) std::memcpy(c.output, c.input, static_cast<size_t>(f.bytes()));
  Status st = AdasumAllreduce(c.comm, c.output, c.segments ? *c.segments : std::vector<int64_t>{f.count}, f.dtype);
  if (st.ok()) c.scale(c.output, f.count);
  return st;
}

}  // namespace collectives
