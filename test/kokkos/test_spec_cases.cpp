// Every row of data/cases.csv (the scoring matrix) generated with the standard synthetic
// distribution and run on the Kokkos backend, with the batch cut to two sequences so that the
// float64 naive reference stays quick: fp32 within 1e-4 and fast within MODEL.md's budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "hk/engine.hpp"
#include "hk/synthetic.hpp"
#include "kokkos_test_util.hpp"
#include "naive_forward.hpp"

namespace {

struct SpecCase {
  int id, B, S, D, H, F, L;
  bool causal;
};

std::vector<SpecCase> read_cases() {
  std::ifstream in(std::string(HK_DATA_DIR) + "/cases.csv");
  std::vector<SpecCase> out;
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::stringstream ss(line);
    std::string f[8];
    for (auto& v : f) std::getline(ss, v, ',');
    out.push_back({std::stoi(f[0]), std::stoi(f[1]), std::stoi(f[2]), std::stoi(f[3]), std::stoi(f[4]),
                   std::stoi(f[5]), std::stoi(f[6]), std::stoi(f[7]) != 0});
  }
  return out;
}

class SpecCases : public ::testing::TestWithParam<SpecCase> {
 protected:
  void SetUp() override { hk::test::kokkos_runtime(); }
};

TEST_P(SpecCases, TwoSequencesMeetTheBudget) {
  const SpecCase c = GetParam();
  hk::ModelConfig cfg;
  cfg.d_model = c.D;
  cfg.n_heads = c.H;
  cfg.ffn_dim = c.F;
  cfg.n_layers = c.L;
  cfg.causal = c.causal;
  const int B = 2, S = c.S;
  const hk::Model model = hk::synthetic_model(cfg, 500 + c.id);
  const auto x = hk::synthetic_input(B, S, c.D, 600 + c.id);
  const auto len = hk::synthetic_lengths(B, S, 700 + c.id);
  const auto ref = hk::test::naive_forward(model, std::vector<double>(x.begin(), x.end()), B, S, len);
  for (hk::Precision p : {hk::Precision::fp32, hk::Precision::fast}) {
    hk::EngineOptions o;
    o.backend = "kokkos";
    o.precision = p;
    o.max_batch = B;
    o.seq_len = S;
    auto e = hk::make_engine(model, o);
    std::vector<float> y(x.size(), std::numeric_limits<float>::quiet_NaN());
    e->forward(x.data(), len.data(), B, y.data());
    if (p == hk::Precision::fp32) {
      double worst = 0;
      for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::fabs(double(y[i]) - ref[i]));
      EXPECT_LE(worst, 1e-4) << "case " << c.id << " fp32";
    } else {
      EXPECT_LE(hk::test::budget_ratio(y.data(), ref), 1.0) << "case " << c.id << " fast";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CasesCsv, SpecCases, ::testing::ValuesIn(read_cases()),
                         [](const ::testing::TestParamInfo<SpecCase>& i) { return "case" + std::to_string(i.param.id); });

}  // namespace
