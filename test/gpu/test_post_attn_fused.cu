// GPU test of the fused post-attention chain (post_attn_fused.cuh) against a float64 CPU
// reference of the same chain. Standalone program: prints one table row per check, exits 0 when
// all pass, 1 on any failure, 77 when no CUDA device is present (ctest SKIP_RETURN_CODE).
//
// Every case: fresh random inputs (fixed seed per case): o ~ N(0, 0.5^2) in fp16, x ~ N(0, 1),
// weights and biases at nn.Linear init scale (U(+-1/sqrt(fan_in)), GEMM weights and b_in in
// fp16), non-trivial LayerNorm parameters (w ~ U(0.5, 1.5), b ~ U(-0.3, 0.3)); every output
// buffer poisoned with NaN, with 16 guard rows past `rows`. The reference uses the same fp16
// inputs and rounds where the kernel rounds (h = fp16(LN), z = fp16(h Wi^T + bi),
// f = fp16(GELU(z))). Checks:
//   x_out:       |err| <= 1e-3 (fp32 accumulation of fp16 products; the residual is fp32)
//   h_out / y:   |err| <= max(2e-3, 0.02 |ref|) (MODEL.md budget)
//   tail:        padded rows of y exactly zero (their x and o rows are NaN in the "nanpad" cases)
//   unwritten:   no NaN left in any output element the kernel owns
//   guard:       the 16 rows past `rows` of every output untouched; x_in untouched unless aliased
// Large-row cases compare a sample of rows (first, last, random) and exercise the persistent
// loops (many row blocks per warp / CTA, the o double buffer) and explicit tile configurations.
// Hard LayerNorm rows (constant rows: output exactly b; rows of magnitude 1e4 +- 1: fp32
// accuracy) through ln2 and the final LayerNorm of every kernel; the tail with row_dst (packed
// rows scattered to the padded layout) against the dense tail, bit for bit; every configuration
// of post_attn_fused_candidates at 128, 1000 and 8192 rows (valid as given, distinct, correct).
// Then timings (graph replay of 20 launches, median of 30) at the shapes of cases.csv, with the bytes the fused
// chain moves and a rough count for the split route (~40 B per element).
#include "post_attn_fused.cuh"
#include "graph_timing.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using hk::cuda::PostAttnConfig;
using hk::cuda::PostAttnParams;

namespace {

#define CHECK_CUDA(expr)                                                                       \
  do {                                                                                         \
    const cudaError_t err_ = (expr);                                                           \
    if (err_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", #expr, __FILE__, __LINE__,          \
                   cudaGetErrorString(err_));                                                  \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

constexpr int kGuardRows = 16;
constexpr unsigned char kPoison = 0xFF;  // NaN in fp16 and fp32

enum class Lens { none, random, edge };  // none: lengths null (all valid); edge: 0, 1, S mixed
const char* lens_name(Lens l) { return l == Lens::none ? "null" : (l == Lens::random ? "rand" : "0/1/S"); }

struct Case {
  int D = 128, F = 128;
  int64_t rows = 64;
  bool tail = false;
  bool alias = false;     // x_out == x_in
  Lens lens = Lens::none; // tail only
  int S = 1;              // tail only
  bool nan_pad = false;   // tail: x and o rows of padded positions are NaN
  PostAttnConfig cfg{};
  int64_t sample = 0;     // > 0: check only this many rows (first, last, random)
  bool graph = false;     // launch through a captured CUDA graph
  bool gather = false;    // non-tail: the residual read through x_rows from a larger, shuffled buffer
  bool offset8 = false;   // x_in, x_out and y start 8 bytes into their buffers (8- not 16-byte aligned)
  std::string note;
};

// A case of the sweeps: shape, rows, launch configuration and the note its table row shows.
Case sweep_case(int D, int F, int64_t rows, const PostAttnConfig& cfg, const char* note) {
  Case c;
  c.D = D;
  c.F = F;
  c.rows = rows;
  c.cfg = cfg;
  c.sample = rows > 5000 ? 1024 : 0;
  c.note = note;
  return c;
}

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T))); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  // Synchronised: a pageable copy (or memset) may still be landing when cudaMemcpy returns, and
  // the kernels run on a non-blocking stream that does not wait for it.
  void up(const std::vector<T>& v) {
    CHECK_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  std::vector<T> down() const {
    std::vector<T> v(n);
    CHECK_CUDA(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  void poison() {
    CHECK_CUDA(cudaMemset(p, kPoison, std::max<size_t>(n, 1) * sizeof(T)));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
};

double h2d(__half h) { return double(__half2float(h)); }
double round_f16(double v) { return double(__half2float(__double2half(v))); }
bool poison_f32(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u == 0xFFFFFFFFu;
}
bool poison_f16(__half v) {
  uint16_t u;
  std::memcpy(&u, &v, 2);
  return u == 0xFFFFu;
}

struct Model {
  int D, F;
  std::vector<__half> w_o, w_in, b_in, w_out;
  std::vector<float> b_o, ln2_w, ln2_b, b_out, lnn_w, lnn_b;
  std::vector<double> w_o_d, w_in_d, b_in_d, w_out_d;  // the fp16 values, for the reference
};

Model make_model(int D, int F, std::mt19937_64& rng) {
  Model m;
  m.D = D;
  m.F = F;
  auto uni = [&](double a) { return std::uniform_real_distribution<double>(-a, a)(rng); };
  auto fill_h = [&](std::vector<__half>& v, size_t n, double a) {
    v.resize(n);
    for (auto& e : v) e = __double2half(uni(a));
  };
  auto fill_f = [&](std::vector<float>& v, size_t n, double lo, double hi) {
    v.resize(n);
    for (auto& e : v) e = float(std::uniform_real_distribution<double>(lo, hi)(rng));
  };
  const double ad = 1.0 / std::sqrt(double(D)), af = 1.0 / std::sqrt(double(F));
  fill_h(m.w_o, size_t(D) * D, ad);
  fill_f(m.b_o, D, -ad, ad);
  fill_f(m.ln2_w, D, 0.5, 1.5);
  fill_f(m.ln2_b, D, -0.3, 0.3);
  fill_h(m.w_in, size_t(F) * D, ad);
  fill_h(m.b_in, F, ad);
  fill_h(m.w_out, size_t(D) * F, af);
  fill_f(m.b_out, D, -af, af);
  fill_f(m.lnn_w, D, 0.5, 1.5);
  fill_f(m.lnn_b, D, -0.3, 0.3);
  auto widen = [](const std::vector<__half>& v) {
    std::vector<double> d(v.size());
    for (size_t i = 0; i < v.size(); ++i) d[i] = h2d(v[i]);
    return d;
  };
  m.w_o_d = widen(m.w_o);
  m.w_in_d = widen(m.w_in);
  m.b_in_d = widen(m.b_in);
  m.w_out_d = widen(m.w_out);
  return m;
}

void layer_norm(const std::vector<double>& x, const float* w, const float* b, double eps, std::vector<double>& out) {
  const size_t D = x.size();
  double mean = 0;
  for (double v : x) mean += v;
  mean /= double(D);
  double var = 0;
  for (double v : x) var += (v - mean) * (v - mean);
  var /= double(D);
  const double rstd = 1.0 / std::sqrt(var + eps);
  out.resize(D);
  for (size_t i = 0; i < D; ++i) out[i] = (x[i] - mean) * rstd * double(w[i]) + double(b[i]);
}

// The chain for one row: x_out (fp32 residual after the layer) and the final LayerNorm (h_out or y).
// tanh_gelu: the GELU in its tanh form (the kernels' gelu_tanh configurations), else the exact erf.
void reference_row(const Model& m, const __half* o, const float* x, double eps, std::vector<double>& x_out,
                   std::vector<double>& ln_out, bool tanh_gelu = false) {
  const int D = m.D, F = m.F;
  std::vector<double> od(D), x1(D), h, z(F);
  for (int k = 0; k < D; ++k) od[size_t(k)] = h2d(o[k]);
  for (int n = 0; n < D; ++n) {
    double s = 0;
    for (int k = 0; k < D; ++k) s += od[size_t(k)] * m.w_o_d[size_t(n) * D + k];
    x1[n] = double(x[n]) + s + double(m.b_o[n]);
  }
  layer_norm(x1, m.ln2_w.data(), m.ln2_b.data(), eps, h);
  for (auto& v : h) v = round_f16(v);
  for (int n = 0; n < F; ++n) {
    double s = 0;
    for (int k = 0; k < D; ++k) s += h[size_t(k)] * m.w_in_d[size_t(n) * D + k];
    const double zz = round_f16(s + m.b_in_d[size_t(n)]);
    const double phi = tanh_gelu ? 0.5 * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (zz + 0.044715 * zz * zz * zz)))
                                 : 0.5 * (1.0 + std::erf(zz / std::sqrt(2.0)));
    z[n] = round_f16(zz * phi);
  }
  x_out.resize(D);
  for (int n = 0; n < D; ++n) {
    double s = 0;
    for (int k = 0; k < F; ++k) s += z[size_t(k)] * m.w_out_d[size_t(n) * F + k];
    x_out[n] = x1[n] + s + double(m.b_out[n]);
  }
  layer_norm(x_out, m.lnn_w.data(), m.lnn_b.data(), eps, ln_out);
}

struct Outcome {
  double x_err = 0, ratio = 0;
  long bad_x = 0, bad_ln = 0, unwritten = 0, pad_nonzero = 0, guard = 0, x_in_changed = 0;
  int64_t checked_rows = 0;
  uint64_t hash = 0;  // FNV-1a over the output bytes (x_out and h, or y): same data, same kernel, same bits
  std::string error;
  bool ok() const {
    return error.empty() && bad_x == 0 && bad_ln == 0 && unwritten == 0 && pad_nonzero == 0 && guard == 0 &&
           x_in_changed == 0;
  }
};

// Runs launch(stream) once on a fresh non-blocking stream, directly or (graph) through a captured
// CUDA graph; returns the exception text or "".
template <class Launch>
std::string run_sync(const Launch& launch, bool graph) {
  try {
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (graph) {
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      launch(s);
      CHECK_CUDA(cudaStreamEndCapture(s, &g));
      CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
      CHECK_CUDA(cudaGraphLaunch(ge, s));
      CHECK_CUDA(cudaStreamSynchronize(s));
      CHECK_CUDA(cudaGraphExecDestroy(ge));
      CHECK_CUDA(cudaGraphDestroy(g));
    } else {
      launch(s);
    }
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaStreamDestroy(s));
  } catch (const std::exception& e) {
    return e.what();
  }
  CHECK_CUDA(cudaGetLastError());
  return "";
}
std::string launch_sync(const PostAttnParams& p, const PostAttnConfig& cfg, bool graph = false) {
  return run_sync([&](cudaStream_t s) { hk::cuda::post_attn_fused(p, s, cfg); }, graph);
}

Outcome run_case(const Case& c, uint64_t seed) {
  Outcome out;
  if (!hk::cuda::post_attn_fused_supports(c.D, c.F)) {
    out.error = "unsupported";
    return out;
  }
  std::mt19937_64 rng(seed);
  const int D = c.D, F = c.F;
  const int64_t rows = c.rows, alloc_rows = rows + kGuardRows;
  const float eps = 1e-5f;
  const Model m = make_model(D, F, rng);

  // lengths (tail): sequences of S rows; the last one may be partial.
  const int64_t B = (rows + c.S - 1) / c.S;
  std::vector<int32_t> lengths;
  if (c.tail && c.lens != Lens::none) {
    lengths.resize(size_t(std::max<int64_t>(B, 1)));
    std::uniform_int_distribution<int> ul(0, c.S);
    for (int64_t b = 0; b < B; ++b) {
      if (c.lens == Lens::edge) {
        const int pick = int(b % 3);
        lengths[size_t(b)] = pick == 0 ? 0 : (pick == 1 ? 1 : c.S);
      } else {
        lengths[size_t(b)] = ul(rng);
      }
    }
  }
  auto valid_row = [&](int64_t r) {
    if (!c.tail || c.lens == Lens::none) return true;
    return (r % c.S) < lengths[size_t(r / c.S)];
  };

  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<__half> o(size_t(alloc_rows) * D);
  std::vector<float> x(size_t(alloc_rows) * D);
  const __half nan_h = __float2half(std::nanf(""));
  for (int64_t r = 0; r < alloc_rows; ++r) {
    const bool nan_row = r >= rows || (c.nan_pad && !valid_row(r));
    for (int k = 0; k < D; ++k) {
      o[size_t(r) * D + k] = nan_row ? nan_h : __double2half(0.5 * nd(rng));
      x[size_t(r) * D + k] = nan_row ? std::nanf("") : float(nd(rng));
    }
  }

  // Gathered residual: x_rows[r] = a shuffled row of a source buffer with 37 more rows than the
  // chain (every 13th chain row -1: reads zeros), the source rows no chain row names are NaN (a
  // read of one reaches the output); x then holds what each chain row should see.
  std::vector<int32_t> x_rows;
  std::vector<float> x_src;
  if (c.gather) {
    const int64_t src_rows = rows + 37;
    std::vector<int32_t> perm(static_cast<size_t>(src_rows));
    for (int64_t i = 0; i < src_rows; ++i) perm[size_t(i)] = int32_t(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    x_src.assign(size_t(src_rows) * D, std::nanf(""));
    x_rows.resize(size_t(rows));
    for (int64_t r = 0; r < rows; ++r) {
      x_rows[size_t(r)] = r % 13 == 5 ? -1 : perm[size_t(r)];
      for (int k = 0; k < D; ++k) {
        float& v = x[size_t(r) * D + k];
        if (x_rows[size_t(r)] < 0) {
          v = 0.f;
        } else {
          x_src[size_t(x_rows[size_t(r)]) * D + k] = v;
        }
      }
    }
  }
  // offset8: the fp32 row buffers hold `off` leading floats; the kernel sees them from p + off.
  const size_t off = c.offset8 ? 2 : 0;
  auto shifted = [&](const std::vector<float>& v) {
    std::vector<float> w(off, 0.f);
    w.insert(w.end(), v.begin(), v.end());
    return w;
  };
  // Drops the leading floats, counting those the launch changed (zeros uploaded, or the poison) as
  // writes outside the rows (out.guard).
  auto unshifted = [&](std::vector<float> v) {
    const size_t n = std::min(off, v.size());
    for (size_t i = 0; i < n; ++i)
      if (v[i] != 0.f && !poison_f32(v[i])) ++out.guard;
    v.erase(v.begin(), v.begin() + std::ptrdiff_t(n));
    return v;
  };
  Dev<float> d_xsrc(x_src.size() + off);
  Dev<int32_t> d_xrows(x_rows.size());
  if (c.gather) {
    d_xsrc.up(shifted(x_src));
    d_xrows.up(x_rows);
  }

  Dev<__half> d_o(o.size()), d_w_o(m.w_o.size()), d_w_in(m.w_in.size()), d_b_in(m.b_in.size()), d_w_out(m.w_out.size());
  Dev<float> d_x(x.size() + off), d_b_o(D), d_ln2_w(D), d_ln2_b(D), d_b_out(D), d_lnn_w(D), d_lnn_b(D);
  Dev<float> d_xo(c.alias || c.tail ? 0 : x.size() + off), d_y(c.tail ? x.size() + off : 0);
  Dev<__half> d_h(c.tail ? 0 : o.size());
  Dev<int32_t> d_len(lengths.size());
  d_o.up(o);
  d_x.up(shifted(x));
  d_w_o.up(m.w_o);
  d_w_in.up(m.w_in);
  d_b_in.up(m.b_in);
  d_w_out.up(m.w_out);
  d_b_o.up(m.b_o);
  d_ln2_w.up(m.ln2_w);
  d_ln2_b.up(m.ln2_b);
  d_b_out.up(m.b_out);
  d_lnn_w.up(m.lnn_w);
  d_lnn_b.up(m.lnn_b);
  if (!lengths.empty()) d_len.up(lengths);
  if (!c.alias && !c.tail) d_xo.poison();
  if (c.tail) d_y.poison();
  if (!c.tail) d_h.poison();
  if (c.alias) {  // guard rows of the aliased buffer: poison, so that writes past `rows` show
    CHECK_CUDA(cudaMemset(d_x.p + off + size_t(rows) * D, kPoison, size_t(kGuardRows) * D * sizeof(float)));
    CHECK_CUDA(cudaDeviceSynchronize());
  }

  PostAttnParams p;
  p.o = d_o.p;
  p.x_in = (c.gather ? d_xsrc.p : d_x.p) + off;
  p.x_rows = c.gather ? d_xrows.p : nullptr;
  p.x_out = c.tail ? nullptr : (c.alias ? d_x.p : d_xo.p) + off;
  p.w_o = d_w_o.p;
  p.b_o = d_b_o.p;
  p.ln2_w = d_ln2_w.p;
  p.ln2_b = d_ln2_b.p;
  p.w_in = d_w_in.p;
  p.b_in = d_b_in.p;
  p.w_out = d_w_out.p;
  p.b_out = d_b_out.p;
  p.ln_next_w = d_lnn_w.p;
  p.ln_next_b = d_lnn_b.p;
  p.h_out = c.tail ? nullptr : d_h.p;
  p.y = c.tail ? d_y.p + off : nullptr;
  p.lengths = lengths.empty() ? nullptr : d_len.p;
  p.S = c.S;
  p.tail = c.tail;
  p.rows = rows;
  p.D = D;
  p.F = F;
  p.eps = eps;

  out.error = launch_sync(p, c.cfg, c.graph);
  if (!out.error.empty()) return out;

  const std::vector<float> xin_after = unshifted(d_x.down());
  const std::vector<float> xo = c.tail ? std::vector<float>() : (c.alias ? xin_after : unshifted(d_xo.down()));
  const std::vector<__half> h = c.tail ? std::vector<__half>() : d_h.down();
  const std::vector<float> y = c.tail ? unshifted(d_y.down()) : std::vector<float>();

  // Rows to check.
  std::vector<int64_t> check;
  if (c.sample > 0 && c.sample < rows) {
    const int64_t edge = std::min<int64_t>(c.sample / 4, rows);
    for (int64_t r = 0; r < edge; ++r) check.push_back(r);
    for (int64_t r = rows - edge; r < rows; ++r) check.push_back(r);
    std::uniform_int_distribution<int64_t> ur(0, rows - 1);
    while (int64_t(check.size()) < c.sample) check.push_back(ur(rng));
  } else {
    for (int64_t r = 0; r < rows; ++r) check.push_back(r);
  }
  out.checked_rows = int64_t(check.size());

  // The GELU form the launch runs (the tanh form exists for the exact resident kernels only).
  const bool tanh_gelu = hk::cuda::post_attn_fused_effective(D, F, rows, c.cfg).gelu_tanh != 0;
  std::vector<double> rx, rln;
  for (const int64_t r : check) {
    const bool valid = valid_row(r);
    if (c.tail && !valid) {
      for (int k = 0; k < D; ++k) {
        const float v = y[size_t(r) * D + k];
        if (poison_f32(v)) ++out.unwritten;
        else if (v != 0.f) ++out.pad_nonzero;
      }
      continue;
    }
    reference_row(m, &o[size_t(r) * D], &x[size_t(r) * D], eps, rx, rln, tanh_gelu);
    for (int k = 0; k < D; ++k) {
      const size_t i = size_t(r) * D + k;
      if (!c.tail) {
        const float v = xo[i];
        if (poison_f32(v)) {
          ++out.unwritten;
        } else {
          const double e = std::fabs(double(v) - rx[size_t(k)]);
          if (!(e <= 1e-3)) ++out.bad_x;
          if (std::isfinite(e)) out.x_err = std::max(out.x_err, e);
        }
      }
      const double got = c.tail ? double(y[i]) : h2d(h[i]);
      const bool unw = c.tail ? poison_f32(y[i]) : poison_f16(h[i]);
      if (unw) {
        ++out.unwritten;
        continue;
      }
      const double ref = rln[size_t(k)];
      const double tol = std::max(2e-3, 0.02 * std::fabs(ref));
      const double e = std::fabs(got - ref);
      if (!(e <= tol)) ++out.bad_ln;
      out.ratio = std::max(out.ratio, std::isfinite(e) ? e / tol : 1e30);
    }
  }
  auto fnv = [&](const void* data, size_t bytes) {
    const unsigned char* b = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) out.hash = (out.hash ^ b[i]) * 1099511628211ull;
  };
  out.hash = 1469598103934665603ull;
  if (c.tail) {
    fnv(y.data(), y.size() * sizeof(float));
  } else {
    fnv(xo.data(), xo.size() * sizeof(float));
    fnv(h.data(), h.size() * sizeof(__half));
  }
  // Guard rows and the input residual.
  for (size_t i = size_t(rows) * D; i < size_t(alloc_rows) * D; ++i) {
    if (!c.tail && !poison_f32(xo[i])) ++out.guard;
    if (!c.tail && !poison_f16(h[i])) ++out.guard;
    if (c.tail && !poison_f32(y[i])) ++out.guard;
  }
  if (c.gather) {
    const std::vector<float> src_after = unshifted(d_xsrc.down());
    for (size_t i = 0; i < x_src.size(); ++i) {
      if (std::memcmp(&src_after[i], &x_src[i], 4) != 0) ++out.x_in_changed;
    }
  } else if (!c.alias) {
    for (size_t i = 0; i < size_t(rows) * D; ++i) {
      if (std::memcmp(&xin_after[i], &x[i], 4) != 0) ++out.x_in_changed;
    }
  }
  return out;
}

std::string cfg_name(const PostAttnConfig& c) {
  if (c.warps == 0 && c.prefetch < 0 && c.split == 0)
    return std::string(c.gelu_tanh ? "auto.tanh" : "auto") + (c.wgmma ? ".wg" : "");
  return "w" + (c.warps ? std::to_string(c.warps) : std::string("-")) + ".pf" +
         (c.prefetch < 0 ? std::string("-") : std::to_string(c.prefetch)) +
         (c.split > 0 ? ".s" + std::to_string(c.split) : std::string()) + (c.reg_weights ? "r" : "") +
         (c.gelu_tanh ? ".tanh" : "") + (c.wgmma ? ".wg" : "");
}

// ---- shared setup of the extra checks ------------------------------------------------------------
struct DevModel {
  Dev<__half> w_o, w_in, b_in, w_out;
  Dev<float> b_o, ln2_w, ln2_b, b_out, lnn_w, lnn_b;
  explicit DevModel(const Model& m)
      : w_o(m.w_o.size()), w_in(m.w_in.size()), b_in(m.b_in.size()), w_out(m.w_out.size()), b_o(m.b_o.size()),
        ln2_w(m.ln2_w.size()), ln2_b(m.ln2_b.size()), b_out(m.b_out.size()), lnn_w(m.lnn_w.size()),
        lnn_b(m.lnn_b.size()) {
    w_o.up(m.w_o);
    w_in.up(m.w_in);
    b_in.up(m.b_in);
    w_out.up(m.w_out);
    b_o.up(m.b_o);
    ln2_w.up(m.ln2_w);
    ln2_b.up(m.ln2_b);
    b_out.up(m.b_out);
    lnn_w.up(m.lnn_w);
    lnn_b.up(m.lnn_b);
  }
  PostAttnParams params(const Model& m) const {
    PostAttnParams p;
    p.w_o = w_o.p;
    p.b_o = b_o.p;
    p.ln2_w = ln2_w.p;
    p.ln2_b = ln2_b.p;
    p.w_in = w_in.p;
    p.b_in = b_in.p;
    p.w_out = w_out.p;
    p.b_out = b_out.p;
    p.ln_next_w = lnn_w.p;
    p.ln_next_b = lnn_b.p;
    p.D = m.D;
    p.F = m.F;
    p.eps = 1e-5f;
    return p;
  }
};

void refresh_model(Model& m) {
  auto widen = [](const std::vector<__half>& v) {
    std::vector<double> d(v.size());
    for (size_t i = 0; i < v.size(); ++i) d[i] = h2d(v[i]);
    return d;
  };
  m.w_o_d = widen(m.w_o);
  m.w_in_d = widen(m.w_in);
  m.b_in_d = widen(m.b_in);
  m.w_out_d = widen(m.w_out);
}

// ---- LayerNorm on hard rows ----------------------------------------------------------------------
// exact:    Wo = bo = Wf = bf = 0 and o = 0, so the layer adds nothing: the kernel holds the
//           residual relative to its row's first element c, so x_out must be fp32((x - c) + c)
//           bit for bit (x itself wherever x - c is exact: constant and 1e4 +- 1 rows), and the
//           next LayerNorm sees x: rows constant (output must be b exactly), 1e4 + U(-1, 1),
//           -2e4 constant and N(0, 1). y (fp32): |err| <= 2e-5 (1 + |ref|); h_out (fp16): one
//           fp16 rounding + 1e-4. The unshifted statistics miss the 1e4 rows by ~1e-3 and
//           constant 1e4 rows by ~0.3.
// ln2:      o = 0, Wo = bo = 0, constant rows c in [9000, 15000) and live FFN weights (layer only):
//           ln2 of a constant row is exactly fp16(ln2_b), so x_out = c + FFN(fp16(ln2_b)) matches
//           the reference within 2 ceil(F/16) + 4 fp32 ulps at 1e4 (the relative residual leaves
//           one rounding to ulp(1e4), at the store); an inexact ln2 (variance ~1e-6 instead of 0:
//           rstd ~300) moves x_out by ~0.1 (~100 ulps). h_out is checked against LN of the float64
//           reference x (the kernel normalises its residual before rounding it to x_out's ulp),
//           allowing for one upstream fp16 rounding the reference cannot reproduce.
enum class LnMode { exact, ln2 };

struct LnOutcome {
  long bad = 0, not_exact = 0, unwritten = 0;
  double ratio = 0;
  std::string error;
  bool ok() const { return error.empty() && bad == 0 && not_exact == 0 && unwritten == 0; }
};

LnOutcome run_ln_case(int D, int F, int64_t rows, bool tail, LnMode mode, uint64_t seed, const PostAttnConfig& cfg) {
  LnOutcome out;
  if (!hk::cuda::post_attn_fused_supports(D, F)) {
    out.error = "unsupported";
    return out;
  }
  std::mt19937_64 rng(seed);
  Model m = make_model(D, F, rng);
  std::fill(m.w_o.begin(), m.w_o.end(), __float2half(0.f));
  std::fill(m.b_o.begin(), m.b_o.end(), 0.f);
  if (mode == LnMode::exact) {
    std::fill(m.w_out.begin(), m.w_out.end(), __float2half(0.f));
    std::fill(m.b_out.begin(), m.b_out.end(), 0.f);
  }
  refresh_model(m);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<float> x(size_t(rows) * D);
  std::vector<int> kind(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int k = mode == LnMode::ln2 ? 1 : int(r % 4);
    kind[size_t(r)] = k;
    float* xr = &x[size_t(r) * D];
    const float c = mode == LnMode::ln2 ? float(12000.0 + 3000.0 * u(rng)) : float(1e4 * (1.0 + 0.3 * u(rng)));
    for (int j = 0; j < D; ++j) {
      xr[j] = k == 0 ? float(nd(rng)) : k == 1 ? c : k == 2 ? float(1e4 + u(rng)) : -2.0f * c;
    }
  }
  std::vector<__half> o(x.size(), __float2half(0.f));
  const DevModel dm(m);
  Dev<__half> d_o(o.size()), d_h(tail ? 0 : o.size());
  Dev<float> d_x(x.size()), d_xo(tail ? 0 : x.size()), d_y(tail ? x.size() : 0);
  d_o.up(o);
  d_x.up(x);
  if (tail) d_y.poison();
  else {
    d_xo.poison();
    d_h.poison();
  }
  PostAttnParams p = dm.params(m);
  p.o = d_o.p;
  p.x_in = d_x.p;
  p.x_out = tail ? nullptr : d_xo.p;
  p.h_out = tail ? nullptr : d_h.p;
  p.y = tail ? d_y.p : nullptr;
  p.tail = tail;
  p.rows = rows;
  out.error = launch_sync(p, cfg);
  if (!out.error.empty()) return out;
  const std::vector<float> xo = tail ? std::vector<float>() : d_xo.down();
  const std::vector<__half> h = tail ? std::vector<__half>() : d_h.down();
  const std::vector<float> y = tail ? d_y.down() : std::vector<float>();
  const double eps = 1e-5;
  std::vector<double> rx, rln, xin(static_cast<size_t>(D));
  for (int64_t r = 0; r < rows; ++r) {
    const size_t base = size_t(r) * D;
    if (mode == LnMode::exact) {
      for (int j = 0; j < D; ++j) xin[size_t(j)] = double(x[base + j]);
      layer_norm(xin, m.lnn_w.data(), m.lnn_b.data(), eps, rln);
      for (int j = 0; j < D; ++j) {
        if (!tail) {
          volatile float rel = x[base + j] - x[base];  // fp32, as the kernel: (x - c) + c
          const float expect = rel + x[base];
          if (std::memcmp(&xo[base + j], &expect, 4) != 0) ++out.not_exact;
        }
        const bool constant = kind[size_t(r)] == 1 || kind[size_t(r)] == 3;
        double got, tol;
        if (tail) {
          if (poison_f32(y[base + j])) { ++out.unwritten; continue; }
          got = double(y[base + j]);
          tol = 2e-5 * (1.0 + std::fabs(rln[size_t(j)]));
          if (constant && !(y[base + j] == m.lnn_b[size_t(j)])) ++out.not_exact;
        } else {
          if (poison_f16(h[base + j])) { ++out.unwritten; continue; }
          got = h2d(h[base + j]);
          tol = std::ldexp(std::fabs(rln[size_t(j)]), -11) + 1e-4;
          if (constant && !(__half2float(h[base + j]) == __half2float(__float2half_rn(m.lnn_b[size_t(j)])))) {
            ++out.not_exact;
          }
        }
        const double e = std::fabs(got - rln[size_t(j)]);
        if (!(e <= tol)) ++out.bad;
        out.ratio = std::max(out.ratio, std::isfinite(e) ? e / tol : 1e30);
      }
    } else {
      reference_row(m, &o[base], &x[base], eps, rx, rln);
      const double xtol = double(2 * ((F + 15) / 16) + 4) * std::ldexp(1.0, -10);
      for (int j = 0; j < D; ++j) {
        if (poison_f32(xo[base + j])) { ++out.unwritten; continue; }
        const double e = std::fabs(double(xo[base + j]) - rx[size_t(j)]);
        if (!(e <= xtol)) ++out.not_exact;
        out.ratio = std::max(out.ratio, std::isfinite(e) ? e / xtol : 1e30);
        xin[size_t(j)] = rx[size_t(j)];
      }
      layer_norm(xin, m.lnn_w.data(), m.lnn_b.data(), eps, rln);
      // One upstream rounding the float64 reference cannot reproduce (a z or GELU value within
      // fp32 error of an fp16 rounding boundary: ~1 in 20 of these models) moves x by up to two
      // fp16 ulps of one f times its Wf entry; this row's LayerNorm scales that by its rstd (the
      // spread is ~0.1 against 1.2e4). Unshifted statistics miss these rows by O(1), far beyond.
      double fmax = 0;  // |f| <= |z| <= sum |h| |Wi| + |bi|, h = fp16(ln2_b) on these rows
      for (int n = 0; n < F; ++n) {
        double z = std::fabs(m.b_in_d[size_t(n)]);
        for (int k = 0; k < D; ++k) z += std::fabs(round_f16(m.ln2_b[size_t(k)]) * m.w_in_d[size_t(n) * D + k]);
        fmax = std::max(fmax, z);
      }
      double mean = 0, var = 0;
      for (int j = 0; j < D; ++j) mean += xin[size_t(j)];
      mean /= D;
      for (int j = 0; j < D; ++j) var += (xin[size_t(j)] - mean) * (xin[size_t(j)] - mean);
      const double rstd = 1.0 / std::sqrt(var / D + eps);
      for (int j = 0; j < D; ++j) {
        if (poison_f16(h[base + j])) { ++out.unwritten; continue; }
        double wf = 0;
        for (int n = 0; n < F; ++n) wf = std::max(wf, std::fabs(m.w_out_d[size_t(j) * F + n]));
        const double flip = 2.0 * std::ldexp(fmax, -10) * wf * rstd * std::fabs(double(m.lnn_w[size_t(j)]));
        const double tol = std::ldexp(std::fabs(rln[size_t(j)]), -11) + 1e-4 + flip;
        if (!(std::fabs(h2d(h[base + j]) - rln[size_t(j)]) <= tol)) ++out.bad;
      }
    }
  }
  return out;
}

// ---- tail with row_dst (packed layout) against the dense tail on the same packed rows -----------
// Packed rows: T valid rows (sequence b, position s -> padded row b * S + s) and Tcap - T tail rows
// (zeros, row_dst -1). The row_dst launch must reproduce the dense launch bit for bit in the
// destination rows and leave every other row of y untouched; lengths (all zeros here) and S are
// ignored. The dense y is also checked against the float64 reference.
struct DstOutcome {
  long mismatch = 0, stray = 0, bad = 0, unwritten = 0;
  double ratio = 0;
  int64_t T = 0, Tcap = 0;
  std::string error;
  bool ok() const { return error.empty() && mismatch == 0 && stray == 0 && bad == 0 && unwritten == 0; }
};

DstOutcome run_row_dst_case(int D, int F, int B, int S, int extra, const PostAttnConfig& cfg, uint64_t seed) {
  DstOutcome out;
  if (!hk::cuda::post_attn_fused_supports(D, F)) {
    out.error = "unsupported";
    return out;
  }
  std::mt19937_64 rng(seed);
  const Model m = make_model(D, F, rng);
  std::vector<int32_t> lengths(static_cast<size_t>(B));
  std::uniform_int_distribution<int> ul(0, S);
  for (int b = 0; b < B; ++b) lengths[size_t(b)] = b % 5 == 0 ? 0 : (b % 5 == 1 ? S : (b % 5 == 2 ? 1 : ul(rng)));
  std::vector<int32_t> row_dst;
  for (int b = 0; b < B; ++b) {
    for (int s = 0; s < lengths[size_t(b)]; ++s) row_dst.push_back(b * S + s);
  }
  const int64_t T = int64_t(row_dst.size()), Tcap = T + extra, padded = int64_t(B) * S;
  out.T = T;
  out.Tcap = Tcap;
  row_dst.resize(size_t(Tcap), -1);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<__half> o(size_t(Tcap) * D, __float2half(0.f));
  std::vector<float> x(size_t(Tcap) * D, 0.f);
  for (int64_t r = 0; r < T; ++r) {
    for (int k = 0; k < D; ++k) {
      o[size_t(r) * D + k] = __double2half(0.5 * nd(rng));
      x[size_t(r) * D + k] = float(nd(rng));
    }
  }
  const DevModel dm(m);
  Dev<__half> d_o(o.size());
  Dev<float> d_x(x.size()), d_dense(size_t(Tcap + kGuardRows) * D), d_pad(size_t(padded + kGuardRows) * D);
  Dev<int32_t> d_dst(row_dst.size()), d_len(lengths.size());
  d_o.up(o);
  d_x.up(x);
  d_dst.up(row_dst);
  d_len.up(std::vector<int32_t>(lengths.size(), 0));
  d_dense.poison();
  d_pad.poison();
  PostAttnParams p = dm.params(m);
  p.o = d_o.p;
  p.x_in = d_x.p;
  p.tail = true;
  p.rows = Tcap;
  p.y = d_dense.p;
  out.error = launch_sync(p, cfg);
  if (!out.error.empty()) return out;
  p.y = d_pad.p;
  p.row_dst = d_dst.p;
  p.lengths = d_len.p;
  p.S = 1;
  out.error = launch_sync(p, cfg);
  if (!out.error.empty()) return out;
  const std::vector<float> dense = d_dense.down(), pad = d_pad.down();
  std::vector<int64_t> src_of(size_t(padded), -1);
  for (int64_t r = 0; r < T; ++r) src_of[size_t(row_dst[size_t(r)])] = r;
  for (int64_t q = 0; q < padded + kGuardRows; ++q) {
    const int64_t r = q < padded ? src_of[size_t(q)] : -1;
    for (int k = 0; k < D; ++k) {
      const float v = pad[size_t(q) * D + k];
      if (r < 0) {
        out.stray += !poison_f32(v);
      } else if (std::memcmp(&v, &dense[size_t(r) * D + k], 4) != 0) {
        ++out.mismatch;
      }
    }
  }
  std::vector<double> rx, rln;
  for (int64_t r = 0; r < Tcap; ++r) {
    reference_row(m, &o[size_t(r) * D], &x[size_t(r) * D], 1e-5, rx, rln);
    for (int k = 0; k < D; ++k) {
      const float v = dense[size_t(r) * D + k];
      if (poison_f32(v)) { ++out.unwritten; continue; }
      const double tol = std::max(2e-3, 0.02 * std::fabs(rln[size_t(k)]));
      const double e = std::fabs(double(v) - rln[size_t(k)]);
      if (!(e <= tol)) ++out.bad;
      out.ratio = std::max(out.ratio, std::isfinite(e) ? e / tol : 1e30);
    }
  }
  for (size_t i = size_t(Tcap) * D; i < dense.size(); ++i) out.stray += !poison_f32(dense[i]);
  return out;
}

// ---- timing ---------------------------------------------------------------------------------------
struct TimingShape {
  const char* name;
  int D, F;
  int64_t rows;
  bool tail;
  PostAttnConfig cfg;
};

void time_shape(const TimingShape& t, double copy_gbs) {
  if (!hk::cuda::post_attn_fused_supports(t.D, t.F)) {
    std::printf("%-28s unsupported\n", t.name);
    return;
  }
  const size_t n = size_t(t.rows) * t.D;
  Dev<__half> o(n), h(n), w_o(size_t(t.D) * t.D), w_in(size_t(t.F) * t.D), w_out(size_t(t.D) * t.F), b_in(t.F);
  Dev<float> x(n), xo(n), b(t.D);
  // Finite, bounded contents: 0x3C00 in every half (1.0 at fp16), zeros for floats would be
  // degenerate for LN; use a small pattern via memset bytes 0x20 (fp16 ~0.0092, fp32 ~1.4e-19).
  CHECK_CUDA(cudaMemset(o.p, 0x20, n * 2));
  CHECK_CUDA(cudaMemset(x.p, 0x3C, n * 4));
  CHECK_CUDA(cudaMemset(w_o.p, 0x20, w_o.n * 2));
  CHECK_CUDA(cudaMemset(w_in.p, 0x20, w_in.n * 2));
  CHECK_CUDA(cudaMemset(w_out.p, 0x20, w_out.n * 2));
  CHECK_CUDA(cudaMemset(b_in.p, 0, b_in.n * 2));
  CHECK_CUDA(cudaMemset(b.p, 0x3C, b.n * 4));
  PostAttnParams p;
  p.o = o.p;
  p.x_in = x.p;
  p.x_out = xo.p;
  p.w_o = w_o.p;
  p.b_o = b.p;
  p.ln2_w = b.p;
  p.ln2_b = b.p;
  p.w_in = w_in.p;
  p.b_in = b_in.p;
  p.w_out = w_out.p;
  p.b_out = b.p;
  p.ln_next_w = b.p;
  p.ln_next_b = b.p;
  p.h_out = h.p;
  p.y = xo.p;
  p.tail = t.tail;
  p.S = 128;
  p.rows = t.rows;
  p.D = t.D;
  p.F = t.F;
  cudaStream_t st;
  CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const double med = hk::gputest::graph_ms_per_launch(st, [&] { hk::cuda::post_attn_fused(p, st, t.cfg); });
  CHECK_CUDA(cudaStreamDestroy(st));
  const double fused_bytes = double(n) * (t.tail ? 10.0 : 12.0);
  const double split_bytes = double(n) * 40.0;
  const double gbs = fused_bytes / (med * 1e-3) / 1e9;
  std::printf("%-28s D=%-3d F=%-3d rows=%-8lld %-5s %-9s %-42s %8.4f ms  %7.1f GB/s (%5.1f%% of copy)  "
              "split route ~%.3f ms at copy speed\n",
              t.name, t.D, t.F, static_cast<long long>(t.rows), t.tail ? "tail" : "layer", cfg_name(t.cfg).c_str(),
              hk::cuda::post_attn_fused_name(t.D, t.F), med, gbs, 100.0 * gbs / copy_gbs,
              split_bytes / (copy_gbs * 1e9) * 1e3);
  CHECK_CUDA(cudaGetLastError());
}

double measure_copy_gbs() {
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  CHECK_CUDA(cudaMemset(a, 0, bytes));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  CHECK_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  std::vector<float> ms;
  for (int i = 0; i < 10; ++i) {
    CHECK_CUDA(cudaEventRecord(e0));
    CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float v = 0;
    CHECK_CUDA(cudaEventElapsedTime(&v, e0, e1));
    ms.push_back(v);
  }
  std::sort(ms.begin(), ms.end());
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  return 2.0 * double(bytes) / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

}  // namespace

// Wqkv [3D, D] and bqkv [3D] in fp16 at nn.Linear init scale (U(+-1/sqrt(D))), in that order.
void make_qkv_weights(int D, std::mt19937_64& rng, std::vector<__half>& w, std::vector<__half>& b) {
  const double ad = 1.0 / std::sqrt(double(D));
  std::uniform_real_distribution<double> u(-ad, ad);
  w.resize(size_t(3) * size_t(D) * size_t(D));
  b.resize(size_t(3) * size_t(D));
  for (auto& v : w) v = __double2half(u(rng));
  for (auto& v : b) v = __double2half(u(rng));
}

// ---- the chain with the next layer's QKV projection (PostAttnParams::qkv_out) -----------------------
struct QkvCase {
  int D = 128;
  int64_t rows = 64;
  PostAttnConfig cfg{8, 0, 8, 1};
  bool with_h = true;  // h_out given too (else null: not written)
  bool alias = false;  // x_out == x_in
  bool gather = false; // residual through x_rows (reversed rows, every 11th -1 = zeros)
  bool graph = false;
  int64_t sample = 0;
};

struct QkvOutcome {
  long bad_x = 0, bad_h = 0, bad_qkv = 0, bad_qkv_own = 0, unwritten = 0, guard = 0;
  double ratio = 0, own_ratio = 0;
  std::string error;
  bool ok() const {
    return error.empty() && bad_x == 0 && bad_h == 0 && bad_qkv == 0 && bad_qkv_own == 0 && unwritten == 0 && guard == 0;
  }
};

// qkv against (a) the float64 chain, then h rounded to fp16, times Wqkv^T + bqkv, within the
// MODEL.md budget max(2e-3, 0.02 |ref|); (b) with h_out, the product of the kernel's own h_out rows
// in float64: fp32 accumulation and one fp16 rounding, |err| <= 2^-10 |ref| + 1e-4. x_out within
// 1e-3, h_out as the chain's h; every qkv element of the rows written, 16 guard rows untouched.
QkvOutcome run_qkv_case(const QkvCase& c, uint64_t seed) {
  QkvOutcome out;
  std::mt19937_64 rng(seed);
  const int D = c.D, F = c.D, N = 3 * c.D;
  const int64_t rows = c.rows, alloc = rows + kGuardRows;
  const Model m = make_model(D, F, rng);
  const DevModel dm(m);
  std::vector<__half> wq, bq;
  make_qkv_weights(D, rng, wq, bq);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<__half> o(size_t(alloc) * D);
  std::vector<float> x(size_t(alloc) * D);
  for (int64_t r = 0; r < alloc; ++r) {
    for (int k = 0; k < D; ++k) {
      o[size_t(r) * D + k] = r < rows ? __double2half(0.5 * nd(rng)) : __float2half(std::nanf(""));
      x[size_t(r) * D + k] = r < rows ? float(nd(rng)) : std::nanf("");
    }
  }
  // Gathered: chain row r reads source row rows - 1 - r (or zeros every 11th row).
  std::vector<int32_t> x_rows;
  std::vector<float> x_src;
  if (c.gather) {
    x_rows.resize(size_t(rows));
    x_src.assign(size_t(rows) * D, std::nanf(""));
    for (int64_t r = 0; r < rows; ++r) {
      x_rows[size_t(r)] = r % 11 == 3 ? -1 : int32_t(rows - 1 - r);
      for (int k = 0; k < D; ++k) {
        float& v = x[size_t(r) * D + k];
        if (x_rows[size_t(r)] < 0) v = 0.f;
        else x_src[size_t(x_rows[size_t(r)]) * D + k] = v;
      }
    }
  }
  Dev<__half> d_o(o.size()), d_wq(wq.size()), d_bq(bq.size()), d_h(size_t(alloc) * D), d_qkv(size_t(alloc) * N);
  Dev<float> d_x(x.size()), d_xo(x.size()), d_src(x_src.size());
  Dev<int32_t> d_rows(x_rows.size());
  d_o.up(o);
  d_x.up(x);
  d_wq.up(wq);
  d_bq.up(bq);
  if (c.gather) {
    d_src.up(x_src);
    d_rows.up(x_rows);
  }
  d_xo.poison();
  d_h.poison();
  d_qkv.poison();
  if (c.alias) {
    CHECK_CUDA(cudaMemset(d_x.p + size_t(rows) * D, kPoison, size_t(kGuardRows) * D * sizeof(float)));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  PostAttnParams p = dm.params(m);
  p.o = d_o.p;
  p.x_in = c.gather ? d_src.p : d_x.p;
  p.x_rows = c.gather ? d_rows.p : nullptr;
  p.x_out = c.alias ? d_x.p : d_xo.p;
  p.h_out = c.with_h ? d_h.p : nullptr;
  p.w_qkv = d_wq.p;
  p.b_qkv = d_bq.p;
  p.qkv_out = d_qkv.p;
  p.rows = rows;
  out.error = launch_sync(p, c.cfg, c.graph);
  if (!out.error.empty()) return out;
  const std::vector<float> xo = c.alias ? d_x.down() : d_xo.down();
  const std::vector<__half> h = d_h.down(), qkv = d_qkv.down();

  std::vector<int64_t> check;
  if (c.sample > 0 && c.sample < rows) {
    std::uniform_int_distribution<int64_t> ur(0, rows - 1);
    for (int64_t r = 0; r < c.sample / 4; ++r) check.push_back(r);
    for (int64_t r = rows - c.sample / 4; r < rows; ++r) check.push_back(r);
    while (int64_t(check.size()) < c.sample) check.push_back(ur(rng));
  } else {
    for (int64_t r = 0; r < rows; ++r) check.push_back(r);
  }
  std::vector<double> rx, rln, h16(static_cast<size_t>(D));
  for (const int64_t r : check) {
    reference_row(m, &o[size_t(r) * D], &x[size_t(r) * D], 1e-5, rx, rln);
    for (int k = 0; k < D; ++k) {
      const size_t i = size_t(r) * D + size_t(k);
      if (poison_f32(xo[i])) ++out.unwritten;
      else if (!(std::fabs(double(xo[i]) - rx[size_t(k)]) <= 1e-3)) ++out.bad_x;
      h16[size_t(k)] = round_f16(rln[size_t(k)]);
      if (c.with_h) {
        if (poison_f16(h[i])) {
          ++out.unwritten;
        } else if (!(std::fabs(h2d(h[i]) - rln[size_t(k)]) <= std::max(2e-3, 0.02 * std::fabs(rln[size_t(k)])))) {
          ++out.bad_h;
        }
      }
    }
    for (int n = 0; n < N; ++n) {
      const __half got_h = qkv[size_t(r) * N + size_t(n)];
      if (poison_f16(got_h)) {
        ++out.unwritten;
        continue;
      }
      const double got = h2d(got_h);
      double ref = h2d(bq[size_t(n)]), own = h2d(bq[size_t(n)]);
      for (int k = 0; k < D; ++k) {
        const double w = h2d(wq[size_t(n) * D + size_t(k)]);
        ref += h16[size_t(k)] * w;
        if (c.with_h) own += h2d(h[size_t(r) * D + size_t(k)]) * w;
      }
      const double tol = std::max(2e-3, 0.02 * std::fabs(ref)), e = std::fabs(got - ref);
      if (!(e <= tol)) ++out.bad_qkv;
      out.ratio = std::max(out.ratio, std::isfinite(e) ? e / tol : 1e30);
      if (c.with_h) {
        const double otol = std::ldexp(std::fabs(own), -10) + 1e-4, oe = std::fabs(got - own);
        if (!(oe <= otol)) ++out.bad_qkv_own;
        out.own_ratio = std::max(out.own_ratio, std::isfinite(oe) ? oe / otol : 1e30);
      }
    }
  }
  for (size_t i = size_t(rows) * N; i < size_t(alloc) * N; ++i)
    if (!poison_f16(qkv[i])) ++out.guard;
  for (size_t i = size_t(rows) * D; i < size_t(alloc) * D; ++i) {
    if (!poison_f32(xo[i])) ++out.guard;
    if (!poison_f16(h[i])) ++out.guard;  // also: h_out null writes nothing at all
  }
  if (!c.with_h) {
    for (size_t i = 0; i < size_t(rows) * D; ++i)
      if (!poison_f16(h[i])) ++out.guard;
  }
  return out;
}

// Float64 attention of fp16 q | k | v rows ([B S, 3D], head h at columns h D / H of each part):
// softmax(q k^T / sqrt(head_dim)) v over the keys < the sequence's length (and <= the row under
// causal), rounded to fp16; rows at or past the length (len null: all S valid) get o = 0. Reads no
// row at or past a length.
std::vector<__half> reference_attention(const std::vector<__half>& qkv, int B, int S, int D, int H, bool causal,
                                        const std::vector<int32_t>* len) {
  const int N = 3 * D, hd = D / H;
  const double scale = 1.0 / std::sqrt(double(hd));
  std::vector<__half> o(size_t(B) * S * D, __float2half(0.f));
  for (int b = 0; b < B; ++b) {
    const int L = len ? (*len)[size_t(b)] : S;
    for (int s = 0; s < L; ++s) {
      const size_t qr = size_t(b) * S + size_t(s);
      const int kend = causal ? s + 1 : L;
      for (int h = 0; h < H; ++h) {
        std::vector<double> sc(static_cast<size_t>(kend));
        double mx = -INFINITY;
        for (int j = 0; j < kend; ++j) {
          const size_t kr = size_t(b) * S + size_t(j);
          double d = 0;
          for (int e = 0; e < hd; ++e) d += h2d(qkv[qr * N + size_t(h * hd + e)]) * h2d(qkv[kr * N + size_t(D + h * hd + e)]);
          sc[size_t(j)] = d * scale;
          mx = std::max(mx, sc[size_t(j)]);
        }
        double sum = 0;
        for (auto& v : sc) sum += (v = std::exp(v - mx));
        for (int e = 0; e < hd; ++e) {
          double acc = 0;
          for (int j = 0; j < kend; ++j) acc += sc[size_t(j)] * h2d(qkv[(size_t(b) * S + size_t(j)) * N + size_t(2 * D + h * hd + e)]);
          o[qr * D + size_t(h * hd + e)] = __double2half(acc / sum);
        }
      }
    }
  }
  return o;
}

// ---- the chain with the layer's attention in front (PostAttnParams::qkv_in) -------------------------
struct AttnCase {
  int B = 1, S = 128, D = 128;
  bool causal = true;
  Lens lens = Lens::random;
  enum class Out { h, qkv, qkv_inplace, tail } out = Out::qkv;
  bool graph = false;
  bool front = false;  // the layer's ln1 + QKV projection in front (qkv outputs only)
};
const char* attn_out_name(AttnCase::Out o) {
  return o == AttnCase::Out::h ? "h_out" : o == AttnCase::Out::qkv ? "qkv_out" : o == AttnCase::Out::qkv_inplace ? "qkv_in=out" : "tail";
}

struct AttnOutcome {
  long bad_x = 0, bad_ln = 0, bad_qkv = 0, unwritten = 0, pad_nonzero = 0, guard = 0;
  double x_err = 0, ln_ratio = 0, qkv_ratio = 0;
  std::string error;
  bool ok() const {
    return error.empty() && bad_x == 0 && bad_ln == 0 && bad_qkv == 0 && unwritten == 0 && pad_nonzero == 0 &&
           guard == 0;
  }
};

// Float64 reference: o of every row from the fp16 q / k / v (softmax over keys < length, and
// <= the row under causal; rows at or past the length o = 0), rounded to fp16 as the kernel stores
// it, then the chain (reference_row) and, for qkv_out, fp16(h) Wqkv^T + bqkv. Token rows of qkv_in
// at or past a sequence's length hold NaN (the kernel must not read them as keys or values; a
// padded row's own q only reaches its own o, which is zeroed). x_out within 4e-3 (the o rounding
// and the fp16 P of the kernel's softmax on top of the chain's 1e-3), h_out / y / qkv within the
// MODEL.md budget max(2e-3, 0.02 |ref|); tail: padded rows of y exactly 0; 16 guard rows of every
// output untouched. front: the layer's q | k | v come from ln1 + the QKV projection of x inside the
// kernel (qkv_in starts poisoned); the reference computes them in float64 from fp16(LN(x)) and
// rounds to fp16, and with a separate qkv_out the kernel's own q | k | v rows are checked
// against it within budget.
AttnOutcome run_attn_case(const AttnCase& c, uint64_t seed) {
  AttnOutcome out;
  std::mt19937_64 rng(seed);
  const int D = c.D, F = c.D, N = 3 * c.D, H = 4, hd = D / H;
  const int64_t rows = int64_t(c.B) * c.S, alloc = rows + kGuardRows;
  const Model m = make_model(D, F, rng);
  const DevModel dm(m);
  std::vector<__half> wq, bq;
  make_qkv_weights(D, rng, wq, bq);
  std::vector<int32_t> len(static_cast<size_t>(c.B), c.S);
  for (int b = 0; b < c.B; ++b) {
    if (c.lens == Lens::random) len[size_t(b)] = std::uniform_int_distribution<int>(1, c.S)(rng);
    if (c.lens == Lens::edge) len[size_t(b)] = b % 3 == 0 ? 0 : (b % 3 == 1 ? 1 : c.S);
  }
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<__half> qkv(size_t(alloc) * N);
  std::vector<float> x(size_t(alloc) * D);
  __half nan16;  // the poison pattern (0xFFFF, a NaN): guard rows of an in-place qkv_out must keep it
  const uint16_t nan_bits = 0xFFFFu;
  std::memcpy(&nan16, &nan_bits, 2);
  for (int64_t r = 0; r < alloc; ++r) {
    const bool token = r < rows && (c.lens == Lens::none || r % c.S < len[size_t(r / c.S)]);
    for (int n = 0; n < N; ++n) qkv[size_t(r) * N + n] = token ? __double2half(nd(rng)) : nan16;
    for (int k = 0; k < D; ++k) x[size_t(r) * D + k] = r < rows ? float(nd(rng)) : std::nanf("");
  }
  // front: the layer's own q | k | v = fp16(fp16(LN(x; ln_front)) Wf^T + bf) for every row.
  std::vector<__half> wf, bfr;
  std::vector<float> lfw(static_cast<size_t>(D)), lfb(static_cast<size_t>(D));
  std::vector<__half> qkv_front_ref;
  if (c.front) {
    make_qkv_weights(D, rng, wf, bfr);
    for (auto& v : lfw) v = float(std::uniform_real_distribution<double>(0.5, 1.5)(rng));
    for (auto& v : lfb) v = float(std::uniform_real_distribution<double>(-0.3, 0.3)(rng));
    std::vector<double> xr(static_cast<size_t>(D)), hr;
    for (int64_t r = 0; r < rows; ++r) {
      for (int k = 0; k < D; ++k) xr[size_t(k)] = double(x[size_t(r) * D + size_t(k)]);
      layer_norm(xr, lfw.data(), lfb.data(), 1e-5, hr);
      for (int n = 0; n < N; ++n) {
        double a = h2d(bfr[size_t(n)]);
        for (int k = 0; k < D; ++k) a += round_f16(hr[size_t(k)]) * h2d(wf[size_t(n) * D + size_t(k)]);
        qkv[size_t(r) * N + size_t(n)] = __double2half(a);
      }
    }
    qkv_front_ref.assign(qkv.begin(), qkv.begin() + rows * N);
  }
  // Reference o (fp16-rounded).
  const double scale = 1.0 / std::sqrt(double(hd));
  const std::vector<__half> o = reference_attention(qkv, c.B, c.S, D, H, c.causal, c.lens == Lens::none ? nullptr : &len);
  const bool tail = c.out == AttnCase::Out::tail, with_qkv = c.out == AttnCase::Out::qkv || c.out == AttnCase::Out::qkv_inplace;
  Dev<__half> d_qkv(qkv.size()), d_wq(wq.size()), d_bq(bq.size()), d_h(size_t(alloc) * D), d_qo(size_t(alloc) * N);
  Dev<__half> d_wf(wf.size()), d_bf(bfr.size());
  Dev<float> d_x(x.size()), d_xo(x.size()), d_y(x.size()), d_lfw(lfw.size()), d_lfb(lfb.size());
  Dev<int32_t> d_len(len.size());
  if (c.front) {
    d_qkv.poison();
    d_wf.up(wf);
    d_bf.up(bfr);
    d_lfw.up(lfw);
    d_lfb.up(lfb);
  } else {
    d_qkv.up(qkv);
  }
  d_x.up(x);
  d_wq.up(wq);
  d_bq.up(bq);
  d_len.up(len);
  d_xo.poison();
  d_h.poison();
  d_qo.poison();
  d_y.poison();
  PostAttnParams p = dm.params(m);
  p.qkv_in = d_qkv.p;
  p.H = H;
  p.causal = c.causal;
  p.attn_scale = float(scale);
  p.S = c.S;
  p.lengths = c.lens == Lens::none ? nullptr : d_len.p;
  p.x_in = d_x.p;
  p.rows = rows;
  p.tail = tail;
  if (tail) {
    p.y = d_y.p;
  } else {
    p.x_out = d_xo.p;
    if (with_qkv) {
      p.w_qkv = d_wq.p;
      p.b_qkv = d_bq.p;
      p.qkv_out = c.out == AttnCase::Out::qkv_inplace ? d_qkv.p : d_qo.p;
      if (c.front) {
        p.qkv_front = d_qkv.p;
        p.w_qkv_front = d_wf.p;
        p.b_qkv_front = d_bf.p;
        p.ln_front_w = d_lfw.p;
        p.ln_front_b = d_lfb.p;
      }
    } else {
      p.h_out = d_h.p;
    }
  }
  out.error = launch_sync(p, PostAttnConfig{}, c.graph);
  if (!out.error.empty()) return out;
  const std::vector<float> xo = d_xo.down(), y = d_y.down();
  const std::vector<__half> h = d_h.down(), qo = c.out == AttnCase::Out::qkv_inplace ? d_qkv.down() : d_qo.down();
  std::vector<double> rx, rln;
  for (int64_t r = 0; r < rows; ++r) {
    const bool valid = c.lens == Lens::none || r % c.S < len[size_t(r / c.S)];
    reference_row(m, &o[size_t(r) * D], &x[size_t(r) * D], 1e-5, rx, rln);
    for (int k = 0; k < D; ++k) {
      const size_t i = size_t(r) * D + size_t(k);
      const double lt = std::max(2e-3, 0.02 * std::fabs(rln[size_t(k)]));
      if (tail) {
        if (poison_f32(y[i])) ++out.unwritten;
        else if (!valid) out.pad_nonzero += y[i] != 0.f;
        else if (!(std::fabs(double(y[i]) - rln[size_t(k)]) <= lt)) ++out.bad_ln;
        if (valid) out.ln_ratio = std::max(out.ln_ratio, std::fabs(double(y[i]) - rln[size_t(k)]) / lt);
        continue;
      }
      const double ex = std::fabs(double(xo[i]) - rx[size_t(k)]);
      if (poison_f32(xo[i])) ++out.unwritten;
      else if (!(ex <= 4e-3)) ++out.bad_x;
      out.x_err = std::max(out.x_err, std::isfinite(ex) ? ex : 1e30);
      if (c.out == AttnCase::Out::h) {
        const double e = std::fabs(h2d(h[i]) - rln[size_t(k)]);
        if (poison_f16(h[i])) ++out.unwritten;
        else if (!(e <= lt)) ++out.bad_ln;
        out.ln_ratio = std::max(out.ln_ratio, std::isfinite(e) ? e / lt : 1e30);
      }
    }
    if (with_qkv) {
      for (int n = 0; n < N; ++n) {
        const __half got = qo[size_t(r) * N + size_t(n)];
        if (poison_f16(got)) {
          ++out.unwritten;
          continue;
        }
        double ref = h2d(bq[size_t(n)]);
        for (int k = 0; k < D; ++k) ref += round_f16(rln[size_t(k)]) * h2d(wq[size_t(n) * D + size_t(k)]);
        const double tol = std::max(2e-3, 0.02 * std::fabs(ref)), e = std::fabs(h2d(got) - ref);
        if (!(e <= tol)) ++out.bad_qkv;
        out.qkv_ratio = std::max(out.qkv_ratio, std::isfinite(e) ? e / tol : 1e30);
      }
    }
  }
  if (c.front && c.out == AttnCase::Out::qkv) {  // the kernel's own q | k | v of this layer
    const std::vector<__half> qf = d_qkv.down();
    for (size_t i = 0; i < qkv_front_ref.size(); ++i) {
      const double ref = h2d(qkv_front_ref[i]), tol = std::max(2e-3, 0.02 * std::fabs(ref));
      const double e = std::fabs(h2d(qf[i]) - ref);
      if (poison_f16(qf[i])) ++out.unwritten;
      else if (!(e <= tol)) ++out.bad_qkv;
      out.qkv_ratio = std::max(out.qkv_ratio, std::isfinite(e) ? e / tol : 1e30);
    }
    for (size_t i = qkv_front_ref.size(); i < qf.size(); ++i) out.guard += !poison_f16(qf[i]);
  }
  for (int64_t r = rows; r < alloc; ++r) {
    for (int k = 0; k < D; ++k) {
      const size_t i = size_t(r) * D + size_t(k);
      out.guard += !poison_f32(xo[i]) + !poison_f32(y[i]) + !poison_f16(h[i]);
    }
    for (int n = 0; n < N; ++n) out.guard += !poison_f16(qo[size_t(r) * N + size_t(n)]);
  }
  // Outputs a variant does not have stay poisoned.
  for (int64_t r = 0; r < rows; ++r) {
    for (int k = 0; k < D; ++k) {
      const size_t i = size_t(r) * D + size_t(k);
      if (tail) out.guard += !poison_f32(xo[i]);
      else out.guard += !poison_f32(y[i]);
      if (c.out != AttnCase::Out::h) out.guard += !poison_f16(h[i]);
    }
  }
  return out;
}

// The chain with the attention in front: (D, head_dim) = (128, 32) and (64, 16), S from one row
// block to 128 (clusters of 1-8 CTAs), one sequence and many (the grid's loop over sequences),
// causal or not, lengths null / random / 0-1-S, every output variant incl. qkv_out over qkv_in, and
// with the layer's ln1 + QKV projection in front. Returns the failures; n counts the checks.
int attention_chain_checks(int& n) {
  int failures = 0;
  {
    const bool have = hk::cuda::post_attn_attention_supports(128, 128, 4, 128) &&
                      hk::cuda::post_attn_attention_supports(64, 64, 4, 64);
    int major = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    const bool refused = !hk::cuda::post_attn_attention_supports(128, 128, 8, 128) &&
                         !hk::cuda::post_attn_attention_supports(128, 128, 4, 136) &&
                         !hk::cuda::post_attn_attention_supports(128, 128, 4, 40) &&
                         !hk::cuda::post_attn_attention_supports(256, 256, 8, 128);
    const bool ok = refused && (have || major < 9);
    std::printf("%-4d attention in the chain: supported at D=128/H=4 and D=64/H=4 (S <= 128, S %% 16 == 0) on cc >= 9, "
                "refused for H=8, S=136, S=40, D=256: %s\n", n, ok ? "PASS" : "FAIL");
    failures += ok ? 0 : 1;
    ++n;
    if (have) {
      using O = AttnCase::Out;
      const AttnCase cases[] = {
          {1, 128, 128, true, Lens::random, O::qkv_inplace, false},
          {1, 128, 128, true, Lens::none, O::qkv, false},
          {1, 128, 128, true, Lens::random, O::tail, false},
          {1, 128, 128, false, Lens::random, O::h, false},
          {3, 128, 128, false, Lens::edge, O::qkv_inplace, false},
          {3, 128, 128, true, Lens::edge, O::tail, true},
          {40, 128, 128, true, Lens::random, O::qkv_inplace, false},
          {40, 128, 128, false, Lens::random, O::tail, false},
          {5, 32, 128, true, Lens::random, O::qkv, true},
          {300, 16, 128, true, Lens::random, O::qkv_inplace, false},
          {7, 48, 64, true, Lens::random, O::qkv_inplace, false},
          {7, 48, 64, false, Lens::edge, O::tail, false},
          {2, 64, 64, true, Lens::none, O::h, false},
          {33, 112, 64, true, Lens::random, O::qkv_inplace, true},
          {1, 128, 128, true, Lens::random, O::qkv_inplace, false, true},
          {1, 128, 128, true, Lens::none, O::qkv, false, true},
          {3, 128, 128, false, Lens::edge, O::qkv, true, true},
          {40, 128, 128, true, Lens::random, O::qkv_inplace, false, true},
          {300, 16, 128, true, Lens::random, O::qkv, false, true},
          {7, 48, 64, true, Lens::random, O::qkv_inplace, false, true},
          {33, 112, 64, false, Lens::random, O::qkv, true, true},
      };
      for (const AttnCase& c : cases) {
        const AttnOutcome r = run_attn_case(c, 9000 + uint64_t(n));
        std::printf("%-4d attn chain D=%-3d B=%-3d S=%-3d causal=%d lens=%-5s %-10s graph=%d front=%d  x err %.2e  ln ratio %.3f  "
                    "qkv ratio %.3f  bad x/ln/qkv %ld/%ld/%ld unwritten %ld pad %ld guard %ld %s: %s\n",
                    n, c.D, c.B, c.S, int(c.causal), lens_name(c.lens), attn_out_name(c.out), int(c.graph), int(c.front), r.x_err,
                    r.ln_ratio, r.qkv_ratio, r.bad_x, r.bad_ln, r.bad_qkv, r.unwritten, r.pad_nonzero, r.guard,
                    r.error.c_str(), r.ok() ? "PASS" : "FAIL");
        failures += r.ok() ? 0 : 1;
        ++n;
      }
    }
  }
  return failures;
}

// ---- the whole forward in one kernel (post_attn_model) --------------------------------------------
struct ModelCase {
  int B = 1, S = 128, D = 128, L = 4;
  bool causal = true;
  Lens lens = Lens::random;
  bool in_place = false;  // y over the input x
  bool graph = false;
};

struct ModelOutcome {
  long bad = 0, unwritten = 0, pad_nonzero = 0, guard = 0;
  double ratio = 0;
  std::string error;
  bool ok() const { return error.empty() && bad == 0 && unwritten == 0 && pad_nonzero == 0 && guard == 0; }
};

// fp16(h Wqkv^T + bqkv) of one row, h already rounded to fp16 as the kernels hold it.
void reference_qkv_row(const std::vector<double>& h, const std::vector<__half>& w, const std::vector<__half>& b, int D,
                       __half* out) {
  for (int n = 0; n < 3 * D; ++n) {
    double a = h2d(b[size_t(n)]);
    for (int k = 0; k < D; ++k) a += round_f16(h[size_t(k)]) * h2d(w[size_t(n) * D + size_t(k)]);
    out[n] = __double2half(a);
  }
}

// L layers of random weights (layer l's chain weights, its ln_next = layer l + 1's ln1 or the final
// norm, Wqkv of every layer, layer 0's ln1) through post_attn_model, y against a float64 forward
// that rounds where the kernels round (fp16 h before every product, fp16 q | k | v and o, fp32
// residual between layers): y within max(2e-3, 0.02 |ref|), padded rows exactly 0, 16 guard rows
// of y and the q | k | v buffer untouched (the in-place case: of x). y and q | k | v start poisoned.
ModelOutcome run_model_case(const ModelCase& c, uint64_t seed) {
  ModelOutcome out;
  std::mt19937_64 rng(seed);
  const int D = c.D, F = c.D, N = 3 * D, H = 4, L = c.L;
  const int64_t rows = int64_t(c.B) * c.S, alloc = rows + kGuardRows;
  std::vector<Model> models;
  std::vector<std::vector<__half>> wq(static_cast<size_t>(L)), bq(static_cast<size_t>(L));
  for (int l = 0; l < L; ++l) {
    models.push_back(make_model(D, F, rng));
    make_qkv_weights(D, rng, wq[size_t(l)], bq[size_t(l)]);
  }
  std::vector<float> lfw(static_cast<size_t>(D)), lfb(static_cast<size_t>(D));
  for (auto& v : lfw) v = float(std::uniform_real_distribution<double>(0.5, 1.5)(rng));
  for (auto& v : lfb) v = float(std::uniform_real_distribution<double>(-0.3, 0.3)(rng));
  std::vector<int32_t> len(static_cast<size_t>(c.B), c.S);
  for (int b = 0; b < c.B; ++b) {
    if (c.lens == Lens::random) len[size_t(b)] = std::uniform_int_distribution<int>(1, c.S)(rng);
    if (c.lens == Lens::edge) len[size_t(b)] = b % 3 == 0 ? 0 : (b % 3 == 1 ? 1 : c.S);
  }
  const std::vector<int32_t>* lens = c.lens == Lens::none ? nullptr : &len;
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<float> x(size_t(alloc) * D);
  for (int64_t r = 0; r < alloc; ++r)
    for (int k = 0; k < D; ++k) x[size_t(r) * D + size_t(k)] = r < rows ? float(nd(rng)) : std::nanf("");

  // Reference.
  std::vector<float> xr(x.begin(), x.begin() + rows * D);
  std::vector<__half> qkv(size_t(rows) * N);
  std::vector<double> y_ref(size_t(rows) * D, 0.0), row(static_cast<size_t>(D)), h, rx, rln;
  for (int64_t r = 0; r < rows; ++r) {
    for (int k = 0; k < D; ++k) row[size_t(k)] = double(xr[size_t(r) * D + size_t(k)]);
    layer_norm(row, lfw.data(), lfb.data(), 1e-5, h);
    reference_qkv_row(h, wq[0], bq[0], D, &qkv[size_t(r) * N]);
  }
  for (int l = 0; l < L; ++l) {
    const std::vector<__half> o = reference_attention(qkv, c.B, c.S, D, H, c.causal, lens);
    for (int64_t r = 0; r < rows; ++r) {
      reference_row(models[size_t(l)], &o[size_t(r) * D], &xr[size_t(r) * D], 1e-5, rx, rln);
      for (int k = 0; k < D; ++k) xr[size_t(r) * D + size_t(k)] = float(rx[size_t(k)]);
      if (l + 1 < L) {
        reference_qkv_row(rln, wq[size_t(l + 1)], bq[size_t(l + 1)], D, &qkv[size_t(r) * N]);
      } else {
        const bool valid = !lens || r % c.S < len[size_t(r / c.S)];
        for (int k = 0; k < D; ++k) y_ref[size_t(r) * D + size_t(k)] = valid ? rln[size_t(k)] : 0.0;
      }
    }
  }

  // Device.
  std::vector<std::unique_ptr<DevModel>> dms;
  std::vector<std::unique_ptr<Dev<__half>>> dwq, dbq;
  for (int l = 0; l < L; ++l) {
    dms.push_back(std::make_unique<DevModel>(models[size_t(l)]));
    dwq.push_back(std::make_unique<Dev<__half>>(wq[size_t(l)].size()));
    dbq.push_back(std::make_unique<Dev<__half>>(bq[size_t(l)].size()));
    dwq.back()->up(wq[size_t(l)]);
    dbq.back()->up(bq[size_t(l)]);
  }
  Dev<float> d_x(x.size()), d_y(x.size()), d_xo(x.size()), d_lfw(lfw.size()), d_lfb(lfb.size());
  Dev<__half> d_qkv(size_t(alloc) * N);
  Dev<int32_t> d_len(len.size());
  d_x.up(x);
  d_y.poison();
  d_xo.poison();
  d_qkv.poison();
  d_lfw.up(lfw);
  d_lfb.up(lfb);
  d_len.up(len);
  hk::cuda::PostAttnModelParams mp;
  mp.L = L;
  for (int l = 0; l < L; ++l) {
    PostAttnParams& p = mp.layer[l];
    p = dms[size_t(l)]->params(models[size_t(l)]);
    p.x_in = d_x.p;
    p.x_out = d_xo.p;
    p.qkv_in = d_qkv.p;
    p.H = H;
    p.causal = c.causal;
    p.attn_scale = float(1.0 / std::sqrt(double(D / H)));
    p.S = c.S;
    p.lengths = lens ? d_len.p : nullptr;
    p.rows = rows;
    if (l == 0) {
      p.qkv_front = d_qkv.p;
      p.w_qkv_front = dwq[0]->p;
      p.b_qkv_front = dbq[0]->p;
      p.ln_front_w = d_lfw.p;
      p.ln_front_b = d_lfb.p;
    }
    if (l + 1 < L) {
      p.w_qkv = dwq[size_t(l + 1)]->p;
      p.b_qkv = dbq[size_t(l + 1)]->p;
      p.qkv_out = d_qkv.p;
    } else {
      p.tail = true;
      p.y = c.in_place ? d_x.p : d_y.p;
    }
  }
  out.error = run_sync([&](cudaStream_t st) { hk::cuda::post_attn_model(mp, st); }, c.graph);
  if (!out.error.empty()) return out;
  const std::vector<float> y = c.in_place ? d_x.down() : d_y.down(), xo = d_xo.down();
  const std::vector<__half> qo = d_qkv.down();
  for (int64_t r = 0; r < rows; ++r) {
    const bool valid = !lens || r % c.S < len[size_t(r / c.S)];
    for (int k = 0; k < D; ++k) {
      const size_t i = size_t(r) * D + size_t(k);
      const double ref = y_ref[i], tol = std::max(2e-3, 0.02 * std::fabs(ref)), e = std::fabs(double(y[i]) - ref);
      if (poison_f32(y[i])) ++out.unwritten;
      else if (!valid) out.pad_nonzero += y[i] != 0.f;
      else if (!(e <= tol)) ++out.bad;
      if (valid) out.ratio = std::max(out.ratio, std::isfinite(e) ? e / tol : 1e30);
      out.guard += !poison_f32(xo[i]);  // x_out is never written
    }
    for (int n = 0; n < N; ++n) out.unwritten += poison_f16(qo[size_t(r) * N + size_t(n)]) ? 1 : 0;
  }
  for (int64_t r = rows; r < alloc; ++r) {
    for (int k = 0; k < D; ++k) {
      const size_t i = size_t(r) * D + size_t(k);
      out.guard += c.in_place ? !std::isnan(y[i]) : !poison_f32(y[i]);
      out.guard += !poison_f32(xo[i]);
    }
    for (int n = 0; n < N; ++n) out.guard += !poison_f16(qo[size_t(r) * N + size_t(n)]);
  }
  return out;
}

// The whole-model kernel: D = 128 / 64, S 16-128, L 2-4 (and 8, the limit), one sequence and many
// (the grid's loop over sequences), causal or not, lengths null / random / 0-1-S, in place, graph
// capture; and the launch-time checks of the layer structure.
int model_checks(int& n) {
  int failures = 0;
  const bool have = hk::cuda::post_attn_model_supports(128, 128, 4, 128, 4) &&
                    hk::cuda::post_attn_model_supports(64, 64, 4, 64, 2);
  int major = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  const bool refused = !hk::cuda::post_attn_model_supports(128, 128, 4, 128, 1) &&
                       !hk::cuda::post_attn_model_supports(128, 128, 4, 128, hk::cuda::kPostAttnModelMaxLayers + 1) &&
                       !hk::cuda::post_attn_model_supports(128, 128, 8, 128, 4) &&
                       !hk::cuda::post_attn_model_supports(128, 128, 4, 40, 4);
  const bool ok = refused && (have || major < 9);
  std::printf("%-4d whole model: supported at D=128/H=4, D=64/H=4 on cc >= 9, refused for L=1, L=%d, H=8, S=40: %s\n", n,
              hk::cuda::kPostAttnModelMaxLayers + 1, ok ? "PASS" : "FAIL");
  failures += ok ? 0 : 1;
  ++n;
  if (!have) return failures;
  const ModelCase cases[] = {
      {1, 128, 128, 4, true, Lens::random, false, false},
      {1, 128, 128, 4, true, Lens::none, false, true},
      {3, 128, 128, 3, false, Lens::edge, false, false},
      {3, 128, 128, 2, true, Lens::edge, true, false},
      {40, 128, 128, 4, true, Lens::random, false, false},
      {5, 32, 128, 4, false, Lens::random, true, true},
      {300, 16, 128, 2, true, Lens::random, false, false},
      {1, 128, 128, hk::cuda::kPostAttnModelMaxLayers, true, Lens::random, false, false},
      {7, 48, 64, 4, true, Lens::random, false, false},
      {7, 48, 64, 3, false, Lens::edge, true, false},
      {33, 112, 64, 2, true, Lens::random, false, true},
      {2, 64, 64, 4, true, Lens::none, false, false},
  };
  for (const ModelCase& c : cases) {
    const ModelOutcome r = run_model_case(c, 12000 + uint64_t(n));
    std::printf("%-4d whole model D=%-3d B=%-3d S=%-3d L=%d causal=%d lens=%-5s in_place=%d graph=%d  y ratio %.3f  bad %ld "
                "unwritten %ld pad %ld guard %ld %s: %s\n",
                n, c.D, c.B, c.S, c.L, int(c.causal), lens_name(c.lens), int(c.in_place), int(c.graph), r.ratio, r.bad,
                r.unwritten, r.pad_nonzero, r.guard, r.error.c_str(), r.ok() ? "PASS" : "FAIL");
    failures += r.ok() ? 0 : 1;
    ++n;
  }
  // Inconsistent layer structures are refused before launch: L = 1; a middle layer with the front
  // or as the tail; a last layer writing q | k | v; layer 1 with another S.
  {
    Dev<float> dx(size_t(128) * 128), dy(size_t(128) * 128);
    Dev<__half> dq(size_t(128) * 384);
    dx.up(std::vector<float>(dx.n, 0.5f));
    dq.poison();
    std::mt19937_64 rng(77);
    const Model m = make_model(128, 128, rng);
    const DevModel dm(m);
    std::vector<__half> w, b;
    make_qkv_weights(128, rng, w, b);
    Dev<__half> dw(w.size()), db(b.size());
    dw.up(w);
    db.up(b);
    auto good = [&] {
      hk::cuda::PostAttnModelParams mp;
      mp.L = 2;
      for (int l = 0; l < 2; ++l) {
        PostAttnParams& p = mp.layer[l];
        p = dm.params(m);
        p.x_in = dx.p;
        p.x_out = dy.p;
        p.qkv_in = dq.p;
        p.H = 4;
        p.attn_scale = 0.17f;
        p.S = 128;
        p.rows = 128;
      }
      PostAttnParams& a = mp.layer[0];
      a.qkv_front = dq.p;
      a.w_qkv_front = dw.p;
      a.b_qkv_front = db.p;
      a.ln_front_w = dm.ln2_w.p;
      a.ln_front_b = dm.ln2_b.p;
      a.w_qkv = dw.p;
      a.b_qkv = db.p;
      a.qkv_out = dq.p;
      mp.layer[1].tail = true;
      mp.layer[1].y = dy.p;
      return mp;
    };
    struct Bad {
      const char* what;
      void (*edit)(hk::cuda::PostAttnModelParams&);
    };
    const Bad bad[] = {
        {"L = 1", [](hk::cuda::PostAttnModelParams& p) { p.L = 1; }},
        {"no front in layer 0", [](hk::cuda::PostAttnModelParams& p) { p.layer[0].w_qkv_front = nullptr; }},
        {"front in layer 1", [](hk::cuda::PostAttnModelParams& p) {
           p.layer[1].w_qkv_front = p.layer[0].w_qkv_front;
         }},
        {"layer 0 as the tail", [](hk::cuda::PostAttnModelParams& p) { p.layer[0].tail = true; p.layer[0].y = p.layer[1].y; }},
        {"qkv_out elsewhere", [](hk::cuda::PostAttnModelParams& p) {
           p.layer[0].qkv_out = const_cast<__half*>(p.layer[0].qkv_in) + 8;
         }},
        {"layer 1 with another S", [](hk::cuda::PostAttnModelParams& p) { p.layer[1].S = 64; }},
    };
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const hk::cuda::PostAttnModelParams base = good();
    bool base_ok = true;
    try {
      hk::cuda::post_attn_model(base, st);
      CHECK_CUDA(cudaStreamSynchronize(st));
    } catch (const std::exception& e) {
      base_ok = false;
      std::printf("     the consistent structure threw: %s\n", e.what());
    }
    int refused_n = 0;
    for (const Bad& b : bad) {
      hk::cuda::PostAttnModelParams p = base;
      b.edit(p);
      try {
        hk::cuda::post_attn_model(p, st);
        std::printf("     %s: launched\n", b.what);
      } catch (const std::invalid_argument& e) {
        ++refused_n;
      }
    }
    CHECK_CUDA(cudaStreamSynchronize(st));
    CHECK_CUDA(cudaStreamDestroy(st));
    const bool pass = base_ok && refused_n == int(sizeof(bad) / sizeof(bad[0]));
    std::printf("%-4d whole model: the consistent 2-layer structure launches, %d of %zu inconsistent ones refused: %s\n",
                n, refused_n, sizeof(bad) / sizeof(bad[0]), pass ? "PASS" : "FAIL");
    failures += pass ? 0 : 1;
    ++n;
  }
  return failures;
}

// The timing table (after the checks, or alone with HK_TEST_TIMING_ONLY=<substring of the shape names>):
// informational, never a pass / fail criterion.
void run_timings(const char* only) {
  std::printf("\ntimings (per launch: median of 30 replays of a graph of 20 launches; fused bytes = rows*D*12, tail 10; split route ~40 B/element)\n");
  const double copy_gbs = measure_copy_gbs();
  std::printf("device-to-device copy: %.1f GB/s\n", copy_gbs);
  const TimingShape shapes_t[] = {
      {"case6 layer", 128, 128, 1280000, false, {}},
      {"case6 tail", 128, 128, 1280000, true, {}},
      {"case6 layer", 128, 128, 1280000, false, {12, 0}},
      {"case6 layer", 128, 128, 1280000, false, {8, 1}},
      {"case6 layer", 128, 128, 1280000, false, {8, 0}},
      {"case6 layer", 128, 128, 1280000, false, {6, 1}},
      {"case6 layer", 128, 128, 1280000, false, {16, 0, 8}},
      {"case6 layer", 128, 128, 1280000, false, {0, -1, 0, 0, 1}},
      {"case6 tail", 128, 128, 1280000, true, {0, -1, 0, 0, 1}},
      {"case6 packed layer", 128, 128, 683264, false, {}},
      {"case6 packed layer", 128, 128, 683264, false, {0, -1, 0, 0, 1}},
      {"case6 packed layer", 128, 128, 683264, false, {12, 0, 0, 0, 1}},
      {"case6 packed layer", 128, 128, 683264, false, {12, 0, 0, 0, 1, 1}},
      {"case6 packed layer", 128, 128, 683264, false, {12, 1, 0, 0, 1, 1}},
      {"case6 packed layer", 128, 128, 683264, false, {8, 1, 0, 0, 1, 1}},
      {"case6 packed layer", 128, 128, 683264, false, {12, 0, 0, 0, 0, 1}},
      {"case1 layer", 128, 128, 8192, false, {}},
      {"case1 layer", 128, 128, 8192, false, {8, 0, 8}},
      {"case1 layer", 128, 128, 8192, false, {16, 0, 8}},
      {"case1 layer", 128, 128, 8192, false, {8, 0, 4}},
      {"case1 layer", 128, 128, 8192, false, {16, 0, 4}},
      {"case1 packed layer", 128, 128, 4352, false, {}},
      {"case1 packed layer", 128, 128, 4352, false, {16, 0, 8}},
      {"case1 packed layer", 128, 128, 4352, false, {16, 0, 4}},
      {"case1 packed layer", 128, 128, 4352, false, {8, 0, 8, 1}},
      {"case1 packed layer", 128, 128, 4352, false, {0, -1, 0, 0, 1}},
      {"case1 packed layer", 128, 128, 4352, false, {0, -1, 0, 0, 1, 1}},
      {"case1 packed layer", 128, 128, 4352, false, {4, 0, 0, 0, 1, 1}},
      {"case2 layer", 128, 128, 128, false, {}},
      {"case2 layer", 128, 128, 128, false, {8, 0, 8}},
      {"case2 layer", 128, 128, 128, false, {16, 0, 8}},
      {"case2 layer", 128, 128, 128, false, {8, 0, 4}},
      {"case2 layer", 128, 128, 128, false, {8, 0, 8, 1}},
      {"case2 tail", 128, 128, 128, true, {16, 0, 8}},
      {"case4 layer", 64, 64, 8192, false, {}},
      {"case4 layer", 64, 64, 8192, false, {16, 0, 8}},
      {"case4 layer", 64, 64, 8192, false, {16, 0, 4}},
      {"case4 packed layer", 64, 64, 4096, false, {}},
      {"case4 packed layer", 64, 64, 4096, false, {8, 0, 8, 1}},
      {"case5 packed layer", 128, 128, 33000, false, {}},
      {"case5 packed layer", 128, 128, 33000, false, {16, 0, 8}},
      {"case5 packed layer", 128, 128, 33000, false, {8, 0, 8, 1}},
      {"case12 layer", 256, 256, 16384, false, {}},
      {"case12 layer", 256, 256, 16384, false, {4, -1}},
      {"case12 packed layer", 256, 256, 8256, false, {4, -1}},
      {"d256 1.28M layer", 256, 256, 1280000, false, {}},
      {"d64 1.28M layer", 64, 64, 1280000, false, {}},
      {"d64 1.28M layer", 64, 64, 1280000, false, {0, -1, 0, 0, 1}},
      {"d64 1.28M layer", 64, 64, 1280000, false, {0, -1, 0, 0, 1, 1}},
  };
  for (const auto& t : shapes_t) {
    if (only == nullptr || std::strstr(t.name, only) != nullptr) time_shape(t, copy_gbs);
  }
}

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("test_post_attn_fused: no CUDA device, skipping\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs, %zu KB smem opt-in)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.sharedMemPerBlockOptin / 1024);

  // HK_TEST_TIMING_ONLY=<text>: the timing table's shapes whose names contain <text>, no checks.
  if (const char* only = std::getenv("HK_TEST_TIMING_ONLY"); only && *only) {
    run_timings(only);
    return 0;
  }
  // HK_TEST_ATTENTION_ONLY=1 (e.g. under compute-sanitizer): the attention-chain checks alone.
  if (const char* only = std::getenv("HK_TEST_ATTENTION_ONLY"); only && *only && *only != '0') {
    int n = 0;
    const int failures = attention_chain_checks(n) + model_checks(n);
    std::printf("\n%d checks, %d failed\n", n, failures);
    return failures == 0 ? 0 : 1;
  }
  std::vector<Case> cases;
  const int shapes[][2] = {{64, 64}, {128, 128}, {256, 256}, {128, 256}, {96, 160}, {32, 48}, {256, 64}};
  const int64_t row_counts[] = {1, 63, 64, 1000, 130 * 7};
  for (const auto& sh : shapes) {
    for (const int64_t r : row_counts) {
      Case c;
      c.D = sh[0];
      c.F = sh[1];
      c.rows = r;
      cases.push_back(c);  // layer, separate x_out
      c.alias = true;
      cases.push_back(c);  // layer, x_out == x_in
      c.alias = false;
      c.tail = true;
      c.S = r == 130 * 7 ? 130 : 7;
      c.lens = Lens::random;
      cases.push_back(c);  // tail, random lengths
      c.lens = Lens::none;
      cases.push_back(c);  // tail, lengths null
    }
    Case c;  // tail with 0/1/S lengths and NaN in padded rows' inputs
    c.D = sh[0];
    c.F = sh[1];
    c.rows = 1000;
    c.tail = true;
    c.S = 13;
    c.lens = Lens::edge;
    c.nan_pad = true;
    c.note = "nanpad";
    cases.push_back(c);
  }
  // Persistent loops: many row blocks per warp (resident) / per CTA (streamed), sampled rows.
  for (const auto& sh : {std::pair<int, int>{64, 64}, {128, 128}, {256, 256}, {96, 160}}) {
    for (const bool tail : {false, true}) {
      Case c;
      c.D = sh.first;
      c.F = sh.second;
      c.rows = 200003;
      c.tail = tail;
      c.S = 128;
      c.lens = tail ? Lens::random : Lens::none;
      c.sample = 1024;
      c.note = "persistent";
      cases.push_back(c);
    }
  }
  // Explicit tile configurations (d128: warps x o double buffer; d256: fewer warps).
  for (const PostAttnConfig cfg : {PostAttnConfig{1, 0}, PostAttnConfig{4, 1}, PostAttnConfig{8, 0},
                                   PostAttnConfig{12, 1}, PostAttnConfig{12, 0}}) {
    Case c;
    c.rows = 100001;
    c.cfg = cfg;
    c.sample = 768;
    c.alias = cfg.prefetch == 1;
    c.note = "config";
    cases.push_back(c);
  }
  // Each row count as a layer (aliased where odd) and as a tail (S = 16; lengths edge-mixed where
  // odd, random otherwise; NaN in the padded rows at 1000).
  const auto add_layer_and_tail = [&cases](int D, int F, const PostAttnConfig& cfg,
                                           std::initializer_list<int64_t> row_counts, const char* note) {
    for (const int64_t rows : row_counts) {
      for (const bool tail : {false, true}) {
        Case c = sweep_case(D, F, rows, cfg, note);
        c.tail = tail;
        c.S = rows == 1 ? 1 : 16;
        c.lens = tail ? (rows % 2 == 1 ? Lens::edge : Lens::random) : Lens::none;
        c.nan_pad = tail && rows == 1000;
        c.alias = !tail && rows % 2 == 1;
        cases.push_back(c);
      }
    }
  };
  // Warpgroup kernels (wgmma = 1; sm_90a builds on compute capability 9.0, else the row-per-warp
  // kernel runs): groups of 4 warps over 64 rows, with row counts that leave a group's last
  // blocks (or all but one of its rows) past the end, the o double buffer, 4 / 8 / 12 / 16 warps,
  // erf and tanh GELU, d64 and d128, layer (aliased or not) and tail (every lengths mode).
  for (const auto& sh : {std::pair<int, int>{128, 128}, {64, 64}}) {
    for (const PostAttnConfig cfg : {PostAttnConfig{0, -1, 0, 0, 0, 1}, PostAttnConfig{0, -1, 0, 0, 1, 1},
                                     PostAttnConfig{4, 0, 0, 0, 0, 1}, PostAttnConfig{8, 1, 0, 0, 1, 1},
                                     PostAttnConfig{12, 0, 0, 0, 1, 1}, PostAttnConfig{16, 1, 0, 0, 0, 1}}) {
      add_layer_and_tail(sh.first, sh.second, cfg, {1, 15, 17, 64, 65, 1000, 100001}, "wgmma");
    }
  }
  for (const PostAttnConfig cfg : {PostAttnConfig{2, -1}, PostAttnConfig{5, -1}}) {
    Case c;
    c.D = 256;
    c.F = 256;
    c.rows = 30011;
    c.cfg = cfg;
    c.sample = 512;
    c.note = "config";
    cases.push_back(c);
  }
  // Column-split kernel: every width and group count, row counts around the 16-row block and the
  // persistent loop (100001 rows: many row blocks per group), aliasing, every lengths mode, NaN in
  // padded rows, D = 64 and 128.
  for (const auto& sh : {std::pair<int, int>{128, 128}, {64, 64}}) {
    for (const PostAttnConfig cfg : {PostAttnConfig{8, 0, 8}, PostAttnConfig{16, 0, 8}, PostAttnConfig{4, 0, 4},
                                     PostAttnConfig{16, 0, 4}, PostAttnConfig{8, 0, 8, 1}}) {
      add_layer_and_tail(sh.first, sh.second, cfg, {1, 15, 17, 128, 1000, 100001}, "split");
    }
  }
  // Gathered residual (x_rows): the row-per-warp kernels (d64, d128 with and without the o double
  // buffer and the tanh GELU, d256 streamed, the padded ones) and the column-split kernel.
  for (const auto& sh : {std::pair<int, int>{128, 128}, {64, 64}, {256, 256}, {96, 160}, {40, 72}}) {
    for (const PostAttnConfig cfg : {PostAttnConfig{}, PostAttnConfig{0, 0}, PostAttnConfig{0, -1, 0, 0, 1},
                                     PostAttnConfig{16, 0, 8}, PostAttnConfig{8, 0, 8, 1},
                                     PostAttnConfig{0, -1, 0, 0, 1, 1}}) {
      if (cfg.split > 0 && sh.first != sh.second) continue;
      if (cfg.split > 0 && sh.first == 256) continue;
      for (const int64_t rows : {int64_t(1), int64_t(17), int64_t(1000), int64_t(20000), int64_t(200000)}) {
        // 200000 rows: warps of the row-per-warp kernels take several row blocks (the gathered L2
        // prefetch of the next block runs); checked on a sample.
        if (rows == 200000 && !(sh.first == sh.second && sh.first <= 128 && cfg.split == 0)) continue;
        Case c = sweep_case(sh.first, sh.second, rows, cfg, "gather");
        c.gather = true;
        cases.push_back(c);
      }
    }
  }
  // x_in / x_out / y 8- but not 16-byte aligned (the least the launch accepts; the kernels store
  // them with 8-byte vector instructions), nothing written before them: layer, aliased, gathered
  // and tail rows, erf and tanh GELU, one and several row blocks per warp, exact, padded and
  // column-split kernels.
  for (const auto& sh : {std::pair<int, int>{128, 128}, {64, 64}, {96, 160}}) {
    for (const PostAttnConfig cfg : {PostAttnConfig{}, PostAttnConfig{0, -1, 0, 0, 1}, PostAttnConfig{8, 0, 8},
                                     PostAttnConfig{0, -1, 0, 0, 0, 1}}) {
      if (cfg.split > 0 && sh.first != sh.second) continue;  // the column split: exact shapes only
      for (const int64_t rows : {int64_t(17), int64_t(1000), int64_t(200000)}) {
        for (int kind = 0; kind < 4; ++kind) {  // layer, aliased layer, gathered layer, tail
          Case c = sweep_case(sh.first, sh.second, rows, cfg, "offset8");
          c.offset8 = true;
          c.alias = kind == 1;
          c.gather = kind == 2;
          c.tail = kind == 3;
          c.S = 13;
          c.lens = c.tail ? Lens::random : Lens::none;
          cases.push_back(c);
        }
      }
    }
  }
  // Graph capture (launch-only, no allocation, no attribute change inside the capture).
  for (const auto& sh : {std::pair<int, int>{128, 128}, {256, 256}}) {
    Case c;
    c.D = sh.first;
    c.F = sh.second;
    c.rows = 4099;
    c.graph = true;
    c.note = "graph";
    cases.push_back(c);
    c.tail = true;
    c.S = 128;
    c.lens = Lens::random;
    cases.push_back(c);
  }
  {
    Case c;
    c.rows = 4099;
    c.graph = true;
    c.cfg = PostAttnConfig{16, 0, 8};
    c.note = "graph";
    cases.push_back(c);
    c.cfg = PostAttnConfig{8, 0, 8, 1};
    cases.push_back(c);
    c.cfg = PostAttnConfig{0, -1, 0, 0, 1, 1};
    cases.push_back(c);
  }

  std::printf("\n%-4s %-42s %-4s %-4s %-7s %-5s %-5s %-6s %-9s %-11s %-7s %-9s %-9s %-5s %-5s %-5s %-5s %s\n", "#",
              "kernel", "D", "F", "rows", "kind", "alias", "lens", "config", "note", "rows_ck", "x_err", "ln_ratio",
              "bad", "unwr", "pad", "guard", "result");
  int failures = 0, n = 0;
  for (const Case& c : cases) {
    const Outcome r = run_case(c, 0x5eed0000ull + uint64_t(n) * 7919ull);
    const bool ok = r.ok();
    failures += ok ? 0 : 1;
    std::printf("%-4d %-42s %-4d %-4d %-7lld %-5s %-5s %-6s %-9s %-11s %-7lld %-9.2e %-9.3f %-5ld %-5ld %-5ld %-5ld %s%s%s\n",
                n, hk::cuda::post_attn_fused_name(c.D, c.F), c.D, c.F, static_cast<long long>(c.rows),
                c.tail ? "tail" : "layer", c.alias ? "yes" : "no", c.tail ? lens_name(c.lens) : "-",
                cfg_name(c.cfg).c_str(), c.note.c_str(), static_cast<long long>(r.checked_rows), r.x_err, r.ratio,
                r.bad_x + r.bad_ln, r.unwritten, r.pad_nonzero, r.guard + r.x_in_changed, ok ? "PASS" : "FAIL",
                r.error.empty() ? "" : ": ", r.error.c_str());
    ++n;
  }
  // LayerNorm on hard rows (constant, 1e4 +- 1): every kernel variant, layer and tail.
  // The column-split kernel (D = F = 64 / 128) combines its statistics across warps: checked too.
  std::printf("\n%-4s %-42s %-4s %-4s %-7s %-5s %-6s %-12s %-9s %-6s %-9s %-5s %s\n", "#", "kernel", "D", "F", "rows",
              "kind", "mode", "config", "err/tol", "bad", "not_exact", "unwr", "result");
  for (const auto& sh : shapes) {
    std::vector<PostAttnConfig> cfgs{PostAttnConfig{}};
    if ((sh[0] == 64 && sh[1] == 64) || (sh[0] == 128 && sh[1] == 128)) {
      cfgs.push_back(PostAttnConfig{16, 0, 8});
      cfgs.push_back(PostAttnConfig{8, 0, 4});
      cfgs.push_back(PostAttnConfig{8, 0, 8, 1});
      cfgs.push_back(PostAttnConfig{0, -1, 0, 0, 0, 1});
    }
    for (const PostAttnConfig& cfg : cfgs) {
      for (const bool tail : {false, true}) {
        for (const LnMode mode : {LnMode::exact, LnMode::ln2}) {
          if (mode == LnMode::ln2 && tail) continue;  // x_out is not stored in the tail
          const LnOutcome r = run_ln_case(sh[0], sh[1], 203, tail, mode, 0x1A7E0000ull + uint64_t(n) * 31ull, cfg);
          failures += r.ok() ? 0 : 1;
          std::printf("%-4d %-42s %-4d %-4d %-7d %-5s %-6s %-12s %-9.3f %-6ld %-9ld %-5ld %s%s%s\n", n,
                      hk::cuda::post_attn_fused_name(sh[0], sh[1]), sh[0], sh[1], 203, tail ? "tail" : "layer",
                      mode == LnMode::exact ? "exact" : "ln2", cfg_name(cfg).c_str(), r.ratio, r.bad, r.not_exact,
                      r.unwritten, r.ok() ? "PASS" : "FAIL", r.error.empty() ? "" : ": ", r.error.c_str());
          ++n;
        }
      }
    }
  }

  // Tail with row_dst (packed rows scattered to the padded layout) vs the dense tail.
  std::printf("\n%-4s %-42s %-4s %-4s %-5s %-4s %-6s %-6s %-9s %-9s %-8s %-6s %-5s %s\n", "#", "kernel", "D", "F", "B",
              "S", "T", "Tcap", "config", "err/tol", "mismatch", "stray", "bad", "result");
  for (const auto& sh : shapes) {
    for (const auto& bs : {std::pair<int, int>{3, 7}, {37, 128}, {1, 1}}) {
      const std::vector<PostAttnConfig> cands = hk::cuda::post_attn_fused_candidates(sh[0], sh[1], 1000);
      for (const PostAttnConfig& cfg : {PostAttnConfig{}, cands.size() > 1 ? cands.back() : PostAttnConfig{}}) {
        const DstOutcome r = run_row_dst_case(sh[0], sh[1], bs.first, bs.second, bs.first == 1 ? 0 : 21, cfg,
                                              0xD57D0000ull + uint64_t(n) * 17ull);
        failures += r.ok() ? 0 : 1;
        std::printf("%-4d %-42s %-4d %-4d %-5d %-4d %-6lld %-6lld %-9s %-9.3f %-8ld %-6ld %-5ld %s%s%s\n", n,
                    hk::cuda::post_attn_fused_name(sh[0], sh[1]), sh[0], sh[1], bs.first, bs.second,
                    static_cast<long long>(r.T), static_cast<long long>(r.Tcap), cfg_name(cfg).c_str(), r.ratio,
                    r.mismatch, r.stray, r.bad + r.unwritten, r.ok() ? "PASS" : "FAIL", r.error.empty() ? "" : ": ",
                    r.error.c_str());
        ++n;
        if (cands.size() <= 1) break;
      }
    }
  }

  // Tuning candidates: the automatic configuration first, every other one runs exactly as given
  // (post_attn_fused_effective) and no two run the same; each is then run and checked.
  std::printf("\ncandidates (post_attn_fused_candidates; effective warps.prefetch in brackets)\n");
  std::vector<Case> cand_cases;
  for (const auto& sh : {std::pair<int, int>{64, 64}, {128, 128}, {256, 256}, {96, 160}, {128, 256}}) {
    for (const int64_t rows : {int64_t(128), int64_t(1000), int64_t(8192)}) {
      // With the tanh-GELU entries (exact resident kernels); each is checked against a reference with
      // the same GELU form.
      const std::vector<PostAttnConfig> cands = hk::cuda::post_attn_fused_candidates(sh.first, sh.second, rows, true);
      bool ok = !cands.empty() && cands[0] == PostAttnConfig{};
      const bool resident = (sh.first == 64 && sh.second == 64) || (sh.first == 128 && sh.second == 128);
      size_t tanh_entries = 0;
      for (const PostAttnConfig& pc : cands) tanh_entries += pc.gelu_tanh ? 1 : 0;
      // Exactly the row-per-warp entries again, for the exact resident kernels; none elsewhere.
      size_t row_per_warp = 0;
      for (const PostAttnConfig& pc : cands) row_per_warp += pc.split == 0 && !pc.gelu_tanh ? 1 : 0;
      if (tanh_entries != (resident ? row_per_warp : 0)) ok = false;
      std::vector<PostAttnConfig> runs;
      std::string list;
      for (size_t i = 0; i < cands.size(); ++i) {
        const PostAttnConfig eff = hk::cuda::post_attn_fused_effective(sh.first, sh.second, rows, cands[i]);
        if (eff.gelu_tanh != cands[i].gelu_tanh || eff.wgmma != cands[i].wgmma) ok = false;
        if (i > 0 && (eff.warps != cands[i].warps || eff.split != cands[i].split ||
                      eff.reg_weights != cands[i].reg_weights ||
                      (cands[i].prefetch >= 0 && eff.prefetch != cands[i].prefetch))) {
          ok = false;
        }
        if (std::find(runs.begin(), runs.end(), eff) != runs.end()) ok = false;
        runs.push_back(eff);
        list += " " + cfg_name(cands[i]) + "[" + std::to_string(eff.warps) + "." + std::to_string(eff.prefetch) +
                (eff.split > 0 ? ".s" + std::to_string(eff.split) : std::string()) + (eff.reg_weights ? "r" : "") + (eff.gelu_tanh ? "t" : "") + (eff.wgmma ? "g" : "") + "]";
        Case c;
        c.D = sh.first;
        c.F = sh.second;
        c.rows = rows;
        c.cfg = cands[i];
        c.sample = rows > 1000 ? 1024 : 0;
        c.tail = i % 2 == 1;
        c.S = 128;
        c.lens = c.tail ? Lens::random : Lens::none;
        c.alias = !c.tail && i % 4 == 2;
        c.note = "candidate";
        cand_cases.push_back(c);
      }
      failures += ok ? 0 : 1;
      std::printf("%-4d D=%-3d F=%-3d rows=%-5lld %s:%s\n", n, sh.first, sh.second, static_cast<long long>(rows),
                  ok ? "PASS" : "FAIL", list.c_str());
      ++n;
    }
  }
  for (const Case& c : cand_cases) {
    const Outcome r = run_case(c, 0xCA4D0000ull + uint64_t(n) * 7919ull);
    const bool ok = r.ok();
    failures += ok ? 0 : 1;
    std::printf("%-4d %-42s %-4d %-4d %-7lld %-5s %-5s %-6s %-9s %-11s %-7lld %-9.2e %-9.3f %-5ld %-5ld %-5ld %-5ld %s%s%s\n",
                n, hk::cuda::post_attn_fused_name(c.D, c.F), c.D, c.F, static_cast<long long>(c.rows),
                c.tail ? "tail" : "layer", c.alias ? "yes" : "no", c.tail ? lens_name(c.lens) : "-",
                cfg_name(c.cfg).c_str(), c.note.c_str(), static_cast<long long>(r.checked_rows), r.x_err, r.ratio,
                r.bad_x + r.bad_ln, r.unwritten, r.pad_nonzero, r.guard + r.x_in_changed, ok ? "PASS" : "FAIL",
                r.error.empty() ? "" : ": ", r.error.c_str());
    ++n;
  }
  // The tanh-GELU flag runs another kernel where one exists (d64, d128: outputs differ from the erf
  // twin's on the same data) and nothing else where none does (d256, padded: same bits).
  for (const auto& sh : {std::pair<int, int>{64, 64}, {128, 128}, {256, 256}, {96, 160}}) {
    const bool has = sh.first == sh.second && sh.first <= 128;
    Case c;
    c.D = sh.first;
    c.F = sh.second;
    c.rows = 1000;
    const Outcome e = run_case(c, 0x7A4E0000ull + uint64_t(sh.first));
    c.cfg.gelu_tanh = 1;
    const Outcome t = run_case(c, 0x7A4E0000ull + uint64_t(sh.first));
    const bool ok = e.ok() && t.ok() && (has ? e.hash != t.hash : e.hash == t.hash);
    std::printf("%-4d tanh flag D=%d F=%d: outputs %s the erf twin's (expected %s): %s\n", n, sh.first, sh.second,
                e.hash == t.hash ? "equal" : "differ from", has ? "differ" : "equal", ok ? "PASS" : "FAIL");
    failures += ok ? 0 : 1;
    ++n;
  }
  // The warpgroup flag runs the warpgroup kernels wherever this build has them and the device is
  // compute capability 9.0 (an sm_90a build: HK_TEST_EXPECT_WGMMA), and nowhere else.
  {
    int dev = 0, major = 0, minor = 0;
    CHECK_CUDA(cudaGetDevice(&dev));
    CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
#if defined(HK_TEST_EXPECT_WGMMA) && HK_TEST_EXPECT_WGMMA
    const bool expect = major == 9 && minor == 0;
#else
    const bool expect = false;
#endif
    bool ok = true;
    std::string list;
    for (const auto& sh : {std::pair<int, int>{64, 64}, {128, 128}, {256, 256}, {96, 160}}) {
      const PostAttnConfig eff =
          hk::cuda::post_attn_fused_effective(sh.first, sh.second, 1000, PostAttnConfig{0, -1, 0, 0, 0, 1});
      const bool want = expect && sh.first == sh.second && sh.first <= 128;
      ok = ok && (eff.wgmma == 1) == want;
      list += " D=" + std::to_string(sh.first) + ":" + std::to_string(eff.wgmma);
    }
    std::printf("%-4d wgmma flag (device %d.%d, expected on the exact resident kernels: %s):%s: %s\n", n, major,
                minor, expect ? "yes" : "no", list.c_str(), ok ? "PASS" : "FAIL");
    failures += ok ? 0 : 1;
    ++n;
  }
  // x_rows is refused in the tail and with x_out == x_in.
  {
    const int D = 128, F = 128;
    std::mt19937_64 rng(5);
    const Model m = make_model(D, F, rng);
    const DevModel dm(m);
    Dev<__half> o(size_t(16) * D), h(size_t(16) * D);
    Dev<float> x(size_t(16) * D), x2(size_t(16) * D);
    Dev<int32_t> map(16);
    std::vector<int32_t> ident(16);
    for (int i = 0; i < 16; ++i) ident[size_t(i)] = 15 - i;
    map.up(ident);
    x.up(std::vector<float>(size_t(16) * D, 0.25f));
    o.up(std::vector<__half>(size_t(16) * D, __float2half(0.5f)));
    PostAttnParams p = dm.params(m);
    p.o = o.p;
    p.x_in = x.p;
    p.x_out = x2.p;
    p.h_out = h.p;
    p.x_rows = map.p;
    p.rows = 16;
    auto refused = [&](const PostAttnParams& q) {
      try {
        hk::cuda::post_attn_fused(q, nullptr);
      } catch (const std::invalid_argument&) {
        return true;
      }
      return false;
    };
    PostAttnParams tail = p;
    tail.tail = true;
    tail.y = x2.p;
    tail.h_out = nullptr;
    PostAttnParams alias = p;
    alias.x_out = x.p;
    const bool ok = refused(tail) && refused(alias) && !refused(p);
    CHECK_CUDA(cudaDeviceSynchronize());
    std::printf("%-4d x_rows: refused in the tail and with x_out == x_in, accepted otherwise: %s\n", n,
                ok ? "PASS" : "FAIL");
    failures += ok ? 0 : 1;
    ++n;
  }
  // The chain with the next layer's QKV projection: every candidate configuration, row counts
  // around the 16-row block and the persistent loop, h_out given or not, aliasing, gathered
  // residual, graph capture, D = 64 and 128.
  for (const int D : {128, 64}) {
    if (!hk::cuda::post_attn_qkv_supports(D, D)) {
      std::printf("%-4d post_attn_qkv D=%d: not supported on this device: FAIL\n", n, D);
      ++failures;
      ++n;
      continue;
    }
    for (const int64_t rows : {int64_t(1), int64_t(7), int64_t(16), int64_t(47), int64_t(128), int64_t(1000),
                               int64_t(4352), int64_t(60001)}) {
      const std::vector<PostAttnConfig> cands = hk::cuda::post_attn_qkv_candidates(D, D, rows);
      for (size_t ci = 0; ci < cands.size(); ++ci) {
        QkvCase c;
        c.D = D;
        c.rows = rows;
        c.cfg = cands[ci];
        c.with_h = (rows + int64_t(ci)) % 2 == 0;
        c.alias = rows == 47 || rows == 60001;
        c.gather = rows == 128 || rows == 4352;
        c.graph = rows == 1000;
        c.sample = rows > 5000 ? 1024 : 0;
        const QkvOutcome r = run_qkv_case(c, 7000 + uint64_t(n));
        std::printf("%-4d post_attn_qkv D=%-3d rows=%-6lld %-10s h_out=%d alias=%d gather=%d graph=%d  "
                    "qkv ratio %.3f own %.3f  bad x/h/qkv/own %ld/%ld/%ld/%ld unwritten %ld guard %ld %s: %s\n",
                    n, D, (long long)rows, cfg_name(c.cfg).c_str(), int(c.with_h), int(c.alias), int(c.gather),
                    int(c.graph), r.ratio, r.own_ratio, r.bad_x, r.bad_h, r.bad_qkv, r.bad_qkv_own, r.unwritten,
                    r.guard, r.error.c_str(), r.ok() ? "PASS" : "FAIL");
        failures += r.ok() ? 0 : 1;
        ++n;
      }
      if (cands.empty()) {
        std::printf("%-4d post_attn_qkv D=%d rows=%lld: no candidate: FAIL\n", n, D, (long long)rows);
        ++failures;
        ++n;
      }
    }
  }
  failures += attention_chain_checks(n);
  failures += model_checks(n);
  // qkv_out is refused outside the width-8 column-split kernel, in the tail and without Wqkv.
  {
    const int D = 128;
    std::mt19937_64 rng(11);
    const Model m = make_model(D, D, rng);
    const DevModel dm(m);
    Dev<__half> o(size_t(16) * D), qkv(size_t(16) * 3 * D), wq(size_t(3) * D * D), bq(size_t(3) * D);
    Dev<float> x(size_t(16) * D), x2(size_t(16) * D);
    PostAttnParams p = dm.params(m);
    p.o = o.p;
    p.x_in = x.p;
    p.x_out = x2.p;
    p.qkv_out = qkv.p;
    p.w_qkv = wq.p;
    p.b_qkv = bq.p;
    p.rows = 16;
    auto refused = [&](const PostAttnParams& q, const PostAttnConfig& cfg) {
      try {
        hk::cuda::post_attn_fused(q, nullptr, cfg);
      } catch (const std::invalid_argument&) {
        return true;
      }
      return false;
    };
    PostAttnParams no_w = p;
    no_w.w_qkv = nullptr;
    PostAttnParams tail = p;
    tail.tail = true;
    tail.y = x2.p;
    const bool ok = refused(p, PostAttnConfig{}) && refused(p, PostAttnConfig{8, 0, 4}) &&
                    refused(no_w, PostAttnConfig{8, 0, 8}) && refused(tail, PostAttnConfig{8, 0, 8}) &&
                    !hk::cuda::post_attn_qkv_supports(256, 256) && !hk::cuda::post_attn_qkv_supports(96, 160);
    CHECK_CUDA(cudaDeviceSynchronize());
    std::printf("%-4d qkv_out: refused with the row-per-warp and width-4 kernels, without w_qkv, in the tail; "
                "D=256, D=96/F=160 unsupported: %s\n",
                n, ok ? "PASS" : "FAIL");
    failures += ok ? 0 : 1;
    ++n;
  }
  // Unsupported shapes are refused, not run.
  {
    const bool refused = !hk::cuda::post_attn_fused_supports(1024, 1024) && !hk::cuda::post_attn_fused_supports(120, 100) &&
                         !hk::cuda::post_attn_fused_supports(264, 256) && !hk::cuda::post_attn_fused_supports(0, 64);
    std::printf("%-4d supports(): D=1024, D=120/F=100, D=264, D=0 refused: %s\n", n, refused ? "PASS" : "FAIL");
    failures += refused ? 0 : 1;
    ++n;
  }
  std::printf("\n%d checks, %d failed\n", n, failures);
  // HK_TEST_NO_TIMING=1 (e.g. under compute-sanitizer): correctness only.
  if (const char* nt = std::getenv("HK_TEST_NO_TIMING"); nt && *nt && *nt != '0') return failures == 0 ? 0 : 1;

  run_timings(nullptr);
  return failures == 0 ? 0 : 1;
}
