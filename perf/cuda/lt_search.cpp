// hk_lt_search: whether cuBLASLt has faster configurations for hk's GEMMs than the ones its
// best-fit heuristic returns (at most 8 per problem here, also when more are asked for).
//
// For each GEMM of the list (the shapes of the plans of cases 5, 6, 8, 12 and 13, both weight
// layouts), it times the heuristic's candidates, then every configuration cublasLtMatmulAlgoCheck
// accepts among the heuristic's candidates changed in one field: each other cluster shape, each
// other tile id its algorithm lists. The output of the fastest such configuration is compared with
// the heuristic #0's on random inputs (same operands: the difference is only the summation order).
//
//   hk_lt_search [--only NAME] [--max N] [--ms T]
//     --only NAME   only the GEMMs whose name contains NAME (e.g. "c8", "c12.out")
//     --max N       time at most N configurations per GEMM beyond the heuristic's (default 800)
//     --ms T        milliseconds of launches per timing round (default 2; 3 rounds, median)
//
// Prints one block per GEMM: the heuristic's best, the fastest other configuration and their
// ratio, how many configurations were checked / accepted / timed, the five fastest. A diagnostic
// for the GEMM decision's candidate list, not a benchmark of hk.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cublaslt_api.hpp"
#include "cuda/gemm_cublaslt.cuh"

namespace {

using namespace hk::cuda;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "hk_lt_search: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Gemm {
  std::string name;
  GemmShape s;
};

std::vector<Gemm> gemm_list() {
  std::vector<Gemm> g;
  const auto add_layer = [&](const std::string& tag, int64_t rows, int D, int F, bool qkv_only) {
    for (bool kn : {false, true}) {
      const std::string l = kn ? ".kn" : ".nk";
      g.push_back({tag + ".qkv" + l, {rows, 3 * D, D, DType::f16, DType::f16, GemmEpilogue::bias, kn}});
      if (qkv_only) continue;
      g.push_back({tag + ".out" + l, {rows, D, D, DType::f16, DType::f32, GemmEpilogue::bias_residual, kn}});
      g.push_back({tag + ".ffn_in" + l, {rows, F, D, DType::f16, DType::f16, GemmEpilogue::bias_gelu_tanh, kn}});
      g.push_back({tag + ".ffn_out" + l, {rows, D, F, DType::f16, DType::f32, GemmEpilogue::bias_residual, kn}});
    }
  };
  // Row counts of the padding-free plans (random lengths) and of full length.
  add_layer("c8.r4352", 4352, 1024, 1024, false);
  add_layer("c8.r4096", 4096, 1024, 1024, false);
  add_layer("c8.r8192", 8192, 1024, 1024, false);
  add_layer("c12.r8256", 8256, 256, 256, false);
  add_layer("c12.r16384", 16384, 256, 256, false);
  add_layer("c13.r33024", 33024, 128, 128, true);
  add_layer("c5.r33280", 33280, 128, 128, true);
  add_layer("c6.r655360", 655360, 128, 128, true);
  return g;
}

template <class T>
T config(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t w = 0;
  lt::api().MatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof v, &w);
  return v;
}

// Configurations around the heuristic's own (see the header): LtGemm::neighbours of each of its
// candidates, without repeats. Algorithms built by cublasLtMatmulAlgoInit and configured field by
// field ran 3-14% slower than the heuristic's with the same named fields (first search), so the
// heuristic's candidates are the starting points.
std::vector<cublasLtMatmulAlgo_t> enumerate(const LtGemm& heur, size_t* tried) {
  std::vector<cublasLtMatmulAlgo_t> out;
  for (const LtGemm::Neighbour& n : heur.neighbourhood(std::vector<bool>(size_t(heur.base_count()), true), tried))
    out.push_back(n.algo);
  return out;
}

std::string describe(const cublasLtMatmulAlgo_t& a) {
  char b[200];
  std::snprintf(b, sizeof b, "algo %d tile %u stages %u cluster %u inner %u swizzle %u custom %u",
                config<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID), config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
                config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                unsigned(config<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)),
                unsigned(config<uint16_t>(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID)),
                config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION));
  return b;
}

struct Buffers {
  void *w = nullptr, *in = nullptr, *bias = nullptr, *out = nullptr, *res = nullptr, *ws = nullptr, *ref = nullptr;
};

// Median over 3 rounds of the mean ms per launch of candidate `i`; a failed launch gives +inf.
double time_candidate(LtGemm& g, int i, int binding, const Buffers& b, cudaStream_t st, double round_ms) {
  g.select(i);
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  double result = INFINITY;
  try {
    for (int w = 0; w < 2; ++w) g.run(binding, b.w, b.in, static_cast<const float*>(b.res), b.out, b.ws, st);
    check(cudaEventRecord(e0, st), "record");
    g.run(binding, b.w, b.in, static_cast<const float*>(b.res), b.out, b.ws, st);
    check(cudaEventRecord(e1, st), "record");
    check(cudaEventSynchronize(e1), "sync");
    float one = 0;
    check(cudaEventElapsedTime(&one, e0, e1), "elapsed");
    const int n = std::clamp(int(round_ms / std::max(double(one), 1e-3)), 3, 2000);
    double r[3];
    for (double& x : r) {
      check(cudaEventRecord(e0, st), "record");
      for (int k = 0; k < n; ++k) g.run(binding, b.w, b.in, static_cast<const float*>(b.res), b.out, b.ws, st);
      check(cudaEventRecord(e1, st), "record");
      check(cudaEventSynchronize(e1), "sync");
      float t = 0;
      check(cudaEventElapsedTime(&t, e0, e1), "elapsed");
      x = double(t) / n;
    }
    std::sort(r, r + 3);
    result = r[1];
  } catch (const std::exception& e) {
    std::printf("    candidate %d failed: %s\n", i, e.what());
    cudaGetLastError();
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return result;
}

// Largest |a - b| over the outputs (fp16 or fp32 elements).
double max_diff(const void* a, const void* b, size_t n, bool f32) {
  double m = 0;
  if (f32) {
    std::vector<float> x(n), y(n);
    check(cudaMemcpy(x.data(), a, n * 4, cudaMemcpyDeviceToHost), "copy");
    check(cudaMemcpy(y.data(), b, n * 4, cudaMemcpyDeviceToHost), "copy");
    for (size_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(x[i] - y[i])));
  } else {
    std::vector<__half> x(n), y(n);
    check(cudaMemcpy(x.data(), a, n * 2, cudaMemcpyDeviceToHost), "copy");
    check(cudaMemcpy(y.data(), b, n * 2, cudaMemcpyDeviceToHost), "copy");
    for (size_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(__half2float(x[i]) - __half2float(y[i]))));
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::string only;
  size_t max_timed = 800;
  double round_ms = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--only") == 0) only = argv[i + 1];
    else if (std::strcmp(argv[i], "--max") == 0) max_timed = size_t(std::stoul(argv[i + 1]));
    else if (std::strcmp(argv[i], "--ms") == 0) round_ms = std::stod(argv[i + 1]);
    else {
      std::fprintf(stderr, "hk_lt_search: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  const std::vector<Gemm> list = gemm_list();
  size_t in_elems = 0, out_bytes = 0, res_elems = 0, w_elems = 0, bias_elems = 0;
  for (const Gemm& g : list) {
    const size_t rows = size_t(g.s.rows);
    in_elems = std::max(in_elems, rows * size_t(g.s.k));
    out_bytes = std::max(out_bytes, rows * size_t(g.s.n) * (g.s.out_type == DType::f32 ? 4 : 2));
    res_elems = std::max(res_elems, g.s.epilogue == GemmEpilogue::bias_residual ? rows * size_t(g.s.n) : 0);
    w_elems = std::max(w_elems, size_t(g.s.n) * size_t(g.s.k));
    bias_elems = std::max(bias_elems, size_t(g.s.n));
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device");
  cublasLtHandle_t lt = nullptr;
  if (lt::api().Create(&lt) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "hk_lt_search: cublasLtCreate failed\n");
    return 1;
  }
  std::printf("hk_lt_search on %s (%d SMs), cuBLASLt %zu\n", prop.name, prop.multiProcessorCount,
              size_t(lt::api().GetVersion()));
  Buffers b;
  check(cudaMalloc(&b.w, w_elems * 2), "malloc");
  check(cudaMalloc(&b.in, in_elems * 2), "malloc");
  check(cudaMalloc(&b.bias, bias_elems * 4), "malloc");
  check(cudaMalloc(&b.out, out_bytes), "malloc");
  check(cudaMalloc(&b.ref, out_bytes), "malloc");
  check(cudaMalloc(&b.res, std::max<size_t>(res_elems, 1) * 4), "malloc");
  check(cudaMalloc(&b.ws, kLtWorkspaceBytes), "malloc");
  {  // random fp16 operands in [-1, 1) (an LCG; weights scaled by 0.05), fp32 residual and bias
    uint32_t state = 12345u;
    const auto next = [&] {
      state = state * 1664525u + 1013904223u;
      return float(state >> 8) / float(1u << 24) * 2.f - 1.f;
    };
    std::vector<__half> h(std::max(in_elems, w_elems));
    for (size_t i = 0; i < in_elems; ++i) h[i] = __float2half(next());
    check(cudaMemcpy(b.in, h.data(), in_elems * 2, cudaMemcpyHostToDevice), "upload");
    for (size_t i = 0; i < w_elems; ++i) h[i] = __float2half(next() * 0.05f);
    check(cudaMemcpy(b.w, h.data(), w_elems * 2, cudaMemcpyHostToDevice), "upload");
    std::vector<float> f(std::max(res_elems, bias_elems));
    for (auto& x : f) x = next();
    check(cudaMemcpy(b.res, f.data(), res_elems * 4, cudaMemcpyHostToDevice), "upload");
    check(cudaMemcpy(b.bias, f.data(), bias_elems * 4, cudaMemcpyHostToDevice), "upload");
  }
  cudaStream_t st;
  check(cudaStreamCreate(&st), "stream");
  int wins = 0, shapes = 0;
  for (const Gemm& g : list) {
    if (!only.empty() && g.name.find(only) == std::string::npos) continue;
    ++shapes;
    std::printf("== %s: rows %lld n %d k %d %s\n", g.name.c_str(), static_cast<long long>(g.s.rows), g.s.n, g.s.k,
                to_string(g.s.epilogue));
    std::fflush(stdout);
    LtGemm heur(lt, g.s, b.bias);
    if (!heur.available()) {
      std::printf("  no heuristic candidate\n");
      continue;
    }
    const int hb = heur.bind_bias(b.bias);
    double best_h = INFINITY;
    int best_hi = 0;
    for (int i = 0; i < int(heur.candidates().size()); ++i) {
      const double t = time_candidate(heur, i, hb, b, st, round_ms);
      if (t < best_h) best_h = t, best_hi = i;
    }
    // The reference output: the heuristic's #0 (residual read from b.res: out of place).
    heur.select(0);
    const size_t out_elems = size_t(g.s.rows) * size_t(g.s.n);
    const bool f32 = g.s.out_type == DType::f32;
    heur.run(hb, b.w, b.in, static_cast<const float*>(b.res), b.ref, b.ws, st);
    check(cudaStreamSynchronize(st), "reference");

    size_t tried = 0;
    std::vector<cublasLtMatmulAlgo_t> all = enumerate(heur, &tried);
    LtGemm custom(lt, g.s, b.bias, all);  // keeps those cublasLtMatmulAlgoCheck accepts
    const size_t accepted = custom.candidates().size();
    std::printf("  heuristic: %zu candidates, best #%d %.4f ms (%s)\n", heur.candidates().size(), best_hi, best_h,
                heur.describe(best_hi).c_str());
    for (int i = 0; i < int(heur.candidates().size()); ++i)
      std::printf("    #%d %s\n", i, describe(heur.candidates()[size_t(i)].algo).c_str());
    std::printf("  configurations: %zu checked, %zu accepted", tried, accepted);
    if (!custom.available()) {
      std::printf("\n");
      continue;
    }
    const int cb = custom.bind_bias(b.bias);
    const size_t timed = std::min(accepted, max_timed);
    std::printf(", %zu timed\n", timed);
    std::vector<std::pair<double, int>> times;
    for (size_t i = 0; i < timed; ++i) times.push_back({time_candidate(custom, int(i), cb, b, st, round_ms), int(i)});
    std::sort(times.begin(), times.end());
    const double best_c = times.front().first;
    custom.select(times.front().second);
    custom.run(cb, b.w, b.in, static_cast<const float*>(b.res), b.out, b.ws, st);
    check(cudaStreamSynchronize(st), "best configuration");
    const double diff = max_diff(b.out, b.ref, out_elems, f32);
    std::printf("  fastest configuration %.4f ms (%s): %.3fx the heuristic's best; max |diff| vs heuristic #0 %.3g\n",
                best_c, describe(custom.candidates()[size_t(times.front().second)].algo).c_str(), best_h / best_c,
                diff);
    for (size_t i = 0; i < std::min<size_t>(5, times.size()); ++i)
      std::printf("    %.4f ms  %s\n", times[i].first,
                  describe(custom.candidates()[size_t(times[i].second)].algo).c_str());
    if (best_c < 0.98 * best_h) ++wins;
    std::fflush(stdout);
  }
  std::printf("summary: %d of %d GEMMs have a configuration > 2%% faster than the heuristic's best\n", wins, shapes);
  lt::api().Destroy(lt);
  return 0;
}
