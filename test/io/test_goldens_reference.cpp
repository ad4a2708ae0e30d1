// The goldens are what MODEL.md says: each reference output (PyTorch float64, stored as float32)
// equals the plain float64 evaluation of test/common/naive_forward.hpp on the file as this
// reader reads it, to float32 rounding. Needs no backend; guards the goldens, the reader and
// the reference script against each other.
#include <gtest/gtest.h>

#include <cmath>

#include "goldens.hpp"
#include "hk/io/io.hpp"
#include "naive_forward.hpp"

namespace hk::test {
namespace {

const std::string kData = HK_DATA_DIR;

class GoldenReference : public ::testing::TestWithParam<Golden> {};

TEST_P(GoldenReference, MatchesTheNaiveFloat64Forward) {
  const Golden& g = GetParam();
  SCOPED_TRACE(g.name + ": " + g.exercises);
  const Model m = io::read_model(kData + "/" + g.file);
  const ModelConfig& c = m.config;
  EXPECT_EQ(c.d_model, g.D);
  EXPECT_EQ(c.n_heads, g.H);
  EXPECT_EQ(c.ffn_dim, g.F);
  EXPECT_EQ(c.n_layers, g.L);
  EXPECT_EQ(int(c.causal), g.causal);

  io::InputFile in(kData + "/" + g.file, c);
  ASSERT_EQ(in.batch(), g.B);
  ASSERT_EQ(in.seq_len(), g.S);
  EXPECT_EQ(in.has_lengths(), g.lengths != "absent");
  EXPECT_EQ(io::to_string(in.x_type()), g.x);
  std::vector<float> x(size_t(g.B) * g.S * g.D);
  std::vector<int32_t> len(size_t(g.B));
  in.read(0, g.B, x.data(), len.data());

  const io::OutputData ref = io::read_output(kData + "/" + g.reference);
  ASSERT_EQ(ref.B, g.B);
  ASSERT_EQ(ref.S, g.S);
  ASSERT_EQ(ref.D, g.D);
  EXPECT_EQ(ref.attributes.at("precision"), "reference-float64");

  const std::vector<double> xd(x.begin(), x.end());
  const std::vector<double> y = naive_forward(m, xd, g.B, g.S, in.has_lengths() ? len : std::vector<int32_t>{});
  // float32 rounding of the reference (half an ulp: 2^-24 relative) plus float64 noise.
  double worst = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double err = std::fabs(double(ref.y[i]) - y[i]);
    const double tol = 0x1.0p-24 * std::fabs(y[i]) * 1.001 + 1e-11;
    worst = std::max(worst, err / tol);
    ASSERT_LE(err, tol) << "at flat index " << i << ": golden " << ref.y[i] << ", naive " << y[i];
  }
  // Padded positions are exactly zero.
  for (int b = 0; b < g.B; ++b)
    for (int s = len[size_t(b)]; s < g.S; ++s)
      for (int d = 0; d < g.D; ++d) ASSERT_EQ(ref.y[(size_t(b) * g.S + s) * g.D + d], 0.0f);
  std::printf("  %-22s worst error / tolerance %.3f\n", g.name.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Goldens, GoldenReference, ::testing::ValuesIn(read_goldens(kData)),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace hk::test
