// float16 and bfloat16 <-> float conversions (round to nearest even), written out so the
// engine needs no compiler support for _Float16 and behaves the same everywhere.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace collectives {

inline float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t f;
  if (exp == 0) {
    if (mant == 0) {
      f = sign;
    } else {  // subnormal: normalise it
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        --exp;
      }
      f = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    f = sign | 0x7f800000u | (mant << 13);
  } else {
    f = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &f, 4);
  return out;
}

inline uint16_t FloatToHalf(float x) {
  uint32_t f;
  std::memcpy(&f, &x, 4);
  uint32_t sign = (f >> 16) & 0x8000;
  uint32_t abs = f & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // rounds to inf
  if (abs < 0x38800000u) {  // result is subnormal or zero: units of 2^-24, exact scaling
    float a;
    std::memcpy(&a, &abs, 4);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

inline float Bf16ToFloat(uint16_t b) {
  uint32_t f = static_cast<uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &f, 4);
  return out;
}

inline uint16_t FloatToBf16(float x) {
  uint32_t f;
  std::memcpy(&f, &x, 4);
  if ((f & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((f >> 16) | 0x40);  // quiet NaN
  f += 0x7fffu + ((f >> 16) & 1u);
  return static_cast<uint16_t>(f >> 16);
}

}  // namespace collectives
