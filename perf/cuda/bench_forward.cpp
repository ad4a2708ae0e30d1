// Google Benchmark suite of the CUDA forward, one benchmark per case of cases.csv.
//
// Each benchmark builds the case's synthetic model (MODEL.md's distribution), uploads several
// input sets (rotated so that the input is not L2-resident across replays when it fits in L2),
// prepares the engine (plans, warm-up, graph capture) outside the timed region, then enqueues
// `reps` forwards back to back, each between two CUDA events, and reports the median as the
// iteration time (manual time). Counters: tokens/s, TFLOP/s and TB/s against the dense floor
// counts of perf/device/summarize.py, plus min/p90. The engine is told each input set's valid
// token count (as hk_forward's host path knows it), so padding-free plans are used where the
// engine picks them (HK_PACK); `--lengths full` runs every sequence at full length instead of
// MODEL.md's random lengths (counter plan_rows shows the rows a plan ran on).
//
// Measured dispatch (--tune): `env` (default) builds engines from the environment (HK_TUNE etc.);
// `off` / `on` force untuned / tuned engines; `both` registers two benchmarks per case,
// ".../untuned" (HK_TUNE=0: every route its default) and ".../tuned", in one process, and prints
// a side-by-side table with the geometric-mean gain at the end. Tuned engines use the tune cache
// in --tune-cache DIR (default: a fresh directory per process, so the first engine measures).
// Counters: startup_ms = wall time of the engine's first forward (planning, tuning, warm-up,
// capture); for tuned engines also decisions_measured, measure_ms, and cached_startup_ms /
// decisions_cached of a second engine made afterwards with the same cache (a second run).
//
// Usage: hk_bench_cuda [--cases path/cases.csv] [--only 1,2,6] [--precision fast|fp32]
//                      [--reps N] [--tune env|off|on|both] [--tune-cache DIR]
//                      [--lengths random|full] [--plans FILE] [--timeline FILE]
//                      [google benchmark flags]
// --plans FILE: each case's plan as it ran (explain of the plan used: kernels, GEMM algorithms,
// every decision with its candidates' times) is appended to FILE; where input sets of other token
// counts run other plans, each of them, with the sets that run it.
// --timeline FILE: kernel tracing through CUPTI (kernel_timeline.hpp) is on for the whole run; after
// each case's timed replays, 50 more forwards back to back are collected and the case's kernel
// timeline (per kernel: duration, start and end in the forward, the time it adds to the forward's
// span) is appended to FILE with the event-timed medians. Tracing may perturb the times a little:
// compare with a run without it. Needs libcupti at run time.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cuda/engine.hpp"
#include "hk/synthetic.hpp"
#ifdef HK_HAVE_CUPTI
#include "kernel_timeline.hpp"
#endif

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
bool g_full = false;  // --lengths full: every sequence at full length (no padding to skip)
hk::Precision g_precision = hk::Precision::fast;
std::string g_tune_cache;
std::string g_plans;  // --plans FILE
std::string g_timeline;  // --timeline FILE
#ifdef HK_HAVE_CUPTI
hk::perf::KernelTimeline& timeline_tracer() {
  static hk::perf::KernelTimeline t;
  return t;
}
#endif

enum class Tune { env, off, on };
struct Result {
  double ms = 0, startup_ms = 0, cached_startup_ms = 0, measure_ms = 0;
  int measured = 0, cached = 0;
};
std::map<int, std::map<std::string, Result>> g_results;  // case -> "untuned"/"tuned" -> result

hk::cuda::Routes routes_for(Tune t) {
  hk::cuda::Routes r = hk::cuda::routes_from_environment();
  if (t == Tune::off) r.tune = false;
  if (t == Tune::on) {
    r.tune = true;
    r.tune_cache_dir = g_tune_cache;
  }
  return r;
}

double wall_ms(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void bench_case(benchmark::State& state, Case c, Tune tune) {
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
  const hk::cuda::Routes routes = routes_for(tune);
  auto engine_ptr = std::make_unique<hk::cuda::CudaEngine>(model, opt, routes);
  hk::cuda::CudaEngine& engine = *engine_ptr;

  const size_t n = size_t(c.B) * c.S * c.D;
  const size_t x_bytes = n * sizeof(float);
  int l2 = 0;
  check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0), "L2 size");
  const int sets = int(std::clamp<size_t>((2 * size_t(l2) + x_bytes - 1) / x_bytes, 1, 8));
  std::vector<float*> xs(sets);
  std::vector<int32_t*> lens(sets);
  std::vector<int64_t> tokens(sets);  // valid tokens per input set: allows padding-free plans
  for (int i = 0; i < sets; ++i) {
    const auto x = hk::synthetic_input(c.B, c.S, c.D, 7000 + 31 * i + c.id);
    auto len = hk::synthetic_lengths(c.B, c.S, 9000 + 17 * i + c.id);
    if (g_full) std::fill(len.begin(), len.end(), c.S);
    tokens[i] = 0;
    for (int32_t l : len) tokens[i] += l;
    check(cudaMalloc(&xs[i], x_bytes), "cudaMalloc x");
    check(cudaMalloc(&lens[i], c.B * sizeof(int32_t)), "cudaMalloc lengths");
    check(cudaMemcpy(xs[i], x.data(), x_bytes, cudaMemcpyHostToDevice), "upload x");
    check(cudaMemcpy(lens[i], len.data(), c.B * sizeof(int32_t), cudaMemcpyHostToDevice), "upload lengths");
  }
  cudaStream_t stream = engine.stream();
  // The first forward: planning and (tuned) measuring every route decision, warm-up, capture.
  auto t_first = std::chrono::steady_clock::now();
  engine.forward_device(xs[0], lens[0], c.B, stream, tokens[0]);
  check(cudaStreamSynchronize(stream), "first forward");
  const double startup_ms = wall_ms(t_first);
  const hk::cuda::TuneReport first = engine.tune_report(c.B);
  // Warm-up: graph captures for every pointer set (both output buffers), clocks up.
  for (int w = 0; w < 3; ++w)
    for (int i = 0; i < sets; ++i) engine.forward_device(xs[i], lens[i], c.B, stream, tokens[i]);
  check(cudaStreamSynchronize(stream), "warm-up");

  cudaEvent_t probe0, probe1;
  check(cudaEventCreate(&probe0), "event");
  check(cudaEventCreate(&probe1), "event");
  check(cudaEventRecord(probe0, stream), "record");
  engine.forward_device(xs[0], lens[0], c.B, stream, tokens[0]);
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
      engine.forward_device(xs[r % sets], lens[r % sets], c.B, stream, tokens[r % sets]);
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
  state.counters["plan_rows"] = double(engine.plan_rows(c.B, tokens[0]));
  state.counters["valid_tokens"] = double(tokens[0]);
  state.counters["startup_ms"] = startup_ms;
  Result res;
  res.ms = ms[reps / 2];
  res.startup_ms = startup_ms;
  if (routes.tune) {
    state.counters["decisions_measured"] = first.measured;
    state.counters["measure_ms"] = first.measure_ms;
    res.measured = first.measured;
    res.measure_ms = first.measure_ms;
  }
  state.SetLabel(engine.device() + (routes.tune ? ", tuned" : ", untuned"));
  if (!g_plans.empty()) {
    // Input sets of other token counts may run other plans: each set's forward once, its plan's
    // explain kept, sets with the same plan listed together.
    std::vector<std::pair<std::string, std::string>> plans;  // explain, "set i (T tokens)" list
    for (int i = 0; i < sets; ++i) {
      engine.forward_device(xs[i], lens[i], c.B, stream, tokens[i]);
      check(cudaStreamSynchronize(stream), "plan report");
      const std::string text = engine.explain_last(c.B);
      const std::string who = "set " + std::to_string(i) + " (" + std::to_string(tokens[i]) + " tokens)";
      auto it = std::find_if(plans.begin(), plans.end(), [&](const auto& q) { return q.first == text; });
      if (it == plans.end()) {
        plans.emplace_back(text, who);
      } else {
        it->second += ", " + who;
      }
    }
    if (std::FILE* f = std::fopen(g_plans.c_str(), "a")) {
      std::fprintf(f, "==== case %d (%s, %s lengths): %.4f ms\n", c.id, routes.tune ? "tuned" : "untuned",
                   g_full ? "full" : "random", ms[reps / 2]);
      for (size_t k = 0; k < plans.size(); ++k) {
        if (plans.size() > 1) std::fprintf(f, "-- plan %zu of %zu: input %s\n", k + 1, plans.size(), plans[k].second.c_str());
        std::fprintf(f, "%s\n", plans[k].first.c_str());
      }
      std::fclose(f);
    }
  }

  if (!g_timeline.empty()) {
#ifdef HK_HAVE_CUPTI
    std::string text;
    try {
      hk::perf::KernelTimeline& tracer = timeline_tracer();
      if (!tracer.available()) throw std::runtime_error(tracer.error());
      // Each input set's forward alone: how many kernels it runs (sets of other token counts may run
      // other plans); then forwards back to back, as timed.
      check(cudaStreamSynchronize(stream), "drain");
      std::vector<size_t> per_set(sets);
      for (int i = 0; i < sets; ++i) {
        const uint64_t t0 = tracer.now_ns();
        engine.forward_device(xs[i], lens[i], c.B, stream, tokens[i]);
        check(cudaStreamSynchronize(stream), "traced forward");
        per_set[i] = tracer.collect(t0, tracer.now_ns()).size();
      }
      constexpr int kTraced = 50;
      struct Events {  // destroyed on every path out
        std::vector<cudaEvent_t> e;
        ~Events() {
          for (cudaEvent_t x : e) cudaEventDestroy(x);
        }
      } owned;
      std::vector<cudaEvent_t>& tev = owned.e;
      for (int i = 0; i < 2 * kTraced; ++i) {
        cudaEvent_t x = nullptr;
        check(cudaEventCreate(&x), "event");
        tev.push_back(x);
      }
      const uint64_t t0 = tracer.now_ns();
      std::vector<size_t> counts;
      for (int r = 0; r < kTraced; ++r) {
        counts.push_back(per_set[r % sets]);
        check(cudaEventRecord(tev[2 * r], stream), "record");
        engine.forward_device(xs[r % sets], lens[r % sets], c.B, stream, tokens[r % sets]);
        check(cudaEventRecord(tev[2 * r + 1], stream), "record");
      }
      check(cudaStreamSynchronize(stream), "traced forwards");
      const auto recs = tracer.collect(t0, tracer.now_ns());
      std::vector<double> tms(kTraced);
      for (int r = 0; r < kTraced; ++r) {
        float t = 0;
        check(cudaEventElapsedTime(&t, tev[2 * r], tev[2 * r + 1]), "elapsed");
        tms[r] = t;
      }
      std::sort(tms.begin(), tms.end());
      char head[256];
      std::snprintf(head, sizeof head,
                    "event-timed median per forward (kernel tracing on for the whole run): %.4f ms in the timed "
                    "replays, %.4f ms in the %d traced forwards\n\n",
                    ms[reps / 2], tms[kTraced / 2], kTraced);
      text = head + hk::perf::timeline_tables(hk::perf::split_forwards(recs, counts));
    } catch (const std::exception& e) {
      text = std::string("no timeline: ") + e.what() + "\n";
    }
#else
    const std::string text = "no timeline: built without CUPTI's headers\n";
#endif
    if (std::FILE* f = std::fopen(g_timeline.c_str(), "a")) {
      std::fprintf(f, "==== case %d (%s, %s lengths)\n%s\n", c.id, routes.tune ? "tuned" : "untuned",
                   g_full ? "full" : "random", text.c_str());
      std::fclose(f);
    }
  }

  for (auto& e : ev) cudaEventDestroy(e);
  if (routes.tune) {
    // A second engine with the same tune cache: what the next run of this case starts with.
    check(cudaStreamSynchronize(stream), "drain");
    engine_ptr.reset();
    hk::cuda::CudaEngine again(model, opt, routes);
    auto t_again = std::chrono::steady_clock::now();
    again.forward_device(xs[0], lens[0], c.B, again.stream(), tokens[0]);
    check(cudaStreamSynchronize(again.stream()), "second engine");
    res.cached_startup_ms = wall_ms(t_again);
    res.cached = again.tune_report(c.B).cached;
    state.counters["cached_startup_ms"] = res.cached_startup_ms;
    state.counters["decisions_cached"] = res.cached;
    state.counters["decisions_measured_again"] = again.tune_report(c.B).measured;
  }
  g_results[c.id][routes.tune ? "tuned" : "untuned"] = res;

  cudaEventDestroy(probe0);
  cudaEventDestroy(probe1);
  for (int i = 0; i < sets; ++i) {
    cudaFree(xs[i]);
    cudaFree(lens[i]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string cases_path = "cases.csv", only, tune_mode = "env";
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
    else if (a == "--tune") tune_mode = value("--tune");
    else if (a == "--tune-cache") g_tune_cache = value("--tune-cache");
    else if (a == "--plans") g_plans = value("--plans");
    else if (a == "--timeline") g_timeline = value("--timeline");
    else if (a == "--lengths") {
      const std::string v = value("--lengths");
      if (v != "random" && v != "full") throw std::runtime_error("--lengths takes random or full");
      g_full = v == "full";
    }
    else rest.push_back(argv[i]);
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "hk_bench_cuda: no CUDA device\n");
    return 77;
  }
  if (tune_mode != "env" && tune_mode != "off" && tune_mode != "on" && tune_mode != "both") {
    std::fprintf(stderr, "hk_bench_cuda: --tune takes env, off, on or both\n");
    return 2;
  }
  if (g_tune_cache.empty()) {  // a fresh cache: the first tuned engine of each case measures
    char tmpl[] = "/tmp/hk_bench_tune_XXXXXX";
    if (const char* d = ::mkdtemp(tmpl)) g_tune_cache = d;
  }
#ifdef HK_HAVE_CUPTI
  if (!g_timeline.empty()) {
    // Tracing on before any engine exists (their graphs are instantiated under it), for the whole run.
    try {
      if (timeline_tracer().available()) timeline_tracer().start();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "hk_bench_cuda: %s\n", e.what());
    }
  }
#endif
  std::vector<std::pair<Tune, std::string>> modes;
  if (tune_mode == "env") modes = {{Tune::env, ""}};
  if (tune_mode == "off") modes = {{Tune::off, "/untuned"}};
  if (tune_mode == "on") modes = {{Tune::on, "/tuned"}};
  if (tune_mode == "both") modes = {{Tune::off, "/untuned"}, {Tune::on, "/tuned"}};
  if (tune_mode == "env" && hk::cuda::routes_from_environment().tune)
    std::fprintf(stderr, "hk_bench_cuda: engines tune (HK_TUNE); their cache: %s\n",
                 hk::cuda::routes_from_environment().tune_cache_dir.c_str());
  for (const Case& c : read_cases(cases_path)) {
    if (!only.empty() && ("," + only + ",").find("," + std::to_string(c.id) + ",") == std::string::npos) continue;
    const std::string name = "forward/case:" + std::to_string(c.id) + "/B:" + std::to_string(c.B) +
                             "/S:" + std::to_string(c.S) + "/D:" + std::to_string(c.D) + "/H:" +
                             std::to_string(c.H) + "/" + hk::to_string(g_precision) + (g_full ? "/full" : "");
    for (const auto& [mode, suffix] : modes)
      benchmark::RegisterBenchmark((name + suffix).c_str(), bench_case, c, mode)
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
  }
  int n = int(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (tune_mode == "both") {
    // The side-by-side table for perf/RESULTS.md.
    std::printf("\n| case | HK_TUNE=0 ms | tuned ms | gain | tuning warm-up ms (measured decisions, measuring ms) | "
                "cached start-up ms (cached decisions) | untuned start-up ms |\n|---|---|---|---|---|---|---|\n");
    double log_sum = 0;
    int n = 0;
    for (const auto& [id, r] : g_results) {
      if (!r.count("untuned") || !r.count("tuned")) continue;
      const Result& u = r.at("untuned");
      const Result& t = r.at("tuned");
      std::printf("| %d | %.4f | %.4f | %.3fx | %.0f (%d, %.0f) | %.0f (%d) | %.0f |\n", id, u.ms, t.ms, u.ms / t.ms,
                  t.startup_ms, t.measured, t.measure_ms, t.cached_startup_ms, t.cached, u.startup_ms);
      log_sum += std::log(u.ms / t.ms);
      ++n;
    }
    if (n) std::printf("\ngeometric-mean gain of tuning: %.3fx over %d cases (tune cache %s)\n", std::exp(log_sum / n), n,
                       g_tune_cache.c_str());
  }
  return 0;
}
