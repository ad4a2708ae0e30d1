// Element types a file may hold (FORMAT.md: weights float16/32/64, x float32/float16) and an
// exact IEEE binary16 conversion, done here rather than by HDF5's soft conversion so that
// rounding is round-to-nearest-even and NaN/Inf survive unchanged.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

namespace hk::io {

enum class DType { float16, float32, float64 };

const char* to_string(DType t);
DType dtype_from_string(const std::string& s);  // throws hk::Error on an unknown name

// binary16 bits -> double (exact).
inline double half_to_double(uint16_t h) {
  const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(double(man), -24);  // zero or subnormal
  } else if (exp == 31) {
    v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(double(man | 0x400), exp - 25);
  }
  return sign ? -v : v;
}

// double -> binary16 bits, round to nearest even; overflow gives Inf, NaN stays NaN.
inline uint16_t double_to_half(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint16_t sign = uint16_t((bits >> 48) & 0x8000u);
  if (std::isnan(v)) return uint16_t(sign | 0x7e00u);
  const double a = std::fabs(v);
  // 65504 is the largest finite half; 65520 is the midpoint to 65536 and rounds (to even) up.
  if (a >= 65520.0) return uint16_t(sign | 0x7c00u);
  if (a < 0x1.0p-14) {
    // Subnormal range: the value is m * 2^-24; the scaling is exact, nearbyint rounds to even.
    const double m = std::nearbyint(a * 0x1.0p24);
    return uint16_t(sign | uint16_t(m));  // m == 1024 correctly becomes the smallest normal
  }
  int e;
  std::frexp(a, &e);                                  // a = f * 2^e, f in [0.5, 1)
  double m = std::nearbyint(std::ldexp(a, 11 - e));   // in [1024, 2048]
  int exp = e - 1 + 15;
  if (m >= 2048.0) {
    m = 1024.0;
    ++exp;
  }
  if (exp >= 31) return uint16_t(sign | 0x7c00u);
  return uint16_t(sign | uint16_t(exp << 10) | uint16_t(int(m) - 1024));
}

}  // namespace hk::io
