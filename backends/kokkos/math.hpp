// exp and erf for the Kokkos kernels. The double overloads are the exact library functions
// (precision `reference`). The float overloads are branch-free polynomials that a compiler
// vectorises (a libm call per element would cost more than the attention arithmetic around it
// on a CPU); both stay within a few float ulps, so fp32 keeps its 1e-4 budget with room.
// The coefficients were fitted for hk (iteratively reweighted least squares towards minimax).
#pragma once

#include <cstdint>
#include <cstring>

#include "kokkos/common.hpp"

namespace hk::kokkos {

KOKKOS_INLINE_FUNCTION double hk_exp(double x) { return kmath::exp(x); }
KOKKOS_INLINE_FUNCTION double hk_erf(double x) { return kmath::erf(x); }

// exp(x) = 2^n e^r with n = round(x / ln 2), r = x - n ln 2 (Cody-Waite: ln 2 split so that
// n * kLn2Hi is exact), e^r by a degree-6 polynomial on |r| <= ln(2)/2; relative error < 2e-7.
// All in float, so a compiler vectorises it 8-wide. Needs IEEE evaluation order: compile it
// without -fassociative-math (the subtraction order carries the accuracy).
// Exactly 0 below -87 (and for -inf, which the attention masks use), +inf above 88.
KOKKOS_INLINE_FUNCTION float hk_exp(float x) {
  constexpr float kLn2Hi = 0.693145751953125f;     // 16 significant bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = 1.428606820e-06f;       // ln 2 - kLn2Hi
  // Clamps and selects one comparison at a time: nested conditionals defeat GCC's vectoriser.
  float xc = x < -87.0f ? -87.0f : x;
  xc = xc > 88.0f ? 88.0f : xc;
  const float n = kmath::floor(xc * 1.44269504088896341f + 0.5f);
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.383669383e-03f;
  p = p * r + 8.374887821e-03f;
  p = p * r + 4.166823196e-02f;
  p = p * r + 1.666641932e-01f;
  p = p * r + 4.999999203e-01f;
  p = p * r + 1.000000037e+00f;
  p = p * r + 1.000000001e+00f;
  // 2^n through the exponent field (n in [-126, 127] after the clamp).
  const int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const float e = p * scale;
  const float low = x < -87.0f ? 0.0f : e;
  return x > 88.0f ? e * 4.0f : low;  // 4 e^88 overflows to +inf
}

// erf(x): odd polynomial in x for |x| < 1.2, a polynomial in (|x| - 2.55) / 1.35 on
// [1.2, 3.9], 1 beyond (erf(3.9) rounds to 1 - 1 ulp). Absolute error < 2e-7.
KOKKOS_INLINE_FUNCTION float hk_erf(float x) {
  const float a = kmath::fabs(x);
  const float u = a * a;
  float p = -8.042402544e-06f;
  p = p * u + 1.062666066e-04f;
  p = p * u - 8.384812416e-04f;
  p = p * u + 5.213365568e-03f;
  p = p * u - 2.686238821e-02f;
  p = p * u + 1.128372508e-01f;
  p = p * u - 3.761263442e-01f;
  p = p * u + 1.128379167e+00f;
  const float small = a * p;
  const float a_top = a < 3.9f ? a : 3.9f;
  const float s = (a_top - 2.55f) * (1.0f / 1.35f);
  float q = -3.332704287e-04f;
  q = q * s + 4.054376858e-04f;
  q = q * s + 1.444785568e-03f;
  q = q * s - 3.609794212e-03f;
  q = q * s + 1.857923928e-03f;
  q = q * s + 5.360103828e-03f;
  q = q * s - 1.574614756e-02f;
  q = q * s + 2.373442095e-02f;
  q = q * s - 2.389068325e-02f;
  q = q * s + 1.666857426e-02f;
  q = q * s - 7.864983215e-03f;
  q = q * s + 2.284230400e-03f;
  q = q * s + 9.996893467e-01f;
  // One comparison per select: nested conditionals defeat GCC's vectoriser.
  const float mid = a < 3.9f ? q : 1.0f;
  const float r = a < 1.2f ? small : mid;
  return x < 0.0f ? -r : r;
}

// Exact GELU of MODEL.md: 0.5 z (1 + erf(z / sqrt 2)).
template <class T>
KOKKOS_INLINE_FUNCTION T gelu(T z) {
  return T(0.5) * z * (T(1) + hk_erf(z * T(0.70710678118654752440)));
}

}  // namespace hk::kokkos
