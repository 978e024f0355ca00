#include "host_math/half_math.h"

#include <algorithm>
#include <atomic>

#include "host_math/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define COLLECTIVES_X86 1
#else
#define COLLECTIVES_X86 0
#endif

namespace collectives {
namespace {

std::atomic<bool> force_portable{false};

inline float Apply(HalfOp op, float x, float y) {
  switch (op) {
    case HalfOp::SUM: return x + y;
    case HalfOp::MIN: return std::min(x, y);
    case HalfOp::MAX: return std::max(x, y);
    default: return x * y;
  }
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void ReducePortable(HalfOp op, const uint16_t* in, uint16_t* inout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) inout[i] = FromF(Apply(op, ToF(in[i]), ToF(inout[i])));
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void ScalePortable(uint16_t* dst, const uint16_t* src, int64_t n, float f) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FromF(ToF(src[i]) * f);
}

void ReduceAny(HalfKind kind, HalfOp op, const uint16_t* in, uint16_t* inout, int64_t n) {
  if (kind == HalfKind::FLOAT16)
    ReducePortable<HalfToFloat, FloatToHalf>(op, in, inout, n);
  else
    ReducePortable<Bf16ToFloat, FloatToBf16>(op, in, inout, n);
}

void ScaleAny(HalfKind kind, uint16_t* dst, const uint16_t* src, int64_t n, float f) {
  if (kind == HalfKind::FLOAT16)
    ScalePortable<HalfToFloat, FloatToHalf>(dst, src, n, f);
  else
    ScalePortable<Bf16ToFloat, FloatToBf16>(dst, src, n, f);
}

#if COLLECTIVES_X86
bool CpuHasF16C() {
  static const bool has = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return has;
}

bool CpuHasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// x: the incoming element, y: the accumulated one. min/max pick the operands in the order
// that matches std::min(x, y) / std::max(x, y) of the portable loop (NaN included).
__attribute__((target("avx"))) inline __m256 ApplyAvx(HalfOp op, __m256 x, __m256 y) {
  switch (op) {
    case HalfOp::SUM: return _mm256_add_ps(x, y);
    case HalfOp::MIN: return _mm256_min_ps(y, x);
    case HalfOp::MAX: return _mm256_max_ps(y, x);
    default: return _mm256_mul_ps(x, y);
  }
}

__attribute__((target("avx,f16c"))) inline __m256 LoadF16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

__attribute__((target("avx,f16c"))) inline void StoreF16(uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

__attribute__((target("avx2"))) inline __m256 LoadBf16(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// Round to nearest even (as FloatToBf16): add 0x7fff plus the lowest kept bit, keep the top
// half; NaNs keep their top half, made quiet.
__attribute__((target("avx2"))) inline void StoreBf16(uint16_t* p, __m256 v) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  __m256i out = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  const __m256i abs = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  out = _mm256_blendv_epi8(out, _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40)), nan);
  // Eight 32-bit values below 2^16 to eight 16-bit ones: pack within each 128-bit lane,
  // then bring the two lanes' low halves together.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(out, out), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

__attribute__((target("avx,f16c"))) void ReduceF16C(HalfOp op, const uint16_t* in, uint16_t* inout, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) StoreF16(inout + i, ApplyAvx(op, LoadF16(in + i), LoadF16(inout + i)));
  ReducePortable<HalfToFloat, FloatToHalf>(op, in + i, inout + i, n - i);
}

__attribute__((target("avx,f16c"))) void ScaleF16C(uint16_t* dst, const uint16_t* src, int64_t n, float f) {
  const __m256 ff = _mm256_set1_ps(f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) StoreF16(dst + i, _mm256_mul_ps(LoadF16(src + i), ff));
  ScalePortable<HalfToFloat, FloatToHalf>(dst + i, src + i, n - i, f);
}

__attribute__((target("avx2"))) void ReduceBf16Avx2(HalfOp op, const uint16_t* in, uint16_t* inout, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) StoreBf16(inout + i, ApplyAvx(op, LoadBf16(in + i), LoadBf16(inout + i)));
  ReducePortable<Bf16ToFloat, FloatToBf16>(op, in + i, inout + i, n - i);
}

__attribute__((target("avx2"))) void ScaleBf16Avx2(uint16_t* dst, const uint16_t* src, int64_t n, float f) {
  const __m256 ff = _mm256_set1_ps(f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) StoreBf16(dst + i, _mm256_mul_ps(LoadBf16(src + i), ff));
  ScalePortable<Bf16ToFloat, FloatToBf16>(dst + i, src + i, n - i, f);
}
#endif

bool UseF16C() {
#if COLLECTIVES_X86
  return !force_portable.load(std::memory_order_relaxed) && CpuHasF16C();
#else
  return false;
#endif
}

bool UseAvx2() {
#if COLLECTIVES_X86
  return !force_portable.load(std::memory_order_relaxed) && CpuHasAvx2();
#else
  return false;
#endif
}

}  // namespace

void ReduceHalf(HalfKind kind, HalfOp op, const uint16_t* in, uint16_t* inout, int64_t n) {
#if COLLECTIVES_X86
  if (kind == HalfKind::FLOAT16 && UseF16C()) return ReduceF16C(op, in, inout, n);
  if (kind == HalfKind::BFLOAT16 && UseAvx2()) return ReduceBf16Avx2(op, in, inout, n);
#endif
  ReduceAny(kind, op, in, inout, n);
}

void ScaleHalf(HalfKind kind, uint16_t* dst, const uint16_t* src, int64_t n, float f) {
#if COLLECTIVES_X86
  if (kind == HalfKind::FLOAT16 && UseF16C()) return ScaleF16C(dst, src, n, f);
  if (kind == HalfKind::BFLOAT16 && UseAvx2()) return ScaleBf16Avx2(dst, src, n, f);
#endif
  ScaleAny(kind, dst, src, n, f);
}

const char* HalfPathName() {
  const bool f16c = UseF16C(), avx2 = UseAvx2();
  return f16c && avx2 ? "f16c+avx2" : f16c ? "f16c" : avx2 ? "avx2" : "portable";
}

void SetHalfPortableForTesting(bool portable) { force_portable.store(portable); }

}  // namespace collectives
