// Each op of the Kokkos backend against the float64 loops of naive_forward.hpp, in float and
// float64, on fresh random inputs and odd shapes, outputs poisoned with NaN before every run.
// Test names say which branch of the kernel a shape exercises.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <string>
#include <vector>

#include "hk/error.hpp"
#include "kokkos/attention.hpp"
#include "kokkos/layer_norm.hpp"
#include "kokkos/linear.hpp"
#include "kokkos_test_util.hpp"
#include "naive_forward.hpp"

namespace {

using namespace hk::test;
namespace kk = hk::kokkos;

template <class T>
class KokkosOps : public ::testing::Test {
 protected:
  void SetUp() override { kokkos_runtime(); }
};
using Precisions = ::testing::Types<float, double>;
TYPED_TEST_SUITE(KokkosOps, Precisions);

constexpr double kEps = 1e-5;

// rows 1: one partial team; 7: a partial team of 8 rows; 33: four full teams and one row.
// D 5, 20, 24: vector loops with tails; 128: the model width.
const int kRows[] = {1, 7, 33};
const int kWidths[] = {5, 20, 24, 128};

// Rows with a large common offset: a one-pass E[x^2] - E[x]^2 variance would lose the digits.
std::vector<double> offset_rows(int rows, int D, uint64_t seed) {
  std::vector<double> x = random_vector(size_t(rows) * D, seed, -2.0, 2.0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < D; ++c) x[size_t(r) * D + c] += 40.0 * (r % 3) - 20.0;
  return x;
}

TYPED_TEST(KokkosOps, LayerNormTwoPassOnOffsetRows) {
  using T = TypeParam;
  uint64_t seed = 100;
  for (int rows : kRows)
    for (int D : kWidths) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " D " + std::to_string(D));
      const auto x = round_to<T>(offset_rows(rows, D, ++seed));
      const auto w = round_to<T>(random_vector(D, ++seed, 0.5, 1.5));
      const auto b = round_to<T>(random_vector(D, ++seed, -0.5, 0.5));
      std::vector<double> ref;
      naive_layer_norm(x, rows, D, w, b, kEps, ref);
      auto h = poisoned_mat<T>(rows, D);
      kk::layer_norm<T>(to_mat<T>(x, rows, D), to_vec<T>(w), to_vec<T>(b), kEps, h);
      // Centring a row of magnitude |x| with spread sigma loses |x| / sigma of relative precision,
      // and the sums over D add up to sqrt(D) roundings: the tolerance follows both (with the
      // compiler free to reorder the sums, e.g. vectorised or not).
      double amax = 0, smin = std::numeric_limits<double>::infinity();
      for (int r = 0; r < rows; ++r) {
        double m = 0, v = 0;
        for (int c = 0; c < D; ++c) m += x[size_t(r) * D + c] / D;
        for (int c = 0; c < D; ++c) {
          const double d = x[size_t(r) * D + c] - m;
          v += d * d / D;
          amax = std::max(amax, std::fabs(x[size_t(r) * D + c]));
        }
        smin = std::min(smin, std::sqrt(v));
      }
      const double tol = std::max(op_tolerance<T>(), 4.0 * double(std::numeric_limits<T>::epsilon()) *
                                                         (1.0 + amax / smin) * std::sqrt(double(D)));
      EXPECT_LE(scaled_error(from_mat(h), ref), tol);
    }
}

TYPED_TEST(KokkosOps, AddLayerNormWritesResidualBack) {
  using T = TypeParam;
  uint64_t seed = 200;
  for (int rows : kRows)
    for (int D : kWidths) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " D " + std::to_string(D));
      const auto x = round_to<T>(random_vector(size_t(rows) * D, ++seed, -3.0, 3.0));
      const auto bias = round_to<T>(random_vector(D, ++seed));
      const auto w = round_to<T>(random_vector(D, ++seed, 0.5, 1.5));
      const auto b = round_to<T>(random_vector(D, ++seed, -0.5, 0.5));
      std::vector<double> sum(x.size()), ref;
      for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + bias[i % D];
      naive_layer_norm(sum, rows, D, w, b, kEps, ref);
      auto xv = to_mat<T>(x, rows, D);
      auto h = poisoned_mat<T>(rows, D);
      kk::add_layer_norm<T>(xv, to_vec<T>(bias), to_vec<T>(w), to_vec<T>(b), kEps, h);
      EXPECT_LE(scaled_error(from_mat(xv), sum), op_tolerance<T>()) << "x must become x + bias";
      EXPECT_LE(scaled_error(from_mat(h), ref), op_tolerance<T>());
    }
}

// lengths 0 (all padding), 1, S and one in between; with and without the fused residual bias.
TYPED_TEST(KokkosOps, FinalLayerNormZeroesPaddingRows) {
  using T = TypeParam;
  uint64_t seed = 300;
  for (int S : {1, 7, 33})
    for (bool with_bias : {false, true})
      for (int D : {20, 24}) {
        SCOPED_TRACE("S " + std::to_string(S) + " D " + std::to_string(D) + (with_bias ? " bias" : " no bias"));
        const int B = 4;
        const std::vector<int32_t> lengths = {0, 1, S, (S + 1) / 2};
        const int rows = B * S;
        const auto x = round_to<T>(random_vector(size_t(rows) * D, ++seed, -3.0, 3.0));
        const auto bias = with_bias ? round_to<T>(random_vector(D, ++seed)) : std::vector<double>();
        const auto w = round_to<T>(random_vector(D, ++seed, 0.5, 1.5));
        const auto b = round_to<T>(random_vector(D, ++seed, -0.5, 0.5));
        std::vector<double> sum = x, ref;
        if (with_bias)
          for (size_t i = 0; i < x.size(); ++i) sum[i] += bias[i % D];
        naive_layer_norm(sum, rows, D, w, b, kEps, ref);
        for (int r = 0; r < rows; ++r)
          if (r % S >= lengths[r / S])
            for (int c = 0; c < D; ++c) ref[size_t(r) * D + c] = 0.0;
        auto xv = to_mat<T>(x, rows, D);
        auto y = poisoned_mat<T>(rows, D);
        kk::final_layer_norm<T>(xv, with_bias ? kk::ConstVec<T>(to_vec<T>(bias)) : kk::ConstVec<T>(), to_vec<T>(w),
                                to_vec<T>(b), kEps, to_lengths(lengths), S, y);
        const auto got = from_mat(y);
        EXPECT_LE(scaled_error(got, ref), op_tolerance<T>());
        for (int r = 0; r < rows; ++r)
          if (r % S >= lengths[r / S])
            for (int c = 0; c < D; ++c) ASSERT_EQ(got[size_t(r) * D + c], 0.0) << "padded row " << r;
        EXPECT_EQ(from_mat(xv), x) << "the tail must not write x";
      }
}

// beta = 0 must ignore the NaN in out; beta = 1 accumulates (the residual projections).
TYPED_TEST(KokkosOps, GemmNtOverwriteAndAccumulate) {
  using T = TypeParam;
  uint64_t seed = 400;
  for (int rows : kRows)
    for (int K : {5, 20, 128})
      for (int N : {3, 24, 60}) {
        SCOPED_TRACE("rows " + std::to_string(rows) + " K " + std::to_string(K) + " N " + std::to_string(N));
        const auto in = round_to<T>(random_vector(size_t(rows) * K, ++seed));
        const auto W = round_to<T>(random_vector(size_t(N) * K, ++seed));
        const auto c0 = round_to<T>(random_vector(size_t(rows) * N, ++seed));
        std::vector<double> ref;
        naive_linear(in, rows, K, W, std::vector<double>(N, 0.0), N, ref);
        auto out = poisoned_mat<T>(rows, N);
        kk::gemm_nt<T>(to_mat<T>(in, rows, K), to_mat<T>(W, N, K), T(0), out);
        EXPECT_LE(scaled_error(from_mat(out), ref), op_tolerance<T>()) << "beta 0";
        auto acc = to_mat<T>(c0, rows, N);
        kk::gemm_nt<T>(to_mat<T>(in, rows, K), to_mat<T>(W, N, K), T(1), acc);
        for (size_t i = 0; i < ref.size(); ++i) ref[i] += c0[i];
        EXPECT_LE(scaled_error(from_mat(acc), ref), op_tolerance<T>()) << "beta 1";
      }
}

TYPED_TEST(KokkosOps, AddBiasRows) {
  using T = TypeParam;
  uint64_t seed = 500;
  for (int rows : kRows)
    for (int N : {3, 20, 130}) {
      const auto y = round_to<T>(random_vector(size_t(rows) * N, ++seed));
      const auto bias = round_to<T>(random_vector(N, ++seed));
      std::vector<double> ref(y.size());
      for (size_t i = 0; i < y.size(); ++i) ref[i] = y[i] + bias[i % N];
      auto yv = to_mat<T>(y, rows, N);
      kk::add_bias<T>(yv, to_vec<T>(bias));
      EXPECT_LE(scaled_error(from_mat(yv), ref), op_tolerance<T>()) << "rows " << rows << " N " << N;
    }
}

// z in [-8, 8]: z / sqrt 2 reaches all three branches of the float erf.
TYPED_TEST(KokkosOps, BiasGeluRowsAllErfBranches) {
  using T = TypeParam;
  uint64_t seed = 600;
  for (int rows : kRows)
    for (int N : {3, 20, 130}) {
      const auto y = round_to<T>(random_vector(size_t(rows) * N, ++seed, -7.0, 7.0));
      const auto bias = round_to<T>(random_vector(N, ++seed));
      std::vector<double> ref(y.size());
      for (size_t i = 0; i < y.size(); ++i) ref[i] = naive_gelu(y[i] + bias[i % N]);
      auto yv = to_mat<T>(y, rows, N);
      kk::bias_gelu<T>(yv, to_vec<T>(bias));
      EXPECT_LE(scaled_error(from_mat(yv), ref), op_tolerance<T>()) << "rows " << rows << " N " << N;
    }
}

struct AttentionShape {
  const char* branch;
  int S, D, H;
};

// Kernel constants these shapes aim at (attention.cpp): 8 query rows per lane group, key tiles
// of 64 keys advanced 4 at a time, head columns 4 at a time, rows per team from the head dim.
const AttentionShape kAttentionShapes[] = {
    {"S=1: one query, one key, 7 idle lanes", 1, 20, 4},
    {"S=7 hd=5: one partial lane group, key step padding, scalar column tail", 7, 20, 4},
    {"S=33 hd=8: lanes past S in the last group, two column steps", 33, 24, 3},
    {"S=70 hd=128: three query blocks per head (32 rows per team), two key tiles", 70, 128, 1},
    {"S=130 hd=8: two query blocks, three key tiles, causal tile skipping", 130, 32, 4},
    {"S=33 hd=6: column step plus tail", 33, 24, 4},
};

TYPED_TEST(KokkosOps, AttentionMasksTilesAndBias) {
  using T = TypeParam;
  uint64_t seed = 700;
  for (const AttentionShape& sh : kAttentionShapes)
    for (bool causal : {true, false})
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(std::string(sh.branch) + (causal ? ", causal" : ", bidirectional") +
                     (with_bias ? ", bias added on load" : ", bias already in qkv"));
        const int S = sh.S, D = sh.D, H = sh.H, B = 4;
        // lengths 0 (no valid row: zeros), 1, S, and one in between.
        const std::vector<int32_t> lengths = {0, 1, S, (S + 1) / 2};
        const size_t rows = size_t(B) * S;
        // Scores of a few units: softmax weights far from uniform.
        const auto qkv = round_to<T>(random_vector(rows * 3 * D, ++seed, -2.0, 2.0));
        const auto bias = with_bias ? round_to<T>(random_vector(3 * size_t(D), ++seed)) : std::vector<double>();
        std::vector<double> q(rows * D), k(rows * D), v(rows * D);
        for (size_t r = 0; r < rows; ++r)
          for (int c = 0; c < D; ++c) {
            const double* src = &qkv[r * 3 * D];
            q[r * D + c] = src[c] + (with_bias ? bias[c] : 0.0);
            k[r * D + c] = src[D + c] + (with_bias ? bias[D + c] : 0.0);
            v[r * D + c] = src[2 * D + c] + (with_bias ? bias[2 * D + c] : 0.0);
          }
        std::vector<double> ref;
        naive_attention(q, k, v, B, S, D, H, causal, lengths, ref);
        auto o = poisoned_mat<T>(rows, D);
        kk::attention<T>(to_mat<T>(qkv, rows, 3 * D), with_bias ? kk::ConstVec<T>(to_vec<T>(bias)) : kk::ConstVec<T>(),
                         to_lengths(lengths), B, S, H, causal, o);
        const auto got = from_mat(o);
        std::vector<double> got_valid, ref_valid;
        for (size_t r = 0; r < rows; ++r) {
          const bool valid = int(r % S) < lengths[r / S];
          for (int c = 0; c < D; ++c) {
            if (valid) {
              got_valid.push_back(got[r * D + c]);
              ref_valid.push_back(ref[r * D + c]);
            } else {
              ASSERT_EQ(got[r * D + c], 0.0) << "padded query row " << r << " must be 0";
            }
          }
        }
        EXPECT_LE(scaled_error(got_valid, ref_valid), op_tolerance<T>());
      }
}

// A batch of one sequence of length 0 with S=1: the whole launch writes zeros only.
TYPED_TEST(KokkosOps, AttentionAllPadding) {
  using T = TypeParam;
  auto o = poisoned_mat<T>(5, 20);
  kk::attention<T>(to_mat<T>(random_vector(5 * 60, 9), 5, 60), kk::ConstVec<T>(), to_lengths({0, 0, 0, 0, 0}), 5, 1,
                   4, true, o);
  for (double v : from_mat(o)) ASSERT_EQ(v, 0.0);
}

TYPED_TEST(KokkosOps, ShapeMismatchesThrow) {
  using T = TypeParam;
  auto x = poisoned_mat<T>(4, 8);
  auto w8 = to_vec<T>(std::vector<double>(8, 1.0));
  auto w7 = to_vec<T>(std::vector<double>(7, 1.0));
  EXPECT_THROW(kk::layer_norm<T>(x, w7, w8, kEps, poisoned_mat<T>(4, 8)), hk::Error);
  EXPECT_THROW(kk::layer_norm<T>(x, w8, w8, kEps, poisoned_mat<T>(3, 8)), hk::Error);
  EXPECT_THROW(kk::gemm_nt<T>(x, poisoned_mat<T>(5, 7), T(0), poisoned_mat<T>(4, 5)), hk::Error);
  EXPECT_THROW(kk::add_bias<T>(x, w7), hk::Error);
  EXPECT_THROW(kk::attention<T>(poisoned_mat<T>(4, 24), kk::ConstVec<T>(), to_lengths({1, 1}), 2, 2, 3, true,
                                poisoned_mat<T>(4, 9)),
               hk::Error);
}

}  // namespace
