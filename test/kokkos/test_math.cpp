// The float approximations of backends/kokkos/math.hpp against the C library in float64.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kokkos/math.hpp"
#include "naive_forward.hpp"

namespace {

using hk::kokkos::gelu;
using hk::kokkos::hk_erf;
using hk::kokkos::hk_exp;

// Softmax arguments are <= 0; the whole range down to the flush to 0.
TEST(KokkosMath, ExpFloatRelativeErrorOnSoftmaxRange) {
  double worst = 0;
  for (int i = 0; i <= 870000; ++i) {
    const float x = -87.0f + float(i) * 1e-4f;
    const double ref = std::exp(double(x));
    const double err = std::fabs(double(hk_exp(x)) - ref) / ref;
    ASSERT_LE(err, 2e-7) << "x = " << x;
    worst = std::max(worst, err);
  }
  RecordProperty("worst_relative_error", std::to_string(worst));
}

TEST(KokkosMath, ExpFloatPositiveArguments) {
  for (float x = 0.0f; x <= 88.0f; x += 0.01f) {
    const double ref = std::exp(double(x));
    ASSERT_LE(std::fabs(double(hk_exp(x)) - ref) / ref, 2e-7) << "x = " << x;
  }
}

// The attention masks feed -inf and rely on an exact 0 back (a fully masked row must sum to 0).
TEST(KokkosMath, ExpFloatUnderflowAndInfinities) {
  EXPECT_EQ(hk_exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(hk_exp(-87.5f), 0.0f);
  EXPECT_EQ(hk_exp(-1e30f), 0.0f);
  EXPECT_TRUE(std::isinf(hk_exp(89.0f)));
  EXPECT_TRUE(std::isinf(hk_exp(std::numeric_limits<float>::infinity())));
  EXPECT_EQ(hk_exp(0.0f), 1.0f);
}

// Covers all three branches: |x| < 1.2, 1.2 <= |x| < 3.9, saturation beyond.
TEST(KokkosMath, ErfFloatAbsoluteErrorAllBranches) {
  for (int i = -80000; i <= 80000; ++i) {
    const float x = float(i) * 1e-4f;
    ASSERT_LE(std::fabs(double(hk_erf(x)) - std::erf(double(x))), 2.5e-7) << "x = " << x;
    ASSERT_EQ(hk_erf(x), -hk_erf(-x)) << "odd symmetry at x = " << x;
  }
  EXPECT_EQ(hk_erf(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(hk_erf(-std::numeric_limits<float>::infinity()), -1.0f);
}

TEST(KokkosMath, GeluFloatAgainstNaive) {
  for (int i = -100000; i <= 100000; ++i) {
    const float z = float(i) * 1e-4f;
    const double ref = hk::test::naive_gelu(double(z));
    ASSERT_LE(std::fabs(double(gelu(z)) - ref), 2e-7 * (1.0 + std::fabs(ref))) << "z = " << z;
  }
}

TEST(KokkosMath, DoubleOverloadsAreTheLibraryFunctions) {
  for (double x : {-30.0, -1.5, -1e-3, 0.0, 0.7, 2.5, 5.0}) {
    EXPECT_EQ(hk_exp(x), std::exp(x));
    EXPECT_EQ(hk_erf(x), std::erf(x));
    EXPECT_NEAR(gelu(x), hk::test::naive_gelu(x), 1e-15 * (1.0 + std::fabs(x)));
  }
}

}  // namespace
