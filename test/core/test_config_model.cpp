// config.hpp, model.hpp and synthetic.hpp: validation errors, precision names, the parameter
// list of MODEL.md, and the seeded generator's distributions.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "hk/config.hpp"
#include "hk/error.hpp"
#include "hk/model.hpp"
#include "hk/synthetic.hpp"

namespace {

hk::ModelConfig valid_config() {
  hk::ModelConfig c;
  c.d_model = 24;
  c.n_heads = 3;
  c.n_layers = 2;
  c.ffn_dim = 40;
  return c;
}

TEST(ModelConfig, ValidPassesAndHeadDim) {
  const auto c = valid_config();
  EXPECT_NO_THROW(c.validate("test"));
  EXPECT_EQ(c.head_dim(), 8);
}

TEST(ModelConfig, EachInvalidFieldThrowsNamingTheCaller) {
  auto expect_bad = [](hk::ModelConfig c, const std::string& what) {
    try {
      c.validate("where");
      ADD_FAILURE() << what << " must be rejected";
    } catch (const hk::Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("where: ", 0), 0u) << e.what();
    }
  };
  auto c = valid_config();
  c.d_model = 0;
  expect_bad(c, "d_model 0");
  c = valid_config();
  c.n_heads = -1;
  expect_bad(c, "negative heads");
  c = valid_config();
  c.n_heads = 5;
  expect_bad(c, "D % H != 0");
  c = valid_config();
  c.n_layers = 0;
  expect_bad(c, "no layers");
  c = valid_config();
  c.ffn_dim = 0;
  expect_bad(c, "F 0");
  c = valid_config();
  c.eps = 0.0;
  expect_bad(c, "eps 0");
  c = valid_config();
  c.eps = 2.0;
  expect_bad(c, "eps > 1");
  c = valid_config();
  c.eps = std::nan("");
  expect_bad(c, "eps NaN");
  c = valid_config();
  c.d_model = 30000;
  c.n_heads = 1;
  expect_bad(c, "3 D^2 beyond 2^31");
}

TEST(Precision, NamesRoundTripAndUnknownThrows) {
  for (hk::Precision p : {hk::Precision::fast, hk::Precision::fp32, hk::Precision::reference})
    EXPECT_EQ(hk::precision_from_string(hk::to_string(p)), p);
  EXPECT_THROW(hk::precision_from_string("fp16"), hk::Error);
  EXPECT_THROW(hk::precision_from_string(""), hk::Error);
}

TEST(Model, ParametersFollowModelMdNamesAndShapes) {
  const auto c = valid_config();
  hk::Model m = hk::Model::allocate(c);
  const auto params = m.parameters();
  ASSERT_EQ(params.size(), size_t(16 * c.n_layers + 2));
  EXPECT_EQ(params[0].name, "layers.0.norm1.weight");
  EXPECT_EQ(params[2].name, "layers.0.attn.q_proj.weight");
  EXPECT_EQ(params[2].shape, (std::vector<int64_t>{24, 24}));
  EXPECT_EQ(params[12].name, "layers.0.ffn_in.weight");
  EXPECT_EQ(params[12].shape, (std::vector<int64_t>{40, 24}));
  EXPECT_EQ(params[14].name, "layers.0.ffn_out.weight");
  EXPECT_EQ(params[14].shape, (std::vector<int64_t>{24, 40}));
  EXPECT_EQ(params[16].name, "layers.1.norm1.weight");
  EXPECT_EQ(params.back().name, "final_norm.bias");
  std::set<std::string> names;
  int64_t total = 0;
  for (const auto& p : params) {
    EXPECT_TRUE(names.insert(p.name).second) << "duplicate " << p.name;
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    EXPECT_EQ(int64_t(p.values->size()), n) << p.name;
    for (double v : *p.values) EXPECT_EQ(v, 0.0) << p.name << " is zero-filled";
    total += n;
  }
  EXPECT_EQ(total, m.parameter_count());
}

TEST(Synthetic, SeededAndDistributedAsModelMdSays) {
  const auto c = valid_config();
  const hk::Model a = hk::synthetic_model(c, 7), b = hk::synthetic_model(c, 7), d = hk::synthetic_model(c, 8);
  EXPECT_EQ(a.layers[1].q_w, b.layers[1].q_w) << "same seed, same model";
  EXPECT_NE(a.layers[1].q_w, d.layers[1].q_w);
  for (double v : a.layers[0].norm1_w) EXPECT_EQ(v, 1.0);
  for (double v : a.layers[0].norm2_b) EXPECT_EQ(v, 0.0);
  const double bound_d = 1.0 / std::sqrt(24.0), bound_f = 1.0 / std::sqrt(40.0);
  for (double v : a.layers[0].k_w) EXPECT_LE(std::fabs(v), bound_d);
  for (double v : a.layers[0].ffn_out_w) EXPECT_LE(std::fabs(v), bound_f) << "ffn_out's fan_in is F";
  const hk::Model n = hk::synthetic_model(c, 7, /*nontrivial_ln=*/true);
  for (double v : n.final_norm_w) EXPECT_TRUE(v >= 0.5 && v <= 1.5);
  for (double v : n.final_norm_b) EXPECT_TRUE(v >= -0.5 && v <= 0.5);

  const auto x = hk::synthetic_input(4, 16, 24, 3);
  ASSERT_EQ(x.size(), size_t(4 * 16 * 24));
  double mean = 0, sq = 0;
  for (float v : x) {
    mean += v;
    sq += double(v) * v;
  }
  mean /= double(x.size());
  sq /= double(x.size());
  EXPECT_LT(std::fabs(mean), 0.1);
  EXPECT_NEAR(sq, 1.0, 0.15) << "x ~ N(0, 1)";
  const auto len = hk::synthetic_lengths(200, 16, 3);
  std::set<int> seen;
  for (int32_t l : len) {
    EXPECT_GE(l, 1);
    EXPECT_LE(l, 16);
    seen.insert(l);
  }
  EXPECT_EQ(seen.size(), 16u) << "lengths ~ U{1..S}";
}

}  // namespace
