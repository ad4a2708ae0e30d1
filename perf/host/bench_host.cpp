// hk_bench_host: times the Kokkos backend's forward (hk::make_engine, backend "kokkos") on the
// cases of cases.csv, with MODEL.md's standard synthetic inputs.
//
// Batches are scaled to a small host: at most 8192 tokens per forward (1024 when d_model > 256,
// where the GEMMs grow with D^2); a benchmark's name states the B it runs and the case's own B
// when they differ ("case6/B64_of_10000/..."). Manual timing around forward(), which returns
// after a fence; items/s is tokens/s; "GFLOP/s" counts the nominal GEMM and attention work
// (all positions valid, causal halving the score matrix).
//
//   hk_bench_host [--hk_cases=path/cases.csv] [--hk_precision=fp32|fast|reference]
//                 [google benchmark flags, e.g. --benchmark_filter='^case(1|2|4|9)/']
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "hk/engine.hpp"
#include "hk/error.hpp"
#include "hk/synthetic.hpp"

namespace {

struct Case {
  int id, B, S, D, H, F, L;
  bool causal;
};

std::vector<Case> read_cases(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw hk::Error("hk_bench_host: cannot open " + path);
  std::vector<Case> cases;
  std::string line;
  std::getline(in, line);  // header: case,B,S,D,H,F,L,causal,note
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream s(line);
    Case c{};
    char comma;
    int causal = 0;
    if (!(s >> c.id >> comma >> c.B >> comma >> c.S >> comma >> c.D >> comma >> c.H >> comma >> c.F >> comma >>
          c.L >> comma >> causal))
      throw hk::Error("hk_bench_host: bad line in " + path + ": " + line);
    c.causal = causal != 0;
    cases.push_back(c);
  }
  return cases;
}

int host_batch(const Case& c) {
  const int64_t tokens = c.D > 256 ? 1024 : 8192;
  const int64_t b = tokens / c.S;
  return int(b < 1 ? 1 : (b < c.B ? b : c.B));
}

double nominal_flops(const Case& c, int B) {
  const double T = double(B) * c.S, D = c.D, F = c.F;
  const double gemm = 2.0 * T * (4.0 * D * D + 2.0 * D * F);
  const double pairs = c.causal ? double(c.S) * (c.S + 1) / 2.0 : double(c.S) * c.S;
  const double attn = 4.0 * B * c.H * pairs * (D / c.H);
  return c.L * (gemm + attn);
}

void run_case(benchmark::State& state, Case c, int B, hk::Precision precision) {
  hk::ModelConfig cfg;
  cfg.d_model = c.D;
  cfg.n_heads = c.H;
  cfg.ffn_dim = c.F;
  cfg.n_layers = c.L;
  cfg.causal = c.causal;
  const hk::Model model = hk::synthetic_model(cfg, 1000 + c.id);
  const auto x = hk::synthetic_input(B, c.S, c.D, 2000 + c.id);
  const auto lengths = hk::synthetic_lengths(B, c.S, 3000 + c.id);
  std::vector<float> y(x.size());
  hk::EngineOptions o;
  o.backend = "kokkos";
  o.precision = precision;
  o.max_batch = B;
  o.seq_len = c.S;
  std::unique_ptr<hk::Engine> e;
  try {
    e = hk::make_engine(model, o);
    e->forward(x.data(), lengths.data(), B, y.data());  // warm-up: first touch of every buffer
  } catch (const std::exception& err) {
    state.SkipWithError(err.what());
    return;
  }
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    e->forward(x.data(), lengths.data(), B, y.data());
    const auto t1 = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * B * c.S);
  state.counters["GFLOP/s"] =
      benchmark::Counter(nominal_flops(c, B) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["B"] = B;
  state.SetLabel(e->device());
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv = HK_DEFAULT_CASES_CSV;
  if (const char* env = std::getenv("HK_CASES_CSV")) csv = env;
  hk::Precision precision = hk::Precision::fp32;
  std::vector<char*> rest;
  try {
    for (int i = 0; i < argc; ++i) {
      const std::string a = argv[i];
      if (a.rfind("--hk_cases=", 0) == 0)
        csv = a.substr(11);
      else if (a.rfind("--hk_precision=", 0) == 0)
        precision = hk::precision_from_string(a.substr(15));
      else
        rest.push_back(argv[i]);
    }
    for (const Case& c : read_cases(csv)) {
      const int B = host_batch(c);
      std::string name = "case" + std::to_string(c.id) + "/B" + std::to_string(B);
      if (B != c.B) name += "_of_" + std::to_string(c.B);
      name += "/S" + std::to_string(c.S) + "/D" + std::to_string(c.D) + "/H" + std::to_string(c.H) + "/F" +
              std::to_string(c.F) + "/L" + std::to_string(c.L) + (c.causal ? "/causal" : "/bidir");
      benchmark::RegisterBenchmark(name.c_str(), run_case, c, B, precision)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  int n = int(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
