// The whole forward of the Kokkos engine against naive_forward (float64 MODEL.md): precision
// reference within 1e-9, fp32 (and fast, which runs as fp32 here) within 1e-4 max abs, for the
// fused plan and the single-step plan, on odd shapes with non-trivial LayerNorm parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "hk/synthetic.hpp"
#include "kokkos/engine.hpp"
#include "kokkos_test_util.hpp"
#include "naive_forward.hpp"

namespace {

using namespace hk::test;

struct ForwardCase {
  const char* branch;
  int D, H, F, L, S;
  bool causal;
};

const ForwardCase kCases[] = {
    {"L=1, D=20 H=4 (hd 5), S=7, causal", 20, 4, 36, 1, 7, true},
    {"L=1, D=20 H=4 (hd 5), S=7, bidirectional", 20, 4, 36, 1, 7, false},
    {"L=3, D=24 H=3 (hd 8), S=33, bidirectional: ffn_out..ln1 chains across layers", 24, 3, 40, 3, 33, false},
    {"L=3, D=24 H=3 (hd 8), S=33, causal", 24, 3, 40, 3, 33, true},
    {"L=3, S=1: one position per sequence", 20, 4, 12, 3, 1, true},
    {"L=1, D=36 H=2 (hd 18), F=20 < D, S=70: two query blocks and key tiles", 36, 2, 20, 1, 70, false},
};

// gtest prints a case by its branch, not as bytes.
void PrintTo(const ForwardCase& c, std::ostream* os) { *os << c.branch; }

hk::ModelConfig config_of(const ForwardCase& c) {
  hk::ModelConfig m;
  m.d_model = c.D;
  m.n_heads = c.H;
  m.ffn_dim = c.F;
  m.n_layers = c.L;
  m.causal = c.causal;
  return m;
}

std::unique_ptr<hk::kokkos::KokkosEngine> engine(const hk::Model& m, hk::Precision p, int max_batch, int S,
                                                 bool fuse) {
  hk::EngineOptions o;
  o.backend = "kokkos";
  o.precision = p;
  o.max_batch = max_batch;
  o.seq_len = S;
  return hk::kokkos::create_engine(m, o, hk::kokkos::EngineTuning{fuse});
}

std::vector<double> run_f32(hk::Engine& e, const std::vector<float>& x, const std::vector<int32_t>& len, int B) {
  std::vector<float> y(x.size(), std::numeric_limits<float>::quiet_NaN());
  e.forward(x.data(), len.empty() ? nullptr : len.data(), B, y.data());
  return std::vector<double>(y.begin(), y.end());
}

std::vector<double> run_f64(hk::kokkos::KokkosEngine& e, const std::vector<float>& x, const std::vector<int32_t>& len,
                            int B) {
  std::vector<double> y(x.size(), std::numeric_limits<double>::quiet_NaN());
  e.forward_f64(x.data(), len.empty() ? nullptr : len.data(), B, y.data());
  return y;
}

void expect_padding_zero(const std::vector<double>& y, const std::vector<int32_t>& len, int S, int D) {
  for (size_t b = 0; b < len.size(); ++b)
    for (int s = len[b]; s < S; ++s)
      for (int d = 0; d < D; ++d) ASSERT_EQ(y[(b * S + s) * D + d], 0.0) << "b " << b << " s " << s;
}

class KokkosForward : public ::testing::TestWithParam<ForwardCase> {
 protected:
  void SetUp() override { kokkos_runtime(); }
};

TEST_P(KokkosForward, MatchesNaiveForwardInEveryPrecisionAndPlan) {
  const ForwardCase& c = GetParam();
  const hk::Model model = hk::synthetic_model(config_of(c), 1234 + c.D * 7 + c.S, /*nontrivial_ln=*/true);
  const int B = 4, S = c.S, D = c.D;
  const std::vector<int32_t> lengths = {0, 1, S, (S + 1) / 2};  // empty, single, full, partial
  const auto x = hk::synthetic_input(B, S, D, 99 + c.L);
  const auto ref = naive_forward(model, std::vector<double>(x.begin(), x.end()), B, S, lengths);

  for (bool fuse : {true, false}) {
    SCOPED_TRACE(fuse ? "fused plan" : "single-step plan");
    auto e64 = engine(model, hk::Precision::reference, B, S, fuse);
    const auto y64 = run_f64(*e64, x, lengths, B);
    EXPECT_LE(max_abs_error(y64, ref), 1e-9) << "reference precision";
    expect_padding_zero(y64, lengths, S, D);
    // The float output of the reference engine is the float64 result rounded.
    const auto y64f = run_f32(*e64, x, lengths, B);
    for (size_t i = 0; i < y64.size(); ++i) ASSERT_EQ(y64f[i], double(float(y64[i])));

    auto e32 = engine(model, hk::Precision::fp32, B, S, fuse);
    const auto y32 = run_f32(*e32, x, lengths, B);
    EXPECT_LE(max_abs_error(y32, ref), 1e-4) << "fp32 precision";
    expect_padding_zero(y32, lengths, S, D);

    auto efast = engine(model, hk::Precision::fast, B, S, fuse);
    EXPECT_EQ(run_f32(*efast, x, lengths, B), y32) << "fast runs the fp32 kernels on this backend";
  }
}

INSTANTIATE_TEST_SUITE_P(OddShapes, KokkosForward, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<ForwardCase>& i) {
                           return "case" + std::to_string(i.index);
                         });

class KokkosForwardCalls : public ::testing::Test {
 protected:
  void SetUp() override { kokkos_runtime(); }
};

// Absent lengths mean every position is valid.
TEST_F(KokkosForwardCalls, NullLengthsMeanAllValid) {
  const ForwardCase c = kCases[2];
  const hk::Model model = hk::synthetic_model(config_of(c), 5, true);
  const int B = 3, S = c.S;
  const auto x = hk::synthetic_input(B, S, c.D, 6);
  auto e = engine(model, hk::Precision::fp32, B, S, true);
  EXPECT_EQ(run_f32(*e, x, {}, B), run_f32(*e, x, {S, S, S}, B));
}

// Buffers are sized for max_batch and each call uses its first B*S rows; plans are cached per B.
// Equal within rounding only: the BLAS may round a row differently for another number of rows.
TEST_F(KokkosForwardCalls, SmallerBatchAfterLargerGivesTheSameRows) {
  const ForwardCase c = kCases[3];
  const hk::Model model = hk::synthetic_model(config_of(c), 7, true);
  const int S = c.S, D = c.D;
  const std::vector<int32_t> len4 = {S, 3, 0, 17};
  const auto x4 = hk::synthetic_input(4, S, D, 8);
  auto e = engine(model, hk::Precision::fp32, 4, S, true);
  const auto y4 = run_f32(*e, x4, len4, 4);
  const std::vector<float> x2(x4.begin(), x4.begin() + 2 * S * D);
  const auto y2 = run_f32(*e, x2, {S, 3}, 2);
  EXPECT_LE(max_abs_error(y2, std::vector<double>(y4.begin(), y4.begin() + 2 * S * D)), 1e-5);
  const auto y1 = run_f32(*e, std::vector<float>(x4.begin() + 3 * S * D, x4.end()), {17}, 1);
  EXPECT_LE(max_abs_error(y1, std::vector<double>(y4.begin() + 3 * S * D, y4.end())), 1e-5) << "last sequence alone";
  EXPECT_EQ(run_f32(*e, x4, len4, 4), y4) << "a repeated call is bitwise identical";
}

// MODEL.md's standard synthetic distribution on a scaled-down scoring shape, judged by the
// seed's budget (the same check the scoring uses, here with a budget ratio far below 1).
TEST_F(KokkosForwardCalls, StandardInputsMeetTheBudget) {
  hk::ModelConfig cfg;
  cfg.d_model = 64;
  cfg.n_heads = 4;
  cfg.ffn_dim = 64;
  cfg.n_layers = 4;
  cfg.causal = true;
  const int B = 2, S = 128;
  const hk::Model model = hk::synthetic_model(cfg, 11);
  const auto x = hk::synthetic_input(B, S, cfg.d_model, 12);
  const auto len = hk::synthetic_lengths(B, S, 13);
  const auto ref = naive_forward(model, std::vector<double>(x.begin(), x.end()), B, S, len);
  auto e = engine(model, hk::Precision::fast, B, S, true);
  std::vector<float> y(x.size(), std::numeric_limits<float>::quiet_NaN());
  e->forward(x.data(), len.data(), B, y.data());
  EXPECT_LE(budget_ratio(y.data(), ref), 0.05);
}

}  // namespace
