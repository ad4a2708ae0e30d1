// The Kokkos engine as hk::make_engine hands it out: registration, the plan it explains,
// device text, and argument errors.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "hk/build_config.hpp"
#include "hk/engine.hpp"
#include "hk/error.hpp"
#include "hk/plan.hpp"
#include "hk/synthetic.hpp"
#include "kokkos/engine.hpp"
#include "kokkos_test_util.hpp"

namespace {

using hk::StepKind;

hk::ModelConfig small_config(int layers, bool causal = true) {
  hk::ModelConfig c;
  c.d_model = 20;
  c.n_heads = 4;
  c.ffn_dim = 28;
  c.n_layers = layers;
  c.causal = causal;
  return c;
}

hk::EngineOptions options(hk::Precision p = hk::Precision::fp32, int max_batch = 3, int S = 5) {
  hk::EngineOptions o;
  o.backend = "kokkos";
  o.precision = p;
  o.max_batch = max_batch;
  o.seq_len = S;
  return o;
}

StepKind kind_of(const std::string& s) {
  for (StepKind k : {StepKind::ln1, StepKind::qkv_proj, StepKind::attention, StepKind::out_proj, StepKind::ln2,
                     StepKind::ffn_in, StepKind::ffn_out, StepKind::final_ln})
    if (s == hk::to_string(k)) return k;
  throw std::runtime_error("unknown step name '" + s + "' in explain()");
}

struct ExplainedKernel {
  int layer;  // -1: tail
  std::vector<StepKind> kinds;
  std::string name;
};

// Walks explain()'s lines ("layer 0  out_proj..ln2   hk::...") over forward_steps(L): every
// step must be covered once, in order, by exactly one line.
std::vector<ExplainedKernel> parse_and_check_explain(const std::string& text, int L) {
  const std::vector<hk::Step> steps = hk::forward_steps(L);
  std::vector<ExplainedKernel> out;
  std::istringstream lines(text);
  std::string line;
  size_t at = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    std::istringstream tok(line);
    std::string first, what, name;
    ExplainedKernel k;
    tok >> first;
    if (first == "layer") {
      tok >> k.layer;
    } else {
      EXPECT_EQ(first, "tail") << line;
      k.layer = -1;
    }
    tok >> what >> name;
    EXPECT_FALSE(name.empty()) << line;
    k.name = name;
    const size_t dots = what.find("..");
    const StepKind a = kind_of(what.substr(0, dots));
    const StepKind z = dots == std::string::npos ? a : kind_of(what.substr(dots + 2));
    EXPECT_LT(at, steps.size()) << "more kernels than steps: " << line;
    if (at >= steps.size()) break;
    EXPECT_EQ(steps[at].kind, a) << line;
    EXPECT_EQ(steps[at].layer, k.layer) << line;
    k.kinds.push_back(steps[at].kind);
    if (dots != std::string::npos) {
      do {
        ++at;
        EXPECT_LT(at, steps.size()) << "chain runs past the last step: " << line;
        if (at >= steps.size()) return out;
        k.kinds.push_back(steps[at].kind);
      } while (steps[at].kind != z);
    }
    ++at;
    out.push_back(k);
  }
  EXPECT_EQ(at, steps.size()) << "steps left uncovered:\n" << text;
  return out;
}

class KokkosEngineTest : public ::testing::Test {
 protected:
  void SetUp() override { hk::test::kokkos_runtime(); }
};

TEST_F(KokkosEngineTest, RegisteredAndChosenByName) {
  bool found = false;
  for (const hk::Backend* b : hk::backends()) found |= b->name() == "kokkos" && b->unavailable_reason().empty();
  EXPECT_TRUE(found);
  const hk::Model m = hk::synthetic_model(small_config(1), 1);
  auto e = hk::make_engine(m, options());
  EXPECT_EQ(e->backend(), "kokkos");
#if !HK_HAVE_CUDA
  hk::EngineOptions o = options();
  o.backend = "auto";
  EXPECT_EQ(hk::make_engine(m, o)->backend(), "kokkos") << "auto without CUDA in the build";
#endif
}

TEST_F(KokkosEngineTest, DeviceSaysWhatPrecisionRuns) {
  const hk::Model m = hk::synthetic_model(small_config(1), 1);
  for (hk::Precision p : {hk::Precision::fast, hk::Precision::fp32}) {
    auto e = hk::make_engine(m, options(p));
    EXPECT_EQ(e->precision(), p);
    EXPECT_NE(e->device().find("no reduced-precision arithmetic"), std::string::npos) << e->device();
  }
  auto r = hk::make_engine(m, options(hk::Precision::reference));
  EXPECT_NE(r->device().find("float64"), std::string::npos) << r->device();
}

// Fused: ln1 | qkv_proj..attention | out_proj..ln2 | ffn_in | ffn_out..ln1 (next layer) ... |
// ffn_out..final_ln. Single-step: one kernel per step.
TEST_F(KokkosEngineTest, ExplainCoversEveryStepOnce) {
  for (int L : {1, 3})
    for (bool fuse : {true, false}) {
      SCOPED_TRACE("L " + std::to_string(L) + (fuse ? " fused" : " single-step"));
      const hk::Model m = hk::synthetic_model(small_config(L), 2);
      auto e = hk::kokkos::create_engine(m, options(), hk::kokkos::EngineTuning{fuse});
      const std::string text = e->explain(2);
      const auto kernels = parse_and_check_explain(text, L);
      if (fuse) {
        ASSERT_EQ(kernels.size(), size_t(1 + 4 * L)) << text;
        EXPECT_EQ(kernels[0].name, "hk::layer_norm[kokkos]");
        EXPECT_EQ(kernels[1].name, "hk::qkv_attention[kokkos]");
        EXPECT_EQ(kernels[2].name, "hk::linear_add_layer_norm[kokkos]");
        EXPECT_EQ(kernels[3].name, "hk::linear_gelu[kokkos]");
        EXPECT_EQ(kernels.back().name, "hk::linear_final_layer_norm[kokkos]");
        EXPECT_EQ(kernels.back().kinds, (std::vector<StepKind>{StepKind::ffn_out, StepKind::final_ln}));
        if (L > 1) EXPECT_EQ(kernels[4].kinds, (std::vector<StepKind>{StepKind::ffn_out, StepKind::ln1}));
      } else {
        EXPECT_EQ(kernels.size(), hk::forward_steps(L).size()) << text;
        for (const auto& k : kernels) EXPECT_EQ(k.kinds.size(), 1u) << k.name;
      }
      EXPECT_EQ(e->explain(1), e->explain(3)) << "the plan does not depend on B here";
    }
}

TEST_F(KokkosEngineTest, BatchOutsideOneToMaxBatchThrows) {
  const hk::Model m = hk::synthetic_model(small_config(1), 3);
  auto e = hk::make_engine(m, options(hk::Precision::fp32, 3, 5));
  std::vector<float> x(4 * 5 * 20, 0.5f), y(x.size());
  EXPECT_THROW(e->forward(x.data(), nullptr, 4, y.data()), hk::Error);
  EXPECT_THROW(e->forward(x.data(), nullptr, 0, y.data()), hk::Error);
  EXPECT_THROW(e->forward(x.data(), nullptr, -1, y.data()), hk::Error);
  EXPECT_THROW(e->explain(4), hk::Error);
  EXPECT_NO_THROW(e->forward(x.data(), nullptr, 3, y.data()));
}

TEST_F(KokkosEngineTest, BadLengthsAndPointersThrow) {
  const hk::Model m = hk::synthetic_model(small_config(1), 3);
  auto e = hk::make_engine(m, options(hk::Precision::fp32, 2, 5));
  std::vector<float> x(2 * 5 * 20, 0.5f), y(x.size());
  const std::vector<int32_t> too_long = {5, 6}, negative = {-1, 2};
  EXPECT_THROW(e->forward(x.data(), too_long.data(), 2, y.data()), hk::Error);
  EXPECT_THROW(e->forward(x.data(), negative.data(), 2, y.data()), hk::Error);
  EXPECT_THROW(e->forward(nullptr, nullptr, 2, y.data()), hk::Error);
  EXPECT_THROW(e->forward(x.data(), nullptr, 2, nullptr), hk::Error);
}

TEST_F(KokkosEngineTest, BadBackendNameAndOptionsThrow) {
  const hk::Model m = hk::synthetic_model(small_config(1), 3);
  hk::EngineOptions o = options();
  o.backend = "kokkos-typo";
  try {
    hk::make_engine(m, o);
    FAIL() << "an unknown backend name must throw";
  } catch (const hk::Error& err) {
    EXPECT_NE(std::string(err.what()).find("unknown backend"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("kokkos"), std::string::npos) << "lists the known backends";
  }
  o = options();
  o.max_batch = 0;
  EXPECT_THROW(hk::make_engine(m, o), hk::Error);
  EXPECT_THROW(hk::kokkos::create_engine(m, o), hk::Error);
  o = options();
  o.seq_len = 0;
  EXPECT_THROW(hk::kokkos::create_engine(m, o), hk::Error);
}

TEST_F(KokkosEngineTest, InconsistentModelThrows) {
  hk::Model m = hk::synthetic_model(small_config(2), 3);
  m.layers[1].ffn_in_w.pop_back();
  EXPECT_THROW(hk::kokkos::create_engine(m, options()), hk::Error);
  hk::Model m2 = hk::synthetic_model(small_config(2), 3);
  m2.config.n_heads = 3;  // 20 % 3 != 0
  EXPECT_THROW(hk::kokkos::create_engine(m2, options()), hk::Error);
  hk::Model m3 = hk::synthetic_model(small_config(2), 3);
  m3.layers.pop_back();
  EXPECT_THROW(hk::kokkos::create_engine(m3, options()), hk::Error);
}

}  // namespace
