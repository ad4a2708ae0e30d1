// Numeric robustness of the Kokkos backend through hk::make_engine, against the float64
// naive_forward: inputs of magnitude 1e4, LayerNorm of a constant row, lengths 0/1/S mixed in
// one batch. (NaN/Inf refusal belongs to the file contract: test/io/test_bad_files.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "hk/engine.hpp"
#include "hk/synthetic.hpp"
#include "naive_forward.hpp"

namespace hk::test {
namespace {

ModelConfig config(bool causal) {
  ModelConfig c;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_layers = 2;
  c.ffn_dim = 48;
  c.causal = causal;
  return c;
}

std::vector<float> run(const Model& m, Precision p, const std::vector<float>& x, const std::vector<int32_t>& len,
                       int B, int S) {
  EngineOptions o;
  o.backend = "kokkos";
  o.precision = p;
  o.max_batch = B;
  o.seq_len = S;
  auto e = make_engine(m, o);
  std::vector<float> y(x.size(), std::nanf(""));  // poisoned: an unwritten element shows
  e->forward(x.data(), len.empty() ? nullptr : len.data(), B, y.data());
  return y;
}

double max_abs_error(const std::vector<float>& y, const std::vector<double>& ref) {
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(y[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double(y[i]) - ref[i]));
  }
  return worst;
}

// fp32 within MODEL.md's 1e-4 (or `fp32_tol`); reference within what rounding the float output
// allows; fast within the accuracy budget (or `fp32_tol` where that is looser).
void expect_matches(const Model& m, const std::vector<float>& x, const std::vector<int32_t>& len, int B, int S,
                    const char* what, double fp32_tol = 1e-4) {
  const auto ref = naive_forward(m, std::vector<double>(x.begin(), x.end()), B, S, len);
  EXPECT_LE(max_abs_error(run(m, Precision::reference, x, len, B, S), ref), 1e-5) << what << ", reference";
  EXPECT_LE(max_abs_error(run(m, Precision::fp32, x, len, B, S), ref), fp32_tol) << what << ", fp32";
  const auto yf = run(m, Precision::fast, x, len, B, S);
  EXPECT_TRUE(budget_ratio(yf.data(), ref) <= 1.0 || max_abs_error(yf, ref) <= fp32_tol) << what << ", fast";
}

class Numeric : public ::testing::TestWithParam<bool> {};

TEST_P(Numeric, MagnitudeTenThousandWithMixedLengths) {
  const ModelConfig c = config(GetParam());
  const Model m = synthetic_model(c, 41, /*nontrivial_ln=*/true);
  const int B = 4, S = 9;
  std::vector<float> x = synthetic_input(B, S, c.d_model, 41);
  for (float& v : x) v *= 1e4f;
  expect_matches(m, x, {0, 1, S, S}, B, S, "x ~ 1e4 N(0,1), lengths {0,1,S,S}");
  // An offset of 1e4 on every element: LayerNorm must subtract the mean before squaring (a
  // one-pass E[x^2] - mean^2 in fp32 loses everything here: ulp(1e8) = 8 against a variance of
  // 1). The fp32 residual stream itself rounds each add to ulp(1e4) ~ 1e-3 on rows of unit
  // spread, a floor no fp32 kernel can beat, so the fp32 bound is 1e-2, not MODEL.md's 1e-4
  // (which is defined on the standard N(0,1) inputs); reference precision keeps 1e-5.
  x = synthetic_input(B, S, c.d_model, 42);
  for (float& v : x) v += 1e4f;
  expect_matches(m, x, {S, 0, 1, S}, B, S, "x ~ 1e4 + N(0,1), lengths {S,0,1,S}", 1e-2);
}

// Constants whose sum over a row of D = 32 is exact in fp32 in any order, so the row mean is
// exact and x - mean is exactly 0: the output must be the bias, not 0/0.
constexpr float kExact[] = {0.0f, 1.0f, -3.75f, 1e4f, -1e4f, 7.0f, 2.5f, -0.5f, 4096.0f, 0.125f};
// Constants whose fp32 row sum rounds: a mean computed naively is off by ~ulp(x), and
// (x - mean) / sqrt(var + eps) then turns that into an O(1) error where the answer is the bias.
constexpr float kInexact[] = {12345.678f, 0.001f, 3.14159f, -9876.543f, 1.1f, 777.77f, -0.3f, 1e4f + 0.5f, 0.7f, 99.99f};

// Rows 0..4 of sequence 0 (all valid) hold constants, the rest is random. Rows near 1e4 meet
// the fp32 residual floor of the offset test above, hence its 1e-2 bound in fp32; a LayerNorm
// that turns a rounded mean into an O(1) error still fails it.
void constant_rows_among_random(bool causal, const float* constants) {
  const ModelConfig c = config(causal);
  const Model m = synthetic_model(c, 43, /*nontrivial_ln=*/true);
  const int B = 3, S = 6, D = c.d_model;
  std::vector<float> x = synthetic_input(B, S, D, 43);
  for (int i = 0; i < 5; ++i) std::fill_n(x.begin() + size_t(i) * D, D, constants[i]);
  expect_matches(m, x, {S, 1, 0}, B, S, "constant rows at valid positions", 1e-2);
}

// With every projection zero the residual stream is the input itself, so the output of a
// constant row is exactly the final LayerNorm's bias.
void layer_norm_of_constant_rows(bool causal, const float* constants) {
  const ModelConfig c = config(causal);
  Model m = synthetic_model(c, 44, /*nontrivial_ln=*/true);
  for (auto& p : m.parameters())
    if (p.name.find("norm") == std::string::npos) std::fill(p.values->begin(), p.values->end(), 0.0);
  const int B = 2, S = 5, D = c.d_model;
  std::vector<float> x(size_t(B) * S * D);
  for (int r = 0; r < B * S; ++r) std::fill_n(x.begin() + size_t(r) * D, D, constants[r]);
  for (Precision p : {Precision::reference, Precision::fp32, Precision::fast}) {
    const auto y = run(m, p, x, {}, B, S);
    for (int r = 0; r < B * S; ++r)
      for (int d = 0; d < D; ++d)
        ASSERT_NEAR(y[size_t(r) * D + d], m.final_norm_b[size_t(d)], 1e-5)
            << to_string(p) << ": row " << r << " (constant " << constants[r] << "), column " << d;
  }
}

TEST_P(Numeric, ConstantRowsAmongRandomOnes) { constant_rows_among_random(GetParam(), kExact); }
TEST_P(Numeric, LayerNormOfConstantRowIsTheBias) { layer_norm_of_constant_rows(GetParam(), kExact); }
TEST_P(Numeric, InexactConstantRowsAmongRandomOnes) { constant_rows_among_random(GetParam(), kInexact); }
TEST_P(Numeric, LayerNormOfInexactConstantRowIsTheBias) { layer_norm_of_constant_rows(GetParam(), kInexact); }

INSTANTIATE_TEST_SUITE_P(Reliability, Numeric, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "causal" : "bidirectional"; });

}  // namespace
}  // namespace hk::test
