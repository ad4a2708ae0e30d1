// Helpers of the Kokkos backend tests: moving float64 host data in and out of views, NaN
// poisoning, and error measures against the float64 references of naive_forward.hpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "hk/synthetic.hpp"
#include "kokkos/common.hpp"
#include "kokkos/runtime.hpp"

namespace hk::test {

// Keeps Kokkos alive for every test of the binary (finalised at exit by the backend's runtime).
inline const kokkos::RuntimeRef& kokkos_runtime() {
  static kokkos::RuntimeRef r;
  return r;
}

inline std::vector<double> random_vector(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Rng rng(seed);
  std::vector<double> v(n);
  for (double& x : v) x = rng.uniform(lo, hi);
  return v;
}

// Values as T, exactly what the kernel sees; the reference then uses these rounded values.
template <class T>
std::vector<double> round_to(const std::vector<double>& v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = double(T(v[i]));
  return r;
}

template <class T>
kokkos::Mat<T> to_mat(const std::vector<double>& v, size_t rows, size_t cols) {
  kokkos::Mat<T> m("test_mat", rows, cols);
  auto h = Kokkos::create_mirror_view(m);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) h(r, c) = T(v[r * cols + c]);
  Kokkos::deep_copy(m, h);
  return m;
}

template <class T>
kokkos::Vec<T> to_vec(const std::vector<double>& v) {
  kokkos::Vec<T> d("test_vec", v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (size_t i = 0; i < v.size(); ++i) h(i) = T(v[i]);
  Kokkos::deep_copy(d, h);
  return d;
}

inline kokkos::Lengths to_lengths(const std::vector<int32_t>& v) {
  Kokkos::View<int32_t*, kokkos::MemSpace> d("test_lengths", v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

template <class T>
std::vector<double> from_mat(const kokkos::Mat<T>& m) {
  auto h = Kokkos::create_mirror_view(m);
  Kokkos::deep_copy(h, m);
  std::vector<double> v(m.extent(0) * m.extent(1));
  for (size_t r = 0; r < m.extent(0); ++r)
    for (size_t c = 0; c < m.extent(1); ++c) v[r * m.extent(1) + c] = double(h(r, c));
  return v;
}

template <class T>
kokkos::Mat<T> poisoned_mat(size_t rows, size_t cols) {
  kokkos::Mat<T> m("test_out", rows, cols);
  Kokkos::deep_copy(m, std::numeric_limits<T>::quiet_NaN());
  return m;
}

// Largest |got - ref| / (1 + |ref|) (a relative error that turns absolute near 0); +inf when
// anything is not finite, so poisoned elements left unwritten fail every tolerance.
inline double scaled_error(const std::vector<double>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, std::fabs(got[i] - ref[i]) / (1.0 + std::fabs(ref[i])));
  }
  return worst;
}

inline double max_abs_error(const std::vector<double>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, std::fabs(got[i] - ref[i]));
  }
  return worst;
}

// Tolerance of one op's output for T: float rounding of O(1) values through sums of up to a
// few hundred terms stays far below 2e-5; float64 stays below 1e-12.
template <class T>
constexpr double op_tolerance() {
  return sizeof(T) == 4 ? 2e-5 : 1e-12;
}

}  // namespace hk::test
