// hk_lt_startup: what cuBLASLt's start-up costs a process, step by step, for the GEMMs of one
// padding-free plan of case 6 (rows 69632, D = F = 128: the plan hk_forward builds first).
//   hk_lt_startup [--save FILE]   heuristic queries (as the engine's plan build makes them); FILE
//                                 receives the first algorithm of every GEMM
//   hk_lt_startup --load FILE     the same GEMMs built from FILE's algorithms (no heuristic)
//   hk_lt_startup --order lt-first | parallel
//                                 libcublasLt's load, cublasLtCreate and the first GEMM
//                                 descriptor (the f16 / bias combination) before the CUDA context
//                                 exists, or on a second thread while it is made (default:
//                                 after it): whether that one-time set-up needs the context
// Prints the wall time of: the CUDA context, loading libcublasLt, cublasLtCreate, each GEMM's
// construction, and the first run of three of them (each synchronised). A diagnostic for the
// plan build's one-time cost (--stats plan_gemm_ms), not a benchmark.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cublaslt_api.hpp"
#include "cuda/gemm_cublaslt.cuh"

namespace {

using clk = std::chrono::steady_clock;
double ms_since(clk::time_point t) { return std::chrono::duration<double, std::milli>(clk::now() - t).count(); }

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "hk_lt_startup: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string save, load, order = "serial";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--save") == 0) save = argv[i + 1];
    else if (std::strcmp(argv[i], "--load") == 0) load = argv[i + 1];
    else if (std::strcmp(argv[i], "--order") == 0) order = argv[i + 1];
  }
  if (order != "serial" && order != "lt-first" && order != "parallel") {
    std::fprintf(stderr, "hk_lt_startup: --order serial | lt-first | parallel, not %s\n", order.c_str());
    return 2;
  }
  using namespace hk::cuda;
  constexpr int64_t kRows = 69632;
  constexpr int D = 128, F = 128;
  const auto t_all = clk::now();
  // libcublasLt, a handle and the first f16 / bias descriptor (a bias address that is never
  // dereferenced: no device memory may exist yet). Times from t_all.
  cublasLtHandle_t h = nullptr;
  std::unique_ptr<LtGemm> first;
  char lt_report[256] = "";
  const auto lt_side = [&] {
    auto t = clk::now();
    (void)lt::api();
    const double load_ms = ms_since(t);
    t = clk::now();
    if (lt::api().Create(&h) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "hk_lt_startup: cublasLtCreate failed\n");
      std::exit(1);
    }
    const double create_ms = ms_since(t);
    t = clk::now();
    first = std::make_unique<LtGemm>(h, GemmShape{kRows, 3 * D, D, DType::f16, DType::f16, GemmEpilogue::bias, false},
                                     reinterpret_cast<void*>(uintptr_t(1) << 20));
    std::snprintf(lt_report, sizeof lt_report,
                  "load libcublasLt     %8.2f ms\ncublasLtCreate       %8.2f ms\nfirst f16 descriptor %8.2f ms  "
                  "(%zu candidate(s); done %.2f ms after the start)\n",
                  load_ms, create_ms, ms_since(t), first->candidates().size(), ms_since(t_all));
  };
  double context_ms = 0, context_done = 0;
  const auto context_side = [&] {
    const auto t = clk::now();
    check(cudaFree(nullptr), "context");
    context_ms = ms_since(t);
    context_done = ms_since(t_all);
  };
  if (order == "lt-first") {
    lt_side();
    context_side();
  } else if (order == "parallel") {
    std::thread side(lt_side);
    context_side();
    side.join();
  } else {
    context_side();
    lt_side();
  }
  std::printf("order %s\ncontext              %8.2f ms  (done %.2f ms after the start)\n%s", order.c_str(), context_ms,
              context_done, lt_report);
  const lt::Api& api = lt::api();
  first.reset();
  auto t = clk::now();

  struct G {
    const char* name;
    GemmShape s;
  };
  std::vector<G> gemms;
  for (bool kn : {false, true}) {
    gemms.push_back({kn ? "qkv [K,N]" : "qkv [N,K]", {kRows, 3 * D, D, DType::f16, DType::f16, GemmEpilogue::bias, kn}});
    gemms.push_back({kn ? "out [K,N]" : "out [N,K]",
                     {kRows, D, D, DType::f16, DType::f32, GemmEpilogue::bias_residual, kn}});
    gemms.push_back({kn ? "ffn_in [K,N]" : "ffn_in [N,K]", {kRows, F, D, DType::f16, DType::f16, GemmEpilogue::bias, kn}});
    gemms.push_back({kn ? "ffn_out [K,N]" : "ffn_out [N,K]",
                     {kRows, D, F, DType::f16, DType::f32, GemmEpilogue::bias_residual, kn}});
  }
  void *a = nullptr, *w = nullptr, *bias = nullptr, *c = nullptr, *ws = nullptr;
  check(cudaMalloc(&a, size_t(kRows) * 512 * 2), "malloc");
  check(cudaMalloc(&w, size_t(512) * 512 * 2), "malloc");
  check(cudaMalloc(&bias, 512 * 4), "malloc");
  check(cudaMalloc(&c, size_t(kRows) * 512 * 4), "malloc");
  check(cudaMalloc(&ws, kLtWorkspaceBytes), "malloc");
  check(cudaMemset(a, 0, size_t(kRows) * 512 * 2), "memset");
  check(cudaMemset(w, 0, size_t(512) * 512 * 2), "memset");
  check(cudaMemset(bias, 0, 512 * 4), "memset");
  check(cudaMemset(c, 0, size_t(kRows) * 512 * 4), "memset");
  check(cudaDeviceSynchronize(), "sync");

  std::vector<cublasLtMatmulAlgo_t> known;
  if (!load.empty()) {
    std::ifstream in(load, std::ios::binary);
    cublasLtMatmulAlgo_t x;
    while (in.read(reinterpret_cast<char*>(&x), sizeof x)) known.push_back(x);
    if (known.size() != gemms.size()) {
      std::fprintf(stderr, "hk_lt_startup: %s holds %zu algorithms, expected %zu\n", load.c_str(), known.size(),
                   gemms.size());
      return 1;
    }
  }
  std::vector<std::unique_ptr<LtGemm>> made;
  double build = 0;
  for (size_t i = 0; i < gemms.size(); ++i) {
    t = clk::now();
    if (known.empty()) {
      made.push_back(std::make_unique<LtGemm>(h, gemms[i].s, bias));
    } else {
      made.push_back(std::make_unique<LtGemm>(h, gemms[i].s, bias, std::vector<cublasLtMatmulAlgo_t>{known[i]}));
    }
    const double m = ms_since(t);
    build += m;
    std::printf("%-20s %8.2f ms  (%s, %zu candidate(s))\n", gemms[i].name, m, known.empty() ? "heuristic" : "stored",
                made.back()->candidates().size());
  }
  std::printf("all descriptors      %8.2f ms\n", build);
  for (size_t i : {size_t(0), size_t(1), size_t(4)}) {
    if (!made[i]->available()) continue;
    const int b = made[i]->bind_bias(bias);
    t = clk::now();
    made[i]->run(b, w, a, static_cast<const float*>(c), c, ws, nullptr);
    check(cudaDeviceSynchronize(), "run");
    std::printf("first run %-10s %8.2f ms\n", gemms[i].name, ms_since(t));
  }
  if (!save.empty()) {
    std::ofstream out(save, std::ios::binary);
    for (const auto& g : made) {
      const cublasLtMatmulAlgo_t x = g->candidates().empty() ? cublasLtMatmulAlgo_t{} : g->candidates()[0].algo;
      out.write(reinterpret_cast<const char*>(&x), sizeof x);
    }
  }
  std::printf("total                %8.2f ms\n", ms_since(t_all));
  made.clear();
  api.Destroy(h);
  return 0;
}
