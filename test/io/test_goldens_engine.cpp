// Every golden of data/goldens.csv through hk::make_engine on one backend, in every precision:
//   reference  float64 end to end: within one float32 ulp of the golden (both round a float64
//              result of the same formulas to float32),
//   fp32       max abs error <= 1e-4 (MODEL.md),
//   fast       the accuracy budget |y - ref| <= max(2e-3, 0.02 |ref|) (MODEL.md).
// usage: hk_golden_test <backend> [gtest flags]; exits 77 (skipped) when the backend cannot run here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>

#include "goldens.hpp"
#include "hk/engine.hpp"
#include "hk/error.hpp"
#include "hk/io/io.hpp"
#include "naive_forward.hpp"

namespace hk::test {
namespace {

// The data directory: $HK_DATA_DIR (the device script points it at a copy), else the source tree.
const std::string kData = [] {
  const char* env = std::getenv("HK_DATA_DIR");
  return std::string(env && *env ? env : HK_DATA_DIR);
}();
std::string g_backend = "kokkos";

struct Run {
  Golden golden;
  Precision precision;
};

std::vector<Run> all_runs() {
  std::vector<Run> out;
  for (const Golden& g : read_goldens(kData))
    for (Precision p : {Precision::reference, Precision::fp32, Precision::fast}) out.push_back({g, p});
  return out;
}

class GoldenEngine : public ::testing::TestWithParam<Run> {};

TEST_P(GoldenEngine, WithinItsPrecisionBudget) {
  const Golden& g = GetParam().golden;
  const Precision p = GetParam().precision;
  SCOPED_TRACE(g.name + " (" + g.exercises + "), " + g_backend + " " + to_string(p));
  const Model m = io::read_model(kData + "/" + g.file);
  io::InputFile in(kData + "/" + g.file, m.config);
  std::vector<float> x(size_t(g.B) * g.S * g.D), y(x.size(), std::nanf(""));  // poisoned output
  std::vector<int32_t> len(size_t(g.B));
  in.read(0, g.B, x.data(), len.data());
  const io::OutputData ref = io::read_output(kData + "/" + g.reference);
  ASSERT_EQ(ref.y.size(), y.size());

  EngineOptions o;
  o.backend = g_backend;
  o.precision = p;
  o.max_batch = g.B;
  o.seq_len = g.S;
  if (p == Precision::reference && g_backend != "kokkos") {
    // float64 is the host backend's test mode; other backends refuse it with a clear error.
    EXPECT_THROW(make_engine(m, o), Error);
    return;
  }
  std::unique_ptr<Engine> e = make_engine(m, o);
  e->forward(x.data(), in.has_lengths() ? len.data() : nullptr, g.B, y.data());

  double max_abs = 0, worst_ratio = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_TRUE(std::isfinite(y[i])) << "non-finite (or unwritten) output at flat index " << i;
    const double r = ref.y[i], err = std::fabs(double(y[i]) - r);
    double tol;
    switch (p) {
      case Precision::reference: tol = 0x1.0p-22 * std::fabs(r) + 1e-10; break;  // one ulp, with margin
      case Precision::fp32: tol = 1e-4; break;
      default: tol = std::max(2e-3, 0.02 * std::fabs(r)); break;
    }
    max_abs = std::max(max_abs, err);
    if (err / tol > worst_ratio) {
      worst_ratio = err / tol;
      worst_at = i;
    }
  }
  for (int b = 0; b < g.B; ++b)
    for (int s = len[size_t(b)]; s < g.S; ++s)
      for (int d = 0; d < g.D; ++d) ASSERT_EQ(y[(size_t(b) * g.S + s) * g.D + d], 0.0f) << "padded [" << b << ", " << s << "]";
  std::printf("  %-22s %-9s max |err| %.3e   worst err/tol %.3f\n", g.name.c_str(), to_string(p), max_abs, worst_ratio);
  EXPECT_LE(worst_ratio, 1.0) << "worst at flat index " << worst_at << ": y " << y[worst_at] << ", golden "
                              << ref.y[worst_at];
}

INSTANTIATE_TEST_SUITE_P(Goldens, GoldenEngine, ::testing::ValuesIn(all_runs()), [](const auto& info) {
  return info.param.golden.name + "_" + to_string(info.param.precision);
});

}  // namespace
}  // namespace hk::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) hk::test::g_backend = argv[1];
  for (const hk::Backend* b : hk::backends())
    if (b->name() == hk::test::g_backend) {
      const std::string why = b->unavailable_reason();
      if (!why.empty()) {
        std::printf("hk_golden_test: backend %s cannot run here (%s): skipped\n", b->name().c_str(), why.c_str());
        return 77;
      }
      return RUN_ALL_TESTS();
    }
  std::printf("hk_golden_test: backend %s is not in this build: skipped\n", hk::test::g_backend.c_str());
  return 77;
}
