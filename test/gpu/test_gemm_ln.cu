// GPU test of gemm_ln, one residual GEMM with the LayerNorm behind it (backends/cuda/
// post_attn_fused.cuh), standalone (own main, exit 77 without a GPU or where the kernel is not
// built / not runnable: an sm_90a build on a compute capability 9.0 device):
//   - x = x_in + a W^T + bias and h = fp16(LN(x)) (or, in the tail, y = LN(x) with padded rows
//     zeroed) against a float64 reference of the same fp16 / fp32 inputs, fresh random data per
//     shape: rows 1, 17, 63, 64, 65, 200, 8256 (case 12's padding-free rows) and 20000 (more row
//     blocks than SMs: the persistent loop takes several per CTA);
//   - residuals far from zero (1e4 + N(0, 1)) and constant rows (variance 0: LN = its bias);
//   - in place (x_out == x_in), the residual gathered through x_rows (rows < 0 read zeros), the
//     tail on dense rows (lengths 0, 1, S and random, odd S) and on packed rows (row_dst, rows < 0
//     not written);
//   - every output NaN-poisoned before the launch (unwritten elements fail) with poisoned guard
//     rows after it (must stay poisoned); a and x_in allocated with exactly the rows read, so that
//     a read past the end shows under compute-sanitizer memcheck;
//   - rows 0 writes nothing; a graph capture gives the same bits as a direct launch;
//   - the same problem through cuBLASLt's residual epilogue + the LayerNorm kernel (the route it
//     replaces): x within fp32 accumulation noise, h at most one fp16 ulp apart;
//   - supports / name contracts and the argument checks.
// Then timings (HK_TEST_NO_TIMING=1 skips them): graph replay of 20 launches, median of 30, per
// launch, gemm_ln next to cuBLASLt (first algorithm, residual epilogue) + layer_norm at D = 256.
// HK_TEST_PROFILE_ROWS=<rows>: five launches of gemm_ln at that size, nothing checked (a profiler's run).
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
#include "graph_timing.cuh"
#include "post_attn_fused.cuh"
#include "rownorm.cuh"

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
  template <class T>
  void up(const std::vector<T>& v) {
    CHECK_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  template <class T>
  std::vector<T> down(size_t n) const {
    std::vector<T> v(n);
    CHECK_CUDA(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  void poison() { CHECK_CUDA(cudaMemset(p, 0xFF, bytes)); }
};

constexpr int kD = 256, kK = 256, kGuard = 3;
constexpr float kEps = 1e-5f;

double half_ulp16(double v) {
  v = std::fabs(v);
  if (v < 6.103515625e-05) return std::ldexp(1.0, -25);
  return std::ldexp(1.0, int(std::floor(std::log2(v))) - 11);
}
bool is_poison32(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u == 0xFFFFFFFFu;
}
bool is_poison16(__half v) {
  uint16_t u;
  std::memcpy(&u, &v, 2);
  return u == 0xFFFFu;
}

enum class Residual { random, far, constant_rows };

// One problem: a [rows, K], W [D, K], the residual source rows (x_src [src_rows, D]) and, per row,
// the source row (x_rows semantics: < 0 = zeros).
struct Problem {
  int64_t rows = 0;
  std::vector<__half> a, w;
  std::vector<float> bias, ln_w, ln_b, x_src;
  int64_t src_rows = 0;
  std::vector<int32_t> src_of;  // [rows]
  // float64 reference: x, LN(x), the bound of x's fp32 arithmetic per element, and per row what
  // that error can move LN(x) by per unit of ln_w (4 x the row's largest x bound x rstd)
  std::vector<double> x, h, xbound, hscale;
  double h_bound(size_t i, int n, double extra = 0) const {
    return hscale[i / kD] * std::fabs(ln_w[size_t(n)]) + 1e-5 * (1.0 + std::fabs(h[i])) + extra;
  }
};

Problem make_problem(int64_t rows, int64_t src_rows, const std::vector<int32_t>& src_of, Residual kind,
                     std::mt19937_64& rng) {
  Problem p;
  p.rows = rows;
  p.src_rows = src_rows;
  p.src_of = src_of;
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::normal_distribution<float> n01(0.f, 1.f);
  p.a.resize(size_t(rows) * kK);
  for (auto& v : p.a) v = __float2half(u(rng));
  p.w.resize(size_t(kD) * kK);
  for (auto& v : p.w) v = __float2half(u(rng) * 0.1f);
  p.bias.resize(kD);
  p.ln_w.resize(kD);
  p.ln_b.resize(kD);
  for (int i = 0; i < kD; ++i) {
    p.bias[size_t(i)] = u(rng) * 0.5f;
    p.ln_w[size_t(i)] = 1.f + 0.2f * u(rng);
    p.ln_b[size_t(i)] = 0.2f * u(rng);
  }
  p.x_src.resize(size_t(src_rows) * kD);
  for (int64_t r = 0; r < src_rows; ++r) {
    const float base = kind == Residual::far ? 1e4f : 0.f;
    const float c = n01(rng);
    for (int i = 0; i < kD; ++i) p.x_src[size_t(r * kD + i)] = kind == Residual::constant_rows ? c : base + n01(rng);
  }
  if (kind == Residual::constant_rows) {
    // x is constant along the row only when the product and the bias are: zero them.
    std::fill(p.w.begin(), p.w.end(), __float2half(0.f));
    std::fill(p.bias.begin(), p.bias.end(), 0.f);
  }
  p.x.resize(size_t(rows) * kD);
  p.h.resize(size_t(rows) * kD);
  p.xbound.resize(size_t(rows) * kD);
  p.hscale.resize(size_t(rows));
  std::vector<double> wd(p.w.size());
  for (size_t i = 0; i < wd.size(); ++i) wd[i] = __half2float(p.w[i]);
  std::vector<double> ad(kK);
  for (int64_t r = 0; r < rows; ++r) {
    for (int k = 0; k < kK; ++k) ad[size_t(k)] = __half2float(p.a[size_t(r * kK + k)]);
    const int32_t s = src_of[size_t(r)];
    double mean = 0;
    for (int n = 0; n < kD; ++n) {
      double acc = 0, mag = 0;
      for (int k = 0; k < kK; ++k) {
        acc += ad[size_t(k)] * wd[size_t(n) * kK + size_t(k)];
        mag += std::fabs(ad[size_t(k)] * wd[size_t(n) * kK + size_t(k)]);
      }
      const double res = s >= 0 ? double(p.x_src[size_t(int64_t(s) * kD + n)]) : 0.0;
      const double x = res + acc + double(p.bias[size_t(n)]);
      p.x[size_t(r * kD + n)] = x;
      // fp32 accumulation of K products, then the bias and the residual added (one rounding each)
      const double u = std::ldexp(1.0, -24);
      p.xbound[size_t(r * kD + n)] = double(kK + 1) * u * mag +
                                     2 * u * (std::fabs(acc) + std::fabs(p.bias[size_t(n)]) + std::fabs(x)) + 1e-30;
      mean += x;
    }
    mean /= kD;
    double var = 0;
    for (int n = 0; n < kD; ++n) var += (p.x[size_t(r * kD + n)] - mean) * (p.x[size_t(r * kD + n)] - mean);
    var /= kD;
    const double rstd = 1.0 / std::sqrt(var + double(kEps));
    double xb = 0;
    for (int n = 0; n < kD; ++n) xb = std::max(xb, p.xbound[size_t(r * kD + n)]);
    p.hscale[size_t(r)] = 4 * xb * rstd;
    for (int n = 0; n < kD; ++n)
      p.h[size_t(r * kD + n)] = (p.x[size_t(r * kD + n)] - mean) * rstd * p.ln_w[size_t(n)] + p.ln_b[size_t(n)];
  }
  return p;
}

std::vector<int32_t> identity_rows(int64_t rows) {
  std::vector<int32_t> v(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) v[size_t(r)] = int32_t(r);
  return v;
}

// Device copies of a problem's inputs; a and x_in hold exactly the rows read.
struct Inputs {
  Dev a, w, bias, ln_w, ln_b, x_src;
  explicit Inputs(const Problem& p)
      : a(p.a.size() * 2),
        w(p.w.size() * 2),
        bias(kD * 4),
        ln_w(kD * 4),
        ln_b(kD * 4),
        x_src(p.x_src.size() * 4) {
    a.up(p.a);
    w.up(p.w);
    bias.up(p.bias);
    ln_w.up(p.ln_w);
    ln_b.up(p.ln_b);
    x_src.up(p.x_src);
  }
  hk::cuda::GemmLnParams params(const Problem& p) const {
    hk::cuda::GemmLnParams q;
    q.a = a.as<const __half>();
    q.w = w.as<const __half>();
    q.bias = bias.as<const float>();
    q.x_in = x_src.as<const float>();
    q.ln_w = ln_w.as<const float>();
    q.ln_b = ln_b.as<const float>();
    q.rows = p.rows;
    q.D = kD;
    q.K = kK;
    q.eps = kEps;
    return q;
  }
};

// x_out and h_out (rows + guard rows) against the reference.
void check_non_tail(const Problem& p, const std::vector<float>& x, const std::vector<__half>& h, const std::string& what) {
  int64_t bad_x = 0, bad_h = 0, guard = 0;
  double worst_h = 0;
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int n = 0; n < kD; ++n) {
      const size_t i = size_t(r * kD + n);
      const double xv = x[i], hv = __half2float(h[i]);
      if (!(std::fabs(xv - p.x[i]) <= p.xbound[i])) {
        if (bad_x < 3) std::printf("  %s: x[%lld][%d] = %.9g, want %.9g\n", what.c_str(), (long long)r, n, xv, p.x[i]);
        ++bad_x;
      }
      // one fp16 rounding of LN(x), plus what x's fp32 error and the fp32 statistics move it
      const double bound = p.h_bound(i, n, half_ulp16(p.h[i]) * 1.01);
      const double e = std::fabs(hv - p.h[i]);
      worst_h = std::max(worst_h, std::isfinite(e) ? e / bound : 1e30);
      if (!(e <= bound)) {
        if (bad_h < 3) std::printf("  %s: h[%lld][%d] = %.6g, want %.6g\n", what.c_str(), (long long)r, n, hv, p.h[i]);
        ++bad_h;
      }
    }
  }
  for (size_t i = size_t(p.rows) * kD; i < x.size(); ++i) guard += !is_poison32(x[i]);
  for (size_t i = size_t(p.rows) * kD; i < h.size(); ++i) guard += !is_poison16(h[i]);
  check(bad_x == 0, what + ": x_out within fp32 accumulation of the float64 reference (" + std::to_string(bad_x) + " off)");
  check(bad_h == 0, what + ": h_out within an fp16 rounding of LN(x) (" + std::to_string(bad_h) + " off, worst " +
                        std::to_string(worst_h) + " of the bound)");
  check(guard == 0, what + ": guard rows untouched (" + std::to_string(guard) + " written)");
}

// Non-tail run: fresh buffers, poisoned outputs with guard rows.
void run_non_tail(const Problem& p, bool gather, cudaStream_t s, const std::string& what) {
  Inputs in(p);
  Dev x((size_t(p.rows) + kGuard) * kD * 4), h((size_t(p.rows) + kGuard) * kD * 2), rows_dev(p.src_of.size() * 4 + 4);
  x.poison();
  h.poison();
  hk::cuda::GemmLnParams q = in.params(p);
  if (gather) {
    rows_dev.up(p.src_of);
    q.x_rows = rows_dev.as<const int32_t>();
  }
  q.x_out = x.as<float>();
  q.h_out = h.as<__half>();
  hk::cuda::gemm_ln(q, s);
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaGetLastError());
  check_non_tail(p, x.down<float>((size_t(p.rows) + kGuard) * kD), h.down<__half>((size_t(p.rows) + kGuard) * kD), what);
}

void non_tail_checks(std::mt19937_64& rng, cudaStream_t s) {
  for (const int64_t rows : {int64_t(1), int64_t(17), int64_t(63), int64_t(64), int64_t(65), int64_t(200),
                             int64_t(8256), int64_t(20000)}) {
    const Problem p = make_problem(rows, rows, identity_rows(rows), Residual::random, rng);
    run_non_tail(p, false, s, "rows " + std::to_string(rows));
  }
  {
    const Problem p = make_problem(130, 130, identity_rows(130), Residual::far, rng);
    run_non_tail(p, false, s, "residual 1e4 + N(0, 1), rows 130");
  }
  {
    const Problem p = make_problem(70, 70, identity_rows(70), Residual::constant_rows, rng);
    run_non_tail(p, false, s, "constant rows (LN = its bias), rows 70");
  }
  {
    // Gathered: row r reads source row (r * 7) % 300, every fifth row none (zeros).
    std::vector<int32_t> src(150);
    for (int r = 0; r < 150; ++r) src[size_t(r)] = r % 5 == 4 ? -1 : (r * 7) % 300;
    const Problem p = make_problem(150, 300, src, Residual::random, rng);
    run_non_tail(p, true, s, "residual gathered through x_rows, rows 150");
  }
  {
    // In place: x_out is x_in.
    const int64_t rows = 300;
    const Problem p = make_problem(rows, rows, identity_rows(rows), Residual::random, rng);
    Inputs in(p);
    Dev x((size_t(rows) + kGuard) * kD * 4), h((size_t(rows) + kGuard) * kD * 2);
    x.poison();
    h.poison();
    CHECK_CUDA(cudaMemcpy(x.p, p.x_src.data(), p.x_src.size() * 4, cudaMemcpyHostToDevice));
    hk::cuda::GemmLnParams q = in.params(p);
    q.x_in = x.as<const float>();
    q.x_out = x.as<float>();
    q.h_out = h.as<__half>();
    hk::cuda::gemm_ln(q, s);
    CHECK_CUDA(cudaStreamSynchronize(s));
    check_non_tail(p, x.down<float>((size_t(rows) + kGuard) * kD), h.down<__half>((size_t(rows) + kGuard) * kD),
                   "in place (x_out == x_in), rows 300");
  }
}

// Tail: y = LN(x) on valid rows, zeros on padded rows (dense), scatter through row_dst (packed).
void tail_checks(std::mt19937_64& rng, cudaStream_t s) {
  {
    const int S = 37, B = 6;
    const int64_t rows = int64_t(B) * S;
    const std::vector<int32_t> lengths = {0, 1, S, 20, 36, 5};
    const Problem p = make_problem(rows, rows, identity_rows(rows), Residual::random, rng);
    Inputs in(p);
    Dev y((size_t(rows) + kGuard) * kD * 4), len(lengths.size() * 4);
    y.poison();
    len.up(lengths);
    hk::cuda::GemmLnParams q = in.params(p);
    q.tail = true;
    q.y = y.as<float>();
    q.lengths = len.as<const int32_t>();
    q.S = S;
    hk::cuda::gemm_ln(q, s);
    CHECK_CUDA(cudaStreamSynchronize(s));
    const std::vector<float> got = y.down<float>((size_t(rows) + kGuard) * kD);
    int64_t bad = 0, nonzero_pad = 0, guard = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const bool valid = r % S < lengths[size_t(r / S)];
      for (int n = 0; n < kD; ++n) {
        const size_t i = size_t(r * kD + n);
        if (!valid) {
          nonzero_pad += got[i] != 0.f || std::signbit(got[i]);
        } else if (!(std::fabs(double(got[i]) - p.h[i]) <= p.h_bound(i, n))) {
          if (bad < 3) std::printf("  tail dense: y[%lld][%d] = %.7g, want %.7g\n", (long long)r, n, got[i], p.h[i]);
          ++bad;
        }
      }
    }
    for (size_t i = size_t(rows) * kD; i < got.size(); ++i) guard += !is_poison32(got[i]);
    check(bad == 0, "tail dense (S 37, lengths 0 / 1 / S / random): y within fp32 of the reference (" +
                        std::to_string(bad) + " off)");
    check(nonzero_pad == 0, "tail dense: padded rows exactly +0 (" + std::to_string(nonzero_pad) + " not)");
    check(guard == 0, "tail dense: guard rows untouched");
  }
  {
    // Packed: 100 rows, row r -> y row dst[r] of 160 (a permutation with gaps), every 7th row none.
    const int64_t rows = 100, out_rows = 160;
    std::vector<int32_t> dst(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) dst[size_t(r)] = r % 7 == 6 ? -1 : int32_t((r * 37) % out_rows);
    const Problem p = make_problem(rows, rows, identity_rows(rows), Residual::random, rng);
    Inputs in(p);
    Dev y(size_t(out_rows) * kD * 4), d(dst.size() * 4);
    y.poison();
    d.up(dst);
    hk::cuda::GemmLnParams q = in.params(p);
    q.tail = true;
    q.y = y.as<float>();
    q.row_dst = d.as<const int32_t>();
    hk::cuda::gemm_ln(q, s);
    CHECK_CUDA(cudaStreamSynchronize(s));
    const std::vector<float> got = y.down<float>(size_t(out_rows) * kD);
    std::vector<int64_t> from(size_t(out_rows), -1);
    for (int64_t r = 0; r < rows; ++r)
      if (dst[size_t(r)] >= 0) from[size_t(dst[size_t(r)])] = r;
    int64_t bad = 0, stray = 0;
    for (int64_t o = 0; o < out_rows; ++o) {
      for (int n = 0; n < kD; ++n) {
        const float v = got[size_t(o * kD + n)];
        if (from[size_t(o)] < 0) {
          stray += !is_poison32(v);
        } else {
          const size_t i = size_t(from[size_t(o)] * kD + n);
          bad += !(std::fabs(double(v) - p.h[i]) <= p.h_bound(i, n));
        }
      }
    }
    check(bad == 0, "tail packed (row_dst): scattered y within fp32 of the reference (" + std::to_string(bad) + " off)");
    check(stray == 0, "tail packed: rows no row_dst names untouched (" + std::to_string(stray) + " written)");
  }
}

// rows 0, graph capture, and the route gemm_ln replaces (cuBLASLt residual epilogue + layer_norm).
void route_checks(std::mt19937_64& rng, cudaStream_t s) {
  const int64_t rows = 777;
  const Problem p = make_problem(rows, rows, identity_rows(rows), Residual::random, rng);
  Inputs in(p);
  Dev x(size_t(rows) * kD * 4), h(size_t(rows) * kD * 2), x2(size_t(rows) * kD * 4), h2(size_t(rows) * kD * 2);
  hk::cuda::GemmLnParams q = in.params(p);
  q.x_out = x.as<float>();
  q.h_out = h.as<__half>();
  {
    x.poison();
    h.poison();
    hk::cuda::GemmLnParams z = q;
    z.rows = 0;
    hk::cuda::gemm_ln(z, s);
    CHECK_CUDA(cudaStreamSynchronize(s));
    const std::vector<float> xv = x.down<float>(size_t(rows) * kD);
    check(std::all_of(xv.begin(), xv.end(), is_poison32), "rows 0 writes nothing");
  }
  hk::cuda::gemm_ln(q, s);
  CHECK_CUDA(cudaStreamSynchronize(s));
  const std::vector<float> x_direct = x.down<float>(size_t(rows) * kD);
  const std::vector<__half> h_direct = h.down<__half>(size_t(rows) * kD);
  {
    x.poison();
    h.poison();
    cudaGraph_t g;
    cudaGraphExec_t e;
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    hk::cuda::gemm_ln(q, s);
    CHECK_CUDA(cudaStreamEndCapture(s, &g));
    CHECK_CUDA(cudaGraphInstantiate(&e, g, 0));
    CHECK_CUDA(cudaGraphLaunch(e, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaGraphExecDestroy(e));
    CHECK_CUDA(cudaGraphDestroy(g));
    check(std::memcmp(x.down<float>(size_t(rows) * kD).data(), x_direct.data(), x_direct.size() * 4) == 0 &&
              std::memcmp(h.down<__half>(size_t(rows) * kD).data(), h_direct.data(), h_direct.size() * 2) == 0,
          "graph replay: the same bits as a direct launch");
  }
  cublasLtHandle_t lt = nullptr;
  if (hk::cuda::lt::api().Create(&lt) != CUBLAS_STATUS_SUCCESS) {
    check(false, "cublasLtCreate");
    return;
  }
  {
    hk::cuda::GemmShape gs;
    gs.rows = rows;
    gs.n = kD;
    gs.k = kK;
    gs.out_type = hk::cuda::DType::f32;
    gs.epilogue = hk::cuda::GemmEpilogue::bias_residual;
    hk::cuda::LtGemm gm(lt, gs, in.bias.p);
    Dev ws(hk::cuda::kLtWorkspaceBytes);
    const int bind = gm.bind_bias(in.bias.p);
    gm.run(bind, in.w.p, in.a.p, in.x_src.as<const float>(), x2.p, ws.p, s);
    hk::cuda::layer_norm(x2.as<const float>(), h2.p, hk::cuda::DType::f16, in.ln_w.as<const float>(),
                         in.ln_b.as<const float>(), rows, kD, kEps, s);
    CHECK_CUDA(cudaStreamSynchronize(s));
    const std::vector<float> xl = x2.down<float>(size_t(rows) * kD);
    const std::vector<__half> hl = h2.down<__half>(size_t(rows) * kD);
    int64_t far_x = 0, far_h = 0, differ_h = 0;
    for (size_t i = 0; i < xl.size(); ++i) {
      far_x += !(std::fabs(double(xl[i]) - double(x_direct[i])) <= 2 * p.xbound[i]);
      const double a = __half2float(hl[i]), b = __half2float(h_direct[i]);
      differ_h += a != b;
      far_h += !(std::fabs(a - b) <= 2 * half_ulp16(std::max(std::fabs(a), std::fabs(b))) + p.h_bound(i, int(i % kD)));
    }
    check(far_x == 0, "vs cuBLASLt + layer_norm: x within fp32 accumulation noise (" + std::to_string(far_x) + " off)");
    check(far_h == 0, "vs cuBLASLt + layer_norm: h at most one fp16 ulp apart (" + std::to_string(far_h) + " off)");
    std::printf("vs cuBLASLt + layer_norm: %lld of %zu h elements differ in their last bit\n", (long long)differ_h,
                hl.size());
  }
  hk::cuda::lt::api().Destroy(lt);
}

void contracts(cudaStream_t s) {
  using hk::cuda::gemm_ln_supports;
  check(gemm_ln_supports(256, 256), "gemm_ln_supports(256, 256) on this device");
  check(!gemm_ln_supports(128, 128) && !gemm_ln_supports(256, 512) && !gemm_ln_supports(1024, 1024) &&
            !gemm_ln_supports(0, 256),
        "gemm_ln_supports: false outside D = K = 256");
  check(std::string(hk::cuda::gemm_ln_name(256, 256)) == "hk::gemm_ln[cuda.wgmma.d256.k256]" &&
            std::string(hk::cuda::gemm_ln_name(128, 256)).empty(),
        "gemm_ln_name");
  Dev a(64 * kK * 2 + 16), w(kD * kK * 2), v(kD * 4), x(64 * kD * 4 + 16), h(64 * kD * 2 + 16), rows(64 * 4);
  hk::cuda::GemmLnParams q;
  q.a = a.as<const __half>();
  q.w = w.as<const __half>();
  q.bias = q.ln_w = q.ln_b = v.as<const float>();
  q.x_in = x.as<const float>();
  q.x_out = x.as<float>();
  q.h_out = h.as<__half>();
  q.rows = 64;
  q.D = kD;
  q.K = kK;
  auto throws = [&](hk::cuda::GemmLnParams bad, const std::string& what) {
    bool threw = false;
    try {
      hk::cuda::gemm_ln(bad, s);
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    check(threw, "refused: " + what);
  };
  hk::cuda::GemmLnParams b = q;
  b.K = 128;
  throws(b, "K 128");
  b = q;
  b.D = 128;
  throws(b, "D 128");
  b = q;
  b.a = reinterpret_cast<const __half*>(a.as<char>() + 8);
  throws(b, "a misaligned");
  b = q;
  b.x_in = reinterpret_cast<const float*>(x.as<char>() + 8);
  throws(b, "x_in misaligned");
  b = q;
  b.h_out = nullptr;
  throws(b, "non-tail without h_out");
  b = q;
  b.x_rows = rows.as<const int32_t>();
  throws(b, "gathered residual updated in place");
  b = q;
  b.tail = true;
  throws(b, "tail without y");
  b.y = x.as<float>();
  b.x_rows = rows.as<const int32_t>();
  throws(b, "tail with x_rows");
  b = q;
  b.rows = int64_t(1) << 31;
  throws(b, "rows 2^31");
  CHECK_CUDA(cudaStreamSynchronize(s));
}

void timings(cudaStream_t s) {
  cublasLtHandle_t lt = nullptr;
  if (hk::cuda::lt::api().Create(&lt) != CUBLAS_STATUS_SUCCESS) return;
  std::printf("\nper launch, graph of 20 launches, median of 30 (ms), D = K = 256:\n");
  for (const int64_t rows : {int64_t(4128), int64_t(8256), int64_t(16384), int64_t(65536)}) {
    Dev a(size_t(rows) * kK * 2), w(size_t(kD) * kK * 2), v(kD * 4), x(size_t(rows) * kD * 4),
        h(size_t(rows) * kD * 2), ws(hk::cuda::kLtWorkspaceBytes);
    CHECK_CUDA(cudaMemset(a.p, 0, a.bytes));
    CHECK_CUDA(cudaMemset(w.p, 0, w.bytes));
    CHECK_CUDA(cudaMemset(v.p, 0, v.bytes));
    CHECK_CUDA(cudaMemset(x.p, 0, x.bytes));
    hk::cuda::GemmShape gs;
    gs.rows = rows;
    gs.n = kD;
    gs.k = kK;
    gs.out_type = hk::cuda::DType::f32;
    gs.epilogue = hk::cuda::GemmEpilogue::bias_residual;
    hk::cuda::LtGemm gm(lt, gs, v.p);
    const int bind = gm.bind_bias(v.p);
    const float* vf = v.as<const float>();
    const double split = hk::gputest::graph_ms_per_launch(s, [&] {
      gm.run(bind, w.p, a.p, x.as<const float>(), x.p, ws.p, s);
      hk::cuda::layer_norm(x.as<const float>(), h.p, hk::cuda::DType::f16, vf, vf, rows, kD, kEps, s);
    });
    const double gemm_only =
        hk::gputest::graph_ms_per_launch(s, [&] { gm.run(bind, w.p, a.p, x.as<const float>(), x.p, ws.p, s); });
    hk::cuda::GemmLnParams q;
    q.a = a.as<const __half>();
    q.w = w.as<const __half>();
    q.bias = q.ln_w = q.ln_b = vf;
    q.x_in = x.as<const float>();
    q.x_out = x.as<float>();
    q.h_out = h.as<__half>();
    q.rows = rows;
    q.D = kD;
    q.K = kK;
    const double fused = hk::gputest::graph_ms_per_launch(s, [&] { hk::cuda::gemm_ln(q, s); });
    std::printf("  rows %-6lld cuBLASLt residual + layer_norm %.4f (GEMM alone %.4f)  gemm_ln %.4f  (%.2fx)\n",
                (long long)rows, split, gemm_only, fused, split / fused);
  }
  hk::cuda::lt::api().Destroy(lt);
}

// HK_TEST_PROFILE_ROWS=<rows>: five launches at that size and nothing else (for a profiler).
void profile_launches(int64_t rows, cudaStream_t s) {
  Dev a(size_t(rows) * kK * 2), w(size_t(kD) * kK * 2), v(kD * 4), x(size_t(rows) * kD * 4), h(size_t(rows) * kD * 2);
  CHECK_CUDA(cudaMemset(a.p, 0, a.bytes));
  CHECK_CUDA(cudaMemset(w.p, 0, w.bytes));
  CHECK_CUDA(cudaMemset(v.p, 0, v.bytes));
  CHECK_CUDA(cudaMemset(x.p, 0, x.bytes));
  hk::cuda::GemmLnParams q;
  q.a = a.as<const __half>();
  q.w = w.as<const __half>();
  q.bias = q.ln_w = q.ln_b = v.as<const float>();
  q.x_in = x.as<const float>();
  q.x_out = x.as<float>();
  q.h_out = h.as<__half>();
  q.rows = rows;
  q.D = kD;
  q.K = kK;
  for (int i = 0; i < 5; ++i) hk::cuda::gemm_ln(q, s);
  CHECK_CUDA(cudaStreamSynchronize(s));
}

}  // namespace

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("test_gemm_ln: no CUDA device, skipped\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  if (!hk::cuda::gemm_ln_supports(256, 256)) {
#if defined(HK_TEST_EXPECT_WGMMA) && HK_TEST_EXPECT_WGMMA
    if (prop.major == 9 && prop.minor == 0) {
      std::printf("FAIL gemm_ln not supported on a compute capability 9.0 device with an sm_90a build\n");
      return 1;
    }
#endif
    std::printf("test_gemm_ln: gemm_ln needs sm_90a code on a compute capability 9.0 device, skipped\n");
    return 77;
  }
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937_64 rng(20261201);
  if (const char* pr = std::getenv("HK_TEST_PROFILE_ROWS"); pr && *pr) {
    profile_launches(std::atoll(pr), stream);
    CHECK_CUDA(cudaStreamDestroy(stream));
    return 0;
  }
  try {
    contracts(stream);
    non_tail_checks(rng, stream);
    tail_checks(rng, stream);
    route_checks(rng, stream);
    if (const char* nt = std::getenv("HK_TEST_NO_TIMING"); !(nt && *nt && *nt != '0')) timings(stream);
  } catch (const std::exception& e) {
    std::printf("FAIL exception: %s\n", e.what());
    ++g_failures;
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("\n%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
