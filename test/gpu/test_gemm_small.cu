// GPU test of the own fp16 GEMM + bias kernel (backends/cuda/gemm_small.cuh), standalone (own
// main, exit 77 without a GPU):
//   - every tile width that applies, on shapes (n, k) of the QKV projection and odd ones
//     (k 32..256 in steps of 16, n multiples of 32), rows 0, 1, 15, 16, 17, 63, 64, 65, 130, a
//     few thousand and 100001 (many row tiles per CTA, both a buffers in turn): each output
//     element against a float64 reference of the same fp16 inputs, within half an fp16 ulp of
//     the reference plus the fp32 accumulation bound;
//   - the output NaN-poisoned before each launch (unwritten elements fail) with poisoned guard
//     rows after it (must stay poisoned); a allocated with exactly `rows` rows, so that a read
//     past its end shows under compute-sanitizer memcheck;
//   - rows 0 writes nothing; graph capture and repeated launches give the same bits;
//   - the same problem through cuBLASLt's bias epilogue: at most one fp16 ulp apart;
//   - supports / candidates / name contracts and the argument checks (unsupported k / n, bad
//     tile width, misaligned or null pointers).
// Then timings (HK_TEST_NO_TIMING=1 skips them): graph replay of 20 launches, median of 30, per
// launch, the own kernel at each width next to cuBLASLt's first algorithm, at the QKV shapes of
// cases.csv (informational; the engine's chooser and hk_bench_cuda decide).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/cublaslt_api.hpp"
#include "gemm_cublaslt.cuh"
#include "gemm_small.cuh"
#include "graph_timing.cuh"

namespace {

#define CHECK_CUDA(expr)                                                                         \
  do {                                                                                           \
    const cudaError_t e_ = (expr);                                                               \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

int g_checks = 0, g_failures = 0;

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::printf("FAIL %s\n", what.c_str());
  }
}

struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t b) : bytes(b) { CHECK_CUDA(cudaMalloc(&p, b ? b : 16)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Half an fp16 ulp at magnitude v (subnormal spacing below 2^-14).
double half_ulp16(double v) {
  v = std::fabs(v);
  if (v < 6.103515625e-05) return std::ldexp(1.0, -25);
  return std::ldexp(1.0, int(std::floor(std::log2(v))) - 11);
}

struct Problem {
  int64_t rows;
  int n, k;
  std::vector<__half> a, w, bias;  // a: exactly rows x k
  std::vector<double> ref, bound;  // [rows, n]
};
constexpr int kGuard = 3;

Problem make_problem(int64_t rows, int n, int k, std::mt19937_64& rng) {
  Problem p{rows, n, k, {}, {}, {}, {}, {}};
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  p.a.resize(size_t(rows) * k);
  for (auto& v : p.a) v = __float2half(u(rng));
  p.w.resize(size_t(n) * k);
  for (auto& v : p.w) v = __float2half(u(rng) * 0.25f);
  p.bias.resize(size_t(n));
  for (auto& v : p.bias) v = __float2half(u(rng));
  p.ref.assign(size_t(rows) * n, 0.0);
  p.bound.assign(size_t(rows) * n, 0.0);
  std::vector<double> wd(p.w.size());
  for (size_t i = 0; i < wd.size(); ++i) wd[i] = __half2float(p.w[i]);
  std::vector<double> ad(size_t(k), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int c = 0; c < k; ++c) ad[size_t(c)] = __half2float(p.a[size_t(r * k + c)]);
    for (int j = 0; j < n; ++j) {
      const double* wr = &wd[size_t(j) * k];
      double s = 0, sa = 0;
      for (int c = 0; c < k; ++c) {
        s += ad[size_t(c)] * wr[c];
        sa += std::fabs(ad[size_t(c)] * wr[c]);
      }
      const double b = __half2float(p.bias[size_t(j)]);
      const double ref = s + b;
      // fp32 accumulation of k products (+ the bias): k * 2^-24 relative to the absolute sum,
      // then one rounding to fp16 (at the binade of a slightly larger value, to be safe).
      const double acc_err = double(k + 2) * std::ldexp(1.0, -24) * (sa + std::fabs(b));
      p.ref[size_t(r * n + j)] = ref;
      p.bound[size_t(r * n + j)] = half_ulp16(std::fabs(ref) + acc_err) + acc_err + 1e-12;
    }
  }
  return p;
}

// The kernel's parameters over device buffers of a, w, bias and c.
hk::cuda::SmallGemmParams params_of(const Dev& a, const Dev& w, const Dev& bias, const Dev& c, int64_t rows, int n,
                                    int k) {
  hk::cuda::SmallGemmParams q;
  q.a = a.as<__half>();
  q.w = w.as<__half>();
  q.bias = bias.as<__half>();
  q.c = c.as<__half>();
  q.rows = rows;
  q.n = n;
  q.k = k;
  return q;
}

struct Buffers {
  Dev a, w, bias, c;
  explicit Buffers(const Problem& p)
      : a(p.a.size() * 2), w(p.w.size() * 2), bias(p.bias.size() * 2), c(size_t(p.rows + kGuard) * p.n * 2) {
    CHECK_CUDA(cudaMemcpy(a.p, p.a.data(), a.bytes, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(w.p, p.w.data(), w.bytes, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(bias.p, p.bias.data(), bias.bytes, cudaMemcpyHostToDevice));
  }
  hk::cuda::SmallGemmParams params(const Problem& p) const { return params_of(a, w, bias, c, p.rows, p.n, p.k); }
  void poison_c(cudaStream_t s) const { CHECK_CUDA(cudaMemsetAsync(c.p, 0xFF, c.bytes, s)); }
  std::vector<uint16_t> download_c(cudaStream_t s) const {
    std::vector<uint16_t> v(c.bytes / 2);
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaMemcpy(v.data(), c.p, c.bytes, cudaMemcpyDeviceToHost));
    return v;
  }
};

double to_double(uint16_t bits) {
  __half h;
  std::memcpy(&h, &bits, 2);
  return __half2float(h);
}

// Every element within its bound, the guard rows still poisoned; returns the worst |err| / bound.
double verify(const Problem& p, const std::vector<uint16_t>& c, const std::string& what) {
  double worst = 0;
  int64_t bad = 0, first_bad = -1;
  for (int64_t i = 0; i < p.rows * p.n; ++i) {
    const double v = to_double(c[size_t(i)]);
    const double e = std::fabs(v - p.ref[size_t(i)]);
    const double q = std::isfinite(v) ? e / p.bound[size_t(i)] : INFINITY;
    worst = std::max(worst, q);
    if (!(q <= 1.0)) {
      if (first_bad < 0) first_bad = i;
      ++bad;
    }
  }
  check(bad == 0, what + ": " + std::to_string(bad) + " elements outside the bound" +
                      (first_bad >= 0 ? " (first row " + std::to_string(first_bad / p.n) + " col " +
                                            std::to_string(first_bad % p.n) + ": " +
                                            std::to_string(to_double(c[size_t(first_bad)])) + " vs " +
                                            std::to_string(p.ref[size_t(first_bad)]) + ")"
                                      : std::string()));
  bool guards = true;
  for (size_t i = size_t(p.rows) * p.n; i < c.size(); ++i) guards = guards && c[i] == 0xFFFF;
  check(guards, what + ": guard rows after the output written");
  return worst;
}

void correctness(std::mt19937_64& rng, cudaStream_t s) {
  struct NK {
    int n, k;
  };
  const NK shapes[] = {{384, 128}, {192, 64}, {768, 256}, {96, 32}, {288, 96}, {64, 48}, {32, 32}, {160, 80},
                       {224, 240}, {416, 144}};
  const int64_t row_counts[] = {1, 15, 16, 17, 63, 64, 65, 130};
  double worst = 0;
  for (const NK& sh : shapes) {
    std::vector<int64_t> rows(std::begin(row_counts), std::end(row_counts));
    rows.push_back(sh.k >= 256 ? 1500 : 4352);
    // Many row tiles per CTA at every width (the persistent grid's loop and both a buffers).
    if (sh.n == 192 && sh.k == 64) rows.push_back(100001);
    if (sh.n == 384 && sh.k == 128) rows.push_back(20000);
    if (sh.n == 768 && sh.k == 256) rows.push_back(6000);
    for (int64_t r : rows) {
      Problem p = make_problem(r, sh.n, sh.k, rng);
      Buffers b(p);
      std::vector<hk::cuda::SmallGemmConfig> cfgs = hk::cuda::small_gemm_candidates(r, sh.n, sh.k);
      check(!cfgs.empty(), "candidates for n " + std::to_string(sh.n) + " k " + std::to_string(sh.k));
      for (const auto& cf : cfgs) {
        const std::string what = "n " + std::to_string(sh.n) + " k " + std::to_string(sh.k) + " rows " +
                                 std::to_string(r) + " " + hk::cuda::small_gemm_name(r, sh.n, sh.k, cf);
        b.poison_c(s);
        hk::cuda::small_gemm_bias(b.params(p), s, cf);
        CHECK_CUDA(cudaGetLastError());
        const std::vector<uint16_t> c1 = b.download_c(s);
        worst = std::max(worst, verify(p, c1, what));
        // Again, poisoned: the same bits (deterministic, and the second launch writes everything).
        b.poison_c(s);
        hk::cuda::small_gemm_bias(b.params(p), s, cf);
        check(b.download_c(s) == c1, what + ": repeat launch bits");
      }
    }
  }
  std::printf("correctness: worst |error| / bound %.3f\n", worst);

  // rows 0: nothing written.
  {
    Problem p = make_problem(0, 384, 128, rng);
    Buffers b(p);
    b.poison_c(s);
    hk::cuda::small_gemm_bias(b.params(p), s);
    const std::vector<uint16_t> c = b.download_c(s);
    check(std::all_of(c.begin(), c.end(), [](uint16_t v) { return v == 0xFFFF; }), "rows 0 writes nothing");
  }

  // Graph capture (on a non-default stream, as the engine does): same bits as the direct launch.
  {
    Problem p = make_problem(1000, 384, 128, rng);
    Buffers b(p);
    b.poison_c(s);
    hk::cuda::small_gemm_bias(b.params(p), s);
    const std::vector<uint16_t> direct = b.download_c(s);
    b.poison_c(s);
    CHECK_CUDA(cudaStreamSynchronize(s));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    hk::cuda::small_gemm_bias(b.params(p), s);
    CHECK_CUDA(cudaStreamEndCapture(s, &g));
    CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
    CHECK_CUDA(cudaGraphLaunch(ge, s));
    check(b.download_c(s) == direct, "graph replay bits == direct launch");
    CHECK_CUDA(cudaGraphExecDestroy(ge));
    CHECK_CUDA(cudaGraphDestroy(g));
  }

  // Against cuBLASLt's bias epilogue on the same inputs: at most one fp16 ulp apart.
  cublasLtHandle_t lt = nullptr;
  if (hk::cuda::lt::api().Create(&lt) != CUBLAS_STATUS_SUCCESS) {
    check(false, "cublasLtCreate");
    return;
  }
  for (const NK sh : {NK{384, 128}, NK{192, 64}, NK{768, 256}}) {
    Problem p = make_problem(777, sh.n, sh.k, rng);
    Buffers b(p);
    hk::cuda::GemmShape gs;
    gs.rows = p.rows;
    gs.n = p.n;
    gs.k = p.k;
    hk::cuda::LtGemm g(lt, gs, b.bias.p);
    Dev ws(hk::cuda::kLtWorkspaceBytes), c2(size_t(p.rows) * p.n * 2);
    const int bind = g.bind_bias(b.bias.p);
    g.run(bind, b.w.p, b.a.p, nullptr, c2.p, ws.p, s);
    b.poison_c(s);
    hk::cuda::small_gemm_bias(b.params(p), s);
    const std::vector<uint16_t> mine = b.download_c(s);
    std::vector<uint16_t> theirs(size_t(p.rows) * p.n);
    CHECK_CUDA(cudaMemcpy(theirs.data(), c2.p, theirs.size() * 2, cudaMemcpyDeviceToHost));
    int64_t far = 0, differ = 0;
    for (size_t i = 0; i < theirs.size(); ++i) {
      const double x = to_double(mine[i]), y = to_double(theirs[i]);
      if (mine[i] != theirs[i]) ++differ;
      if (!(std::fabs(x - y) <= 2 * half_ulp16(std::max(std::fabs(x), std::fabs(y))))) ++far;
    }
    check(far == 0, "vs cuBLASLt n " + std::to_string(sh.n) + " k " + std::to_string(sh.k) + ": " +
                        std::to_string(far) + " elements more than one ulp apart");
    std::printf("vs cuBLASLt n %d k %d: %lld of %zu elements differ in their last bit(s)\n", sh.n, sh.k,
                static_cast<long long>(differ), theirs.size());
  }
  hk::cuda::lt::api().Destroy(lt);
}

void contracts(cudaStream_t s) {
  using hk::cuda::small_gemm_supports;
  check(small_gemm_supports(384, 128) && small_gemm_supports(768, 256) && small_gemm_supports(96, 32),
        "supports the QKV shapes");
  check(!small_gemm_supports(384, 16) && !small_gemm_supports(384, 40) && !small_gemm_supports(3072, 1024) &&
            !small_gemm_supports(48, 64) && !small_gemm_supports(0, 64) && !small_gemm_supports(384, 272),
        "rejects k outside [32, 256] / not a multiple of 16, n not a multiple of 32");
  check(hk::cuda::small_gemm_candidates(100, 384, 16).empty() && hk::cuda::small_gemm_name(100, 384, 16).empty(),
        "no candidates / name for an unsupported shape");
  // Each candidate distinct, the automatic one first.
  const auto c = hk::cuda::small_gemm_candidates(4352, 384, 128);
  bool distinct = c.size() == 3 && c[0].bn == hk::cuda::small_gemm_bn(4352, 384, 128);
  for (size_t i = 0; i < c.size(); ++i)
    for (size_t j = i + 1; j < c.size(); ++j) distinct = distinct && c[i].bn != c[j].bn;
  check(distinct, "candidates distinct, automatic first");
  check(hk::cuda::small_gemm_bn(100, 96, 32, {128}) == 0 && hk::cuda::small_gemm_bn(100, 96, 32, {32}) == 32 &&
            hk::cuda::small_gemm_bn(100, 384, 128, {48}) == 0,
        "tile widths that do not divide n, exceed k + 8 or do not exist are unusable");

  Dev a(64 * 128 * 2 + 16), w(384 * 128 * 2 + 16), bias(384 * 2), out(64 * 384 * 2 + 16);
  const hk::cuda::SmallGemmParams p = params_of(a, w, bias, out, 64, 384, 128);
  auto throws = [&](hk::cuda::SmallGemmParams q, hk::cuda::SmallGemmConfig cf, const char* what) {
    bool threw = false;
    try {
      hk::cuda::small_gemm_bias(q, s, cf);
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    check(threw, std::string("throws: ") + what);
  };
  auto q = p;
  q.k = 40;
  throws(q, {}, "k 40");
  q = p;
  q.n = 400;
  throws(q, {}, "n 400");
  throws(p, {96}, "tile width 96");
  q = p;
  q.a = reinterpret_cast<const __half*>(reinterpret_cast<const char*>(p.a) + 8);
  throws(q, {}, "misaligned a");
  q = p;
  q.c = reinterpret_cast<__half*>(reinterpret_cast<char*>(p.c) + 4);
  throws(q, {}, "misaligned c");
  q = p;
  q.bias = nullptr;
  throws(q, {}, "null bias");
  q = p;
  q.rows = -1;
  throws(q, {}, "negative rows");
  CHECK_CUDA(cudaStreamSynchronize(s));
}

void timings(cudaStream_t s) {
  cublasLtHandle_t lt = nullptr;
  if (hk::cuda::lt::api().Create(&lt) != CUBLAS_STATUS_SUCCESS) return;
  struct T {
    const char* name;
    int64_t rows;
    int n, k;
  };
  // Rows as the engine runs them (padding-free buckets where it packs).
  const T shapes[] = {{"case 2 (128 rows)", 128, 384, 128},        {"case 1 packed", 4352, 384, 128},
                      {"case 4 packed", 4352, 192, 64},             {"case 12 packed", 8192, 768, 256},
                      {"case 3 packed", 8448, 384, 128},            {"case 6 packed", 683264, 384, 128}};
  std::printf("\nper launch, graph of 20 launches, median of 30 (ms):\n");
  for (const T& t : shapes) {
    Dev a(size_t(t.rows) * t.k * 2), w(size_t(t.n) * t.k * 2), bias(size_t(t.n) * 2), c(size_t(t.rows) * t.n * 2),
        ws(hk::cuda::kLtWorkspaceBytes);
    CHECK_CUDA(cudaMemset(a.p, 0, a.bytes));
    CHECK_CUDA(cudaMemset(w.p, 0, w.bytes));
    CHECK_CUDA(cudaMemset(bias.p, 0, bias.bytes));
    hk::cuda::GemmShape gs;
    gs.rows = t.rows;
    gs.n = t.n;
    gs.k = t.k;
    hk::cuda::LtGemm g(lt, gs, bias.p);
    const int bind = g.bind_bias(bias.p);
    const double lt_ms = hk::gputest::graph_ms_per_launch(s, [&] { g.run(bind, w.p, a.p, nullptr, c.p, ws.p, s); });
    std::printf("  %-18s rows %-7lld n %-4d k %-4d cuBLASLt #0 %.4f", t.name, static_cast<long long>(t.rows), t.n,
                t.k, lt_ms);
    const hk::cuda::SmallGemmParams p = params_of(a, w, bias, c, t.rows, t.n, t.k);
    for (const auto& cf : hk::cuda::small_gemm_candidates(t.rows, t.n, t.k))
      std::printf("  bn%d %.4f", cf.bn, hk::gputest::graph_ms_per_launch(s, [&] { hk::cuda::small_gemm_bias(p, s, cf); }));
    std::printf("\n");
  }
  hk::cuda::lt::api().Destroy(lt);
}

}  // namespace

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("test_gemm_small: no CUDA device, skipped\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937_64 rng(20261130);
  try {
    contracts(stream);
    correctness(rng, stream);
    if (const char* nt = std::getenv("HK_TEST_NO_TIMING"); !(nt && *nt && *nt != '0')) timings(stream);
  } catch (const std::exception& e) {
    std::printf("FAIL exception: %s\n", e.what());
    ++g_failures;
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("\n%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
