#include "host_math/buffer_math.h"

#include <cstring>

#include "host_math/half_math.h"

namespace collectives {
namespace {

template <typename T>
void ScaleTyped(T* dst, const T* src, int64_t n, double f) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(static_cast<double>(src[i]) * f);
}

template <typename T>
void DivideTyped(T* p, int64_t n, int64_t d) {
  const T dd = static_cast<T>(d);
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / dd);
}

}  // namespace

void ScaledCopy(void* dst, const void* src, int64_t n, DataType t, double f) {
  switch (t) {
    case DataType::UINT8: ScaleTyped(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, f); break;
    case DataType::INT8: ScaleTyped(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n, f); break;
    case DataType::INT16: ScaleTyped(static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), n, f); break;
    case DataType::INT32: ScaleTyped(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, f); break;
    case DataType::INT64: ScaleTyped(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, f); break;
    case DataType::FLOAT32: {
      float* d = static_cast<float*>(dst);
      const float* s = static_cast<const float*>(src);
      const float ff = static_cast<float>(f);
      for (int64_t i = 0; i < n; ++i) d[i] = s[i] * ff;
      break;
    }
    case DataType::FLOAT64: ScaleTyped(static_cast<double*>(dst), static_cast<const double*>(src), n, f); break;
    case DataType::FLOAT16:
      ScaleHalf(HalfKind::FLOAT16, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, static_cast<float>(f));
      break;
    case DataType::BFLOAT16:
      ScaleHalf(HalfKind::BFLOAT16, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, static_cast<float>(f));
      break;
    case DataType::BOOL:
      if (dst != src) std::memcpy(dst, src, static_cast<size_t>(n));
      break;
  }
}

void ScaleBuffer(void* buf, int64_t n, DataType t, double f) {
  if (f == 1.0) return;
  ScaledCopy(buf, buf, n, t, f);
}

void DivideIntegers(void* buf, int64_t n, DataType t, int64_t d) {
  switch (t) {
    case DataType::UINT8: DivideTyped(static_cast<uint8_t*>(buf), n, d); break;
    case DataType::INT8: DivideTyped(static_cast<int8_t*>(buf), n, d); break;
    case DataType::INT16: DivideTyped(static_cast<int16_t*>(buf), n, d); break;
    case DataType::INT32: DivideTyped(static_cast<int32_t*>(buf), n, d); break;
    case DataType::INT64: DivideTyped(static_cast<int64_t*>(buf), n, d); break;
    default: break;
  }
}

void ScaleReduced(void* buf, int64_t n, DataType dtype, ReduceOp op, double postscale, int set_size) {
  if (op == ReduceOp::AVERAGE) {
    if (IsFloat(dtype)) {
      ScaleBuffer(buf, n, dtype, postscale / set_size);
      return;
    }
    DivideIntegers(buf, n, dtype, set_size);
  }
  ScaleBuffer(buf, n, dtype, postscale);
}

}  // namespace collectives
