#include "host_math/local_reduce.h"

#include <atomic>
#include <type_traits>

namespace collectives {
namespace {

std::atomic<bool> force_portable{false};

enum class Kind { SUM, PRODUCT, MIN, MAX };

// Integers in their unsigned type for Sum and Product, so that overflow wraps as MPICH's C loops
// do in practice (signed overflow is undefined in C++); Min/Max compare in the signed type.
template <typename T, bool = std::is_integral<T>::value>
struct ArithOf {
  using type = T;
};
template <typename T>
struct ArithOf<T, true> {
  using type = std::make_unsigned_t<T>;
};
template <typename T>
using Arith = typename ArithOf<T>::type;

template <typename T, Kind K>
inline void Loop(const T* __restrict in, T* __restrict inout, int64_t n) {
  using A = Arith<T>;
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (K == Kind::SUM)
      inout[i] = static_cast<T>(static_cast<A>(in[i]) + static_cast<A>(inout[i]));
    else if constexpr (K == Kind::PRODUCT)
      inout[i] = static_cast<T>(static_cast<A>(in[i]) * static_cast<A>(inout[i]));
    else if constexpr (K == Kind::MIN)
      inout[i] = in[i] < inout[i] ? in[i] : inout[i];
    else
      inout[i] = in[i] > inout[i] ? in[i] : inout[i];
  }
}

template <typename T, Kind K>
void Portable(const void* in, void* inout, int64_t n) {
  Loop<T, K>(static_cast<const T*>(in), static_cast<T*>(inout), n);
}

#if defined(__x86_64__) || defined(__i386__)
#define COLLECTIVES_LOCAL_REDUCE_AVX2 1
template <typename T, Kind K>
__attribute__((target("avx2"))) void Avx2(const void* in, void* inout, int64_t n) {
  Loop<T, K>(static_cast<const T*>(in), static_cast<T*>(inout), n);
}

bool UseAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has && !force_portable.load(std::memory_order_relaxed);
}
#else
#define COLLECTIVES_LOCAL_REDUCE_AVX2 0
#endif

using Fn = void (*)(const void*, void*, int64_t);

template <typename T, Kind K>
Fn Pick() {
#if COLLECTIVES_LOCAL_REDUCE_AVX2
  if (UseAvx2()) return &Avx2<T, K>;
#endif
  return &Portable<T, K>;
}

template <typename T>
Fn ForOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVERAGE:  // summed here, divided afterwards
      return Pick<T, Kind::SUM>();
    case ReduceOp::PRODUCT:
      return Pick<T, Kind::PRODUCT>();
    case ReduceOp::MIN:
      return std::is_integral<T>::value ? Pick<T, Kind::MIN>() : nullptr;
    case ReduceOp::MAX:
      return std::is_integral<T>::value ? Pick<T, Kind::MAX>() : nullptr;
    default:
      return nullptr;
  }
}

Fn Lookup(DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::FLOAT32: return ForOp<float>(op);
    case DataType::FLOAT64: return ForOp<double>(op);
    case DataType::INT32: return ForOp<int32_t>(op);
    case DataType::INT64: return ForOp<int64_t>(op);
    case DataType::INT16: return ForOp<int16_t>(op);
    case DataType::INT8: return ForOp<int8_t>(op);
    case DataType::UINT8: return ForOp<uint8_t>(op);
    default: return nullptr;  // 16-bit floats (half_math.h) and bool: MPI's operators
  }
}

}  // namespace

bool ReduceLocalFast(const void* in, void* inout, int64_t count, DataType dtype, ReduceOp op) {
  const Fn fn = Lookup(dtype, op);
  if (fn == nullptr) return false;
  fn(in, inout, count);
  return true;
}

const char* LocalReducePathName() {
#if COLLECTIVES_LOCAL_REDUCE_AVX2
  if (UseAvx2()) return "avx2";
#endif
  return "portable";
}

void SetLocalReducePortableForTesting(bool portable) { force_portable.store(portable); }

}  // namespace collectives
