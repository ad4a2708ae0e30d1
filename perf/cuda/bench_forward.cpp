// Google Benchmark suite of the CUDA forward, one benchmark per case of cases.csv.
//
// Each benchmark builds the case's synthetic model (MODEL.md's distribution), uploads several
// input sets (rotated so that the input is not L2-resident across replays when it fits in L2),
// prepares the engine (plans, warm-up, graph capture) outside the timed region, then enqueues
// `reps` forwards back to back, each between two CUDA events, and reports the median as the
// iteration time (manual time). Counters: tokens/s, TFLOP/s and TB/s against the dense floor
// counts of perf/device/summarize.py, plus min/p90.
//
// Usage: hk_bench_cuda [--cases path/cases.csv] [--only 1,2,6] [--precision fast|fp32]
//                      [--reps N] [google benchmark flags]
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/engine.hpp"
#include "hk/synthetic.hpp"

namespace {

struct Case {
  int id, B, S, D, H, F, L;
  bool causal;
};

std::vector<Case> read_cases(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open cases file " + path);
  std::vector<Case> out;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::stringstream ss(line);
    std::string f[8];
    for (auto& s : f) std::getline(ss, s, ',');
    out.push_back({std::stoi(f[0]), std::stoi(f[1]), std::stoi(f[2]), std::stoi(f[3]), std::stoi(f[4]),
                   std::stoi(f[5]), std::stoi(f[6]), std::stoi(f[7]) != 0});
  }
  return out;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

int g_reps = 0;  // 0: adaptive
hk::Precision g_precision = hk::Precision::fast;

void bench_case(benchmark::State& state, Case c) {
  hk::ModelConfig cfg;
  cfg.d_model = c.D;
  cfg.n_heads = c.H;
  cfg.n_layers = c.L;
  cfg.ffn_dim = c.F;
  cfg.causal = c.causal;
  const hk::Model model = hk::synthetic_model(cfg, 1000 + c.id);
  hk::EngineOptions opt;
  opt.backend = "cuda";
  opt.precision = g_precision;
  opt.max_batch = c.B;
  opt.seq_len = c.S;
  hk::cuda::CudaEngine engine(model, opt);

  const size_t n = size_t(c.B) * c.S * c.D;
  const size_t x_bytes = n * sizeof(float);
  int l2 = 0;
  check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0), "L2 size");
  const int sets = int(std::clamp<size_t>((2 * size_t(l2) + x_bytes - 1) / x_bytes, 1, 8));
  std::vector<float*> xs(sets);
  std::vector<int32_t*> lens(sets);
  for (int i = 0; i < sets; ++i) {
    const auto x = hk::synthetic_input(c.B, c.S, c.D, 7000 + 31 * i + c.id);
    const auto len = hk::synthetic_lengths(c.B, c.S, 9000 + 17 * i + c.id);
    check(cudaMalloc(&xs[i], x_bytes), "cudaMalloc x");
    check(cudaMalloc(&lens[i], c.B * sizeof(int32_t)), "cudaMalloc lengths");
    check(cudaMemcpy(xs[i], x.data(), x_bytes, cudaMemcpyHostToDevice), "upload x");
    check(cudaMemcpy(lens[i], len.data(), c.B * sizeof(int32_t), cudaMemcpyHostToDevice), "upload lengths");
  }
  cudaStream_t stream = engine.stream();
  // Warm-up: plans, graph captures for every pointer set (both output buffers), clocks up.
  for (int w = 0; w < 3; ++w)
    for (int i = 0; i < sets; ++i) engine.forward_device(xs[i], lens[i], c.B, stream);
  check(cudaStreamSynchronize(stream), "warm-up");

  cudaEvent_t probe0, probe1;
  check(cudaEventCreate(&probe0), "event");
  check(cudaEventCreate(&probe1), "event");
  check(cudaEventRecord(probe0, stream), "record");
  engine.forward_device(xs[0], lens[0], c.B, stream);
  check(cudaEventRecord(probe1, stream), "record");
  check(cudaEventSynchronize(probe1), "sync");
  float est_ms = 0;
  check(cudaEventElapsedTime(&est_ms, probe0, probe1), "elapsed");
  const int reps = g_reps > 0 ? g_reps : int(std::clamp(500.0 / std::max(est_ms, 1e-3f), 20.0, 2000.0));

  std::vector<cudaEvent_t> ev(2 * size_t(reps));
  for (auto& e : ev) check(cudaEventCreate(&e), "event");
  std::vector<double> ms(reps);
  for (auto _ : state) {
    for (int r = 0; r < reps; ++r) {
      check(cudaEventRecord(ev[2 * r], stream), "record");
      engine.forward_device(xs[r % sets], lens[r % sets], c.B, stream);
      check(cudaEventRecord(ev[2 * r + 1], stream), "record");
    }
    check(cudaStreamSynchronize(stream), "timed replays");
    for (int r = 0; r < reps; ++r) {
      float t = 0;
      check(cudaEventElapsedTime(&t, ev[2 * r], ev[2 * r + 1]), "elapsed");
      ms[r] = t;
    }
    std::sort(ms.begin(), ms.end());
    state.SetIterationTime(ms[reps / 2] * 1e-3);
  }
  const double med = ms[reps / 2] * 1e-3;
  const double T = double(c.B) * c.S;
  const double flops = c.L * (2.0 * T * (4.0 * c.D * c.D + 2.0 * c.D * c.F) +
                              4.0 * c.B * double(c.S) * c.S * c.D * (c.causal ? 0.5 : 1.0));
  const double bytes = 8.0 * T * c.D + c.L * 2.0 * (4.0 * c.D * c.D + 2.0 * c.D * c.F);
  state.counters["tokens_per_s"] = T / med;
  state.counters["TFLOPs"] = flops / med / 1e12;
  state.counters["TBps"] = bytes / med / 1e12;
  state.counters["min_ms"] = ms.front();
  state.counters["p90_ms"] = ms[size_t(reps * 0.9)];
  state.counters["reps"] = reps;
  state.counters["input_sets"] = sets;
  state.SetLabel(engine.device());

  for (auto& e : ev) cudaEventDestroy(e);
  cudaEventDestroy(probe0);
  cudaEventDestroy(probe1);
  for (int i = 0; i < sets; ++i) {
    cudaFree(xs[i]);
    cudaFree(lens[i]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string cases_path = "cases.csv", only;
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(std::string(flag) + " needs a value");
      return argv[++i];
    };
    if (a == "--cases") cases_path = value("--cases");
    else if (a == "--only") only = value("--only");
    else if (a == "--reps") g_reps = std::stoi(value("--reps"));
    else if (a == "--precision") g_precision = hk::precision_from_string(value("--precision"));
    else rest.push_back(argv[i]);
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "hk_bench_cuda: no CUDA device\n");
    return 77;
  }
  for (const Case& c : read_cases(cases_path)) {
    if (!only.empty() && ("," + only + ",").find("," + std::to_string(c.id) + ",") == std::string::npos) continue;
    const std::string name = "forward/case:" + std::to_string(c.id) + "/B:" + std::to_string(c.B) +
                             "/S:" + std::to_string(c.S) + "/D:" + std::to_string(c.D) + "/H:" +
                             std::to_string(c.H) + "/" + hk::to_string(g_precision);
    benchmark::RegisterBenchmark(name.c_str(), bench_case, c)
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  int n = int(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
