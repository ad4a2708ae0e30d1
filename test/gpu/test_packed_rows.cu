// GPU test of the row kernels (rownorm.cuh): LayerNorm accuracy on hard rows (constant rows,
// rows of magnitude 1e4 with spread 1) for layer_norm / final_layer_norm, and the padding-free
// route: packed_offsets, pack_layer_norm, final_layer_norm_packed. Standalone program: one table
// row per check, exit 0 when all pass, 1 on any failure, 77 when no CUDA device is present.
//
// Every case: fresh random inputs (fixed seed per case), outputs poisoned (NaN for float / half,
// 0x7F7F7F7F for int32) with guard rows past the end, padded input rows NaN (they must never be
// read), float64 CPU reference. Tolerances:
//   fp32 output: |err| <= 2e-5 (1 + |ref|)   (fp32 statistics of a shifted row; the unshifted
//                                             formula misses by ~1e-3 on the 1e4 +- 1 rows)
//   fp16 output: |err| <= 2^-11 |ref| + 1e-4 (one fp16 rounding)
//   constant rows: output == b exactly (fp16: == fp16(b))
//   packed copies, zeros, row_dst, seq_start, overflow flag: exact.
// Branches: D = 64 / 128 / 256 (warp per row, float4), 100 (scalar loads), 1024 (warp, 8 float4
// per lane), 1030 (block per row, scalar), 9000 (block loop); lengths 0 / 1 / S / random / null;
// Tcap = T, > T, > B*S (tail rows past the padded count), < T (overflow); y separate, aliasing
// x, or null; f16 and f32 activations; one pipeline through a captured CUDA graph.
#include "rownorm.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using hk::cuda::DType;

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

constexpr int kGuardRows = 8;
constexpr int32_t kIntPoison = 0x7F7F7F7F;

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T))); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void up(const std::vector<T>& v) {
    CHECK_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  std::vector<T> down() const {
    std::vector<T> v(n);
    CHECK_CUDA(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  void fill_bytes(int byte) {
    CHECK_CUDA(cudaMemset(p, byte, std::max<size_t>(n, 1) * sizeof(T)));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
};

bool nan_bits_f32(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u == 0xFFFFFFFFu;
}
bool nan_bits_f16(__half v) {
  uint16_t u;
  std::memcpy(&u, &v, 2);
  return u == 0xFFFFu;
}
bool zero_bits_f32(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u == 0u;
}
bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// Row kinds: 0 N(0, 1) * scale + offset, 1 constant, 2 1e4 + U(-1, 1), 3 -3e4 constant.
void fill_row(float* r, int D, int kind, std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  switch (kind) {
    case 1: {
      const float c = float(u(rng) * 7.0);
      for (int k = 0; k < D; ++k) r[k] = c;
      break;
    }
    case 2:
      for (int k = 0; k < D; ++k) r[k] = float(1e4 + u(rng));
      break;
    case 3: {
      const float c = float(-3e4 * (1.0 + 0.1 * u(rng)));
      for (int k = 0; k < D; ++k) r[k] = c;
      break;
    }
    default: {
      const double scale = std::exp(u(rng) * 2.0), offset = u(rng) * 3.0;
      for (int k = 0; k < D; ++k) r[k] = float(nd(rng) * scale + offset);
    }
  }
}

bool row_constant(const float* r, int D) {
  for (int k = 1; k < D; ++k) {
    if (!same_bits(r[k], r[0])) return false;
  }
  return true;
}

void ln_ref(const float* x, int D, const std::vector<float>& w, const std::vector<float>& b, double eps,
            std::vector<double>& out) {
  double mean = 0;
  for (int k = 0; k < D; ++k) mean += double(x[k]);
  mean /= D;
  double var = 0;
  for (int k = 0; k < D; ++k) var += (double(x[k]) - mean) * (double(x[k]) - mean);
  var /= D;
  const double rstd = 1.0 / std::sqrt(var + eps);
  out.resize(size_t(D));
  for (int k = 0; k < D; ++k) out[size_t(k)] = (double(x[k]) - mean) * rstd * double(w[size_t(k)]) + double(b[size_t(k)]);
}

// Error counters of one check.
struct Tally {
  long bad = 0;       // values outside tolerance
  long unwritten = 0; // poison left where the kernel must write
  long stray = 0;     // writes where the kernel must not write (guards, padded rows, untouched buffers)
  long exact = 0;     // exactness violations (copies, zeros, row_dst, constant rows, flags)
  double worst = 0;   // max err / tol
  std::string error;
  bool ok() const { return error.empty() && bad == 0 && unwritten == 0 && stray == 0 && exact == 0; }
};

void check_value(Tally& t, double got, double ref, bool f16) {
  const double tol = f16 ? std::ldexp(std::fabs(ref), -11) + 1e-4 : 2e-5 * (1.0 + std::fabs(ref));
  const double e = std::fabs(got - ref);
  if (!(e <= tol)) ++t.bad;
  t.worst = std::max(t.worst, std::isfinite(e) ? e / tol : 1e30);
}

// Checks one LN output row (f32 or f16 storage) against the reference; constant rows exactly b.
template <class T>
void check_ln_row(Tally& t, const T* got, const float* x, int D, const std::vector<float>& w,
                  const std::vector<float>& b, float eps) {
  constexpr bool f16 = sizeof(T) == 2;
  std::vector<double> ref;
  ln_ref(x, D, w, b, eps, ref);
  const bool constant = row_constant(x, D);
  for (int k = 0; k < D; ++k) {
    double v;
    if constexpr (f16) {
      if (nan_bits_f16(got[k])) { ++t.unwritten; continue; }
      v = double(__half2float(got[k]));
      if (constant && !(__half2float(got[k]) == __half2float(__float2half_rn(b[size_t(k)])))) ++t.exact;
    } else {
      if (nan_bits_f32(got[k])) { ++t.unwritten; continue; }
      v = double(got[k]);
      if (constant && !(got[k] == b[size_t(k)])) ++t.exact;
    }
    check_value(t, v, ref[size_t(k)], f16);
  }
}

void make_ln_params(int D, std::mt19937_64& rng, std::vector<float>& w, std::vector<float>& b) {
  std::uniform_real_distribution<double> uw(0.5, 1.5), ub(-0.5, 0.5);
  w.resize(size_t(D));
  b.resize(size_t(D));
  for (auto& v : w) v = float(uw(rng));
  for (auto& v : b) v = float(ub(rng));
}

// ---- 1. layer_norm / final_layer_norm on hard rows ---------------------------------------------
Tally run_dense(int D, int64_t rows, DType act, bool final_ln, uint64_t seed) {
  Tally t;
  std::mt19937_64 rng(seed);
  const float eps = 1e-5f;
  std::vector<float> w, b;
  make_ln_params(D, rng, w, b);
  const int S = 5;
  const int64_t B = (rows + S - 1) / S;
  std::vector<int32_t> lengths(size_t(std::max<int64_t>(B, 1)));
  std::uniform_int_distribution<int> ul(0, S);
  for (auto& l : lengths) l = ul(rng);
  auto valid = [&](int64_t r) { return !final_ln || (r % S) < lengths[size_t(r / S)]; };
  std::vector<float> x(size_t(rows + kGuardRows) * D);
  for (int64_t r = 0; r < rows + kGuardRows; ++r) {
    if (r >= rows || !valid(r)) {
      std::fill(x.begin() + r * D, x.begin() + (r + 1) * D, std::nanf(""));
    } else {
      fill_row(&x[size_t(r) * D], D, int(r % 4), rng);
    }
  }
  const size_t esz = act == DType::f16 ? 2 : 4;
  Dev<float> dx(x.size()), dw(w.size()), db(b.size());
  Dev<unsigned char> dout(x.size() * esz);
  Dev<int32_t> dlen(lengths.size());
  dx.up(x);
  dw.up(w);
  db.up(b);
  dlen.up(lengths);
  dout.fill_bytes(0xFF);
  try {
    if (final_ln) {
      hk::cuda::final_layer_norm(dx.p, reinterpret_cast<float*>(dout.p), dw.p, db.p, rows, D, eps, dlen.p, S, nullptr);
    } else {
      hk::cuda::layer_norm(dx.p, dout.p, act, dw.p, db.p, rows, D, eps, nullptr);
    }
    CHECK_CUDA(cudaDeviceSynchronize());
  } catch (const std::exception& e) {
    t.error = e.what();
    return t;
  }
  CHECK_CUDA(cudaGetLastError());
  const std::vector<unsigned char> out = dout.down();
  for (int64_t r = 0; r < rows + kGuardRows; ++r) {
    const unsigned char* row = out.data() + size_t(r) * D * esz;
    if (r >= rows) {  // guard: untouched
      for (size_t i = 0; i < size_t(D) * esz; ++i) t.stray += row[i] != 0xFF;
      continue;
    }
    if (!valid(r)) {  // final: padded rows exactly zero
      const float* y = reinterpret_cast<const float*>(row);
      for (int k = 0; k < D; ++k) {
        if (nan_bits_f32(y[k])) ++t.unwritten;
        else if (!zero_bits_f32(y[k])) ++t.exact;
      }
      continue;
    }
    if (esz == 2) {
      check_ln_row(t, reinterpret_cast<const __half*>(row), &x[size_t(r) * D], D, w, b, eps);
    } else {
      check_ln_row(t, reinterpret_cast<const float*>(row), &x[size_t(r) * D], D, w, b, eps);
    }
  }
  return t;
}

// ---- 2. packed_offsets --------------------------------------------------------------------------
enum class Lens { null, all_s, random, edge, zeros, wild };  // wild: negative and > S (clamped)
const char* lens_name(Lens l) {
  switch (l) {
    case Lens::null: return "null";
    case Lens::all_s: return "S";
    case Lens::random: return "rand";
    case Lens::edge: return "0/1/S";
    case Lens::zeros: return "0";
    default: return "wild";
  }
}

std::vector<int32_t> make_lengths(Lens l, int B, int S, std::mt19937_64& rng) {
  std::vector<int32_t> v(static_cast<size_t>(B));
  std::uniform_int_distribution<int> ul(0, S);
  for (int b = 0; b < B; ++b) {
    switch (l) {
      case Lens::all_s: v[size_t(b)] = S; break;
      case Lens::random: v[size_t(b)] = ul(rng); break;
      case Lens::edge: v[size_t(b)] = b % 3 == 0 ? 0 : (b % 3 == 1 ? 1 : S); break;
      case Lens::zeros: v[size_t(b)] = 0; break;
      case Lens::wild: v[size_t(b)] = b % 4 == 0 ? -5 : (b % 4 == 1 ? S + 9 : ul(rng)); break;
      default: v[size_t(b)] = S;
    }
  }
  return v;
}
int clamp_len(const std::vector<int32_t>& lengths, int b, int S) {
  return lengths.empty() ? S : std::min(std::max(lengths[size_t(b)], 0), S);
}

Tally run_offsets(int B, int S, Lens l, uint64_t seed, double* us) {
  Tally t;
  std::mt19937_64 rng(seed);
  const std::vector<int32_t> lengths = l == Lens::null ? std::vector<int32_t>() : make_lengths(l, B, S, rng);
  Dev<int32_t> dlen(lengths.size()), dst(size_t(B) + 1 + kGuardRows);
  if (!lengths.empty()) dlen.up(lengths);
  dst.fill_bytes(0x7F);
  const int32_t* lp = lengths.empty() ? nullptr : dlen.p;
  try {
    hk::cuda::packed_offsets(lp, B, S, dst.p, nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
  } catch (const std::exception& e) {
    t.error = e.what();
    return t;
  }
  const std::vector<int32_t> got = dst.down();
  int64_t run = 0;
  for (int b = 0; b <= B; ++b) {
    if (got[size_t(b)] == kIntPoison) ++t.unwritten;
    else if (int64_t(got[size_t(b)]) != run) ++t.exact;
    if (b < B) run += clamp_len(lengths, b, S);
  }
  for (int g = 0; g < kGuardRows; ++g) t.stray += got[size_t(B) + 1 + g] != kIntPoison;
  if (us != nullptr) {  // median launch-to-completion time over 101 runs
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int i = 0; i < 101; ++i) {
      CHECK_CUDA(cudaEventRecord(e0));
      hk::cuda::packed_offsets(lp, B, S, dst.p, nullptr);
      CHECK_CUDA(cudaEventRecord(e1));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float v = 0;
      CHECK_CUDA(cudaEventElapsedTime(&v, e0, e1));
      ms.push_back(v);
    }
    std::sort(ms.begin(), ms.end());
    *us = double(ms[ms.size() / 2]) * 1e3;
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
  }
  return t;
}

// ---- 3. the packed pipeline: offsets, pack + LN, final LN scattered back --------------------------
enum class YMode { separate, alias, none };
const char* ymode_name(YMode y) { return y == YMode::separate ? "sep" : (y == YMode::alias ? "alias" : "null"); }

struct PackCase {
  int D = 64, B = 3, S = 7;
  Lens lens = Lens::random;
  DType act = DType::f16;
  int tcap_extra = 0;   // Tcap = T + tcap_extra (negative: overflow)
  bool tcap_beyond = false;  // Tcap = B*S + tcap_extra (tail rows past the padded count)
  YMode y = YMode::separate;
  bool with_o = true;
  bool graph = false;
  bool x_copy = true;  // false: x_packed null (no packed residual copy; the rest must be as with it)
};

Tally run_pack(const PackCase& c, uint64_t seed, int64_t* T_out, int64_t* Tcap_out) {
  Tally t;
  std::mt19937_64 rng(seed);
  const int D = c.D, B = c.B, S = c.S;
  const float eps = 1e-5f;
  const std::vector<int32_t> lengths = c.lens == Lens::null ? std::vector<int32_t>() : make_lengths(c.lens, B, S, rng);
  std::vector<int64_t> start(size_t(B) + 1, 0);
  for (int b = 0; b < B; ++b) start[size_t(b) + 1] = start[size_t(b)] + clamp_len(lengths, b, S);
  const int64_t T = start[size_t(B)];
  const int64_t padded = int64_t(B) * S;
  const int64_t Tcap = std::max<int64_t>(0, (c.tcap_beyond ? padded : T) + c.tcap_extra);
  *T_out = T;
  *Tcap_out = Tcap;
  std::vector<float> w1, b1, w2, b2;
  make_ln_params(D, rng, w1, b1);
  make_ln_params(D, rng, w2, b2);
  auto valid = [&](int64_t row) {
    const int b = int(row / S), s = int(row % S);
    return s < clamp_len(lengths, b, S);
  };
  // x: valid rows of all kinds, padded rows NaN (never read), guard rows NaN.
  std::vector<float> x(size_t(padded + kGuardRows) * D, std::nanf(""));
  for (int64_t r = 0; r < padded; ++r) {
    if (valid(r)) fill_row(&x[size_t(r) * D], D, int(rng() % 4), rng);
  }
  const size_t esz = c.act == DType::f16 ? 2 : 4;
  const size_t prow = size_t(Tcap + kGuardRows);
  Dev<float> dx(x.size()), dy(c.y == YMode::separate ? x.size() : 0), dxp(prow * D);
  Dev<float> dw1(w1.size()), db1(b1.size()), dw2(w2.size()), db2(b2.size());
  Dev<unsigned char> dh(prow * D * esz), dout_o(c.with_o ? prow * D * esz : 0);
  Dev<int32_t> dlen(lengths.size()), dstart(size_t(B) + 1), drow(prow), dflag(1);
  dx.up(x);
  dw1.up(w1);
  db1.up(b1);
  dw2.up(w2);
  db2.up(b2);
  if (!lengths.empty()) dlen.up(lengths);
  if (c.y == YMode::separate) dy.fill_bytes(0xFF);
  dxp.fill_bytes(0xFF);
  dh.fill_bytes(0xFF);
  if (c.with_o) dout_o.fill_bytes(0xFF);
  drow.fill_bytes(0x7F);
  dflag.fill_bytes(0);
  float* y = c.y == YMode::separate ? dy.p : (c.y == YMode::alias ? dx.p : nullptr);

  hk::cuda::PackParams p;
  p.x = dx.p;
  p.lengths = lengths.empty() ? nullptr : dlen.p;
  p.seq_start = dstart.p;
  p.B = B;
  p.S = S;
  p.D = D;
  p.Tcap = Tcap;
  p.x_packed = c.x_copy ? dxp.p : nullptr;
  p.h = dh.p;
  p.o = c.with_o ? dout_o.p : nullptr;
  p.act = c.act;
  p.row_dst = drow.p;
  p.y = y;
  p.w = dw1.p;
  p.b = db1.p;
  p.eps = eps;
  p.overflow = dflag.p;

  std::vector<float> xp, y_mid;
  std::vector<unsigned char> h, o;
  std::vector<int32_t> rd, st;
  try {
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto pack = [&] {
      hk::cuda::packed_offsets(p.lengths, B, S, dstart.p, s);
      hk::cuda::pack_layer_norm(p, s);
    };
    if (c.graph) {
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      pack();
      CHECK_CUDA(cudaStreamEndCapture(s, &g));
      CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
      CHECK_CUDA(cudaGraphLaunch(ge, s));
      CHECK_CUDA(cudaStreamSynchronize(s));
      CHECK_CUDA(cudaGraphExecDestroy(ge));
      CHECK_CUDA(cudaGraphDestroy(g));
    } else {
      pack();
    }
    CHECK_CUDA(cudaStreamSynchronize(s));
    xp = dxp.down();
    h = dh.down();
    if (c.with_o) o = dout_o.down();
    rd = drow.down();
    st = dstart.down();
    if (y != nullptr) y_mid = c.y == YMode::alias ? dx.down() : dy.down();
    if (y != nullptr && c.x_copy) {
      hk::cuda::final_layer_norm_packed(dxp.p, y, drow.p, Tcap, D, dw2.p, db2.p, eps, s);
      CHECK_CUDA(cudaStreamSynchronize(s));
    }
    CHECK_CUDA(cudaStreamDestroy(s));
  } catch (const std::exception& e) {
    t.error = e.what();
    return t;
  }
  CHECK_CUDA(cudaGetLastError());

  // seq_start and the overflow flag
  for (int b = 0; b <= B; ++b) t.exact += int64_t(st[size_t(b)]) != start[size_t(b)];
  const int32_t flag = dflag.down()[0];
  t.exact += flag != (T > Tcap ? 1 : 0);

  // packed rows: valid rows in order, then the tail, then untouched guards
  std::vector<int64_t> src_of(size_t(Tcap), -1);
  for (int64_t r = 0; r < padded; ++r) {
    if (!valid(r)) continue;
    const int64_t d = start[size_t(r / S)] + r % S;
    if (d < Tcap) src_of[size_t(d)] = r;
  }
  for (int64_t r = 0; r < int64_t(prow); ++r) {
    const float* xr = &xp[size_t(r) * D];
    const unsigned char* hr = &h[size_t(r) * D * esz];
    const unsigned char* orow = c.with_o ? &o[size_t(r) * D * esz] : nullptr;
    if (r >= Tcap) {  // guards: untouched
      for (int k = 0; k < D; ++k) t.stray += !nan_bits_f32(xr[k]);
      for (size_t i = 0; i < size_t(D) * esz; ++i) t.stray += hr[i] != 0xFF;
      if (orow) {
        for (size_t i = 0; i < size_t(D) * esz; ++i) t.stray += orow[i] != 0xFF;
      }
      t.stray += rd[size_t(r)] != kIntPoison;
      continue;
    }
    if (r < T) {
      const int64_t src = src_of[size_t(r)];
      if (rd[size_t(r)] == kIntPoison) ++t.unwritten;
      else t.exact += int64_t(rd[size_t(r)]) != src;
      for (int k = 0; k < D && c.x_copy; ++k) {
        if (nan_bits_f32(xr[k])) ++t.unwritten;
        else t.exact += !same_bits(xr[k], x[size_t(src) * D + k]);
      }
      if (esz == 2) {
        check_ln_row(t, reinterpret_cast<const __half*>(hr), &x[size_t(src) * D], D, w1, b1, eps);
      } else {
        check_ln_row(t, reinterpret_cast<const float*>(hr), &x[size_t(src) * D], D, w1, b1, eps);
      }
      if (orow) {  // valid rows of o belong to the attention: untouched
        for (size_t i = 0; i < size_t(D) * esz; ++i) t.stray += orow[i] != 0xFF;
      }
    } else {  // tail rows: zeros and -1
      t.exact += rd[size_t(r)] != -1;
      for (int k = 0; k < D && c.x_copy; ++k) t.exact += !zero_bits_f32(xr[k]);
      for (size_t i = 0; i < size_t(D) * esz; ++i) t.exact += hr[i] != 0;
      if (orow) {
        for (size_t i = 0; i < size_t(D) * esz; ++i) t.exact += orow[i] != 0;
      }
    }
  }

  // y after the pack: padded rows zero, valid rows untouched (poison, or x when aliased)
  if (y != nullptr) {
    for (int64_t r = 0; r < padded + kGuardRows; ++r) {
      const float* yr = &y_mid[size_t(r) * D];
      const bool pad_row = r < padded && !valid(r);
      for (int k = 0; k < D; ++k) {
        if (pad_row) {
          if (nan_bits_f32(yr[k])) ++t.unwritten;
          else t.exact += !zero_bits_f32(yr[k]);
        } else if (c.y == YMode::alias) {
          t.stray += !same_bits(yr[k], x[size_t(r) * D + k]);
        } else {
          t.stray += !nan_bits_f32(yr[k]);
        }
      }
    }
    // y after the final LN (it reads the packed copy: not run without one): valid packed rows
    // normalised, rows beyond Tcap (overflow) unchanged
    if (!c.x_copy) return t;
    const std::vector<float> yf = c.y == YMode::alias ? dx.down() : dy.down();
    for (int64_t r = 0; r < padded + kGuardRows; ++r) {
      const float* yr = &yf[size_t(r) * D];
      if (r >= padded || !valid(r)) {
        for (int k = 0; k < D; ++k) t.stray += !same_bits(yr[k], y_mid[size_t(r) * D + k]);
        continue;
      }
      const int64_t d = start[size_t(r / S)] + r % S;
      if (d < Tcap) {
        check_ln_row(t, yr, &x[size_t(r) * D], D, w2, b2, eps);
      } else {
        for (int k = 0; k < D; ++k) t.stray += !same_bits(yr[k], y_mid[size_t(r) * D + k]);
      }
    }
  }
  return t;
}

void print_row(int n, const char* what, const std::string& shape, const Tally& t) {
  std::printf("%-4d %-22s %-52s %-9.3f %-6ld %-6ld %-6ld %-6ld %s%s%s\n", n, what, shape.c_str(), t.worst, t.bad,
              t.unwritten, t.stray, t.exact, t.ok() ? "PASS" : "FAIL", t.error.empty() ? "" : ": ", t.error.c_str());
}

}  // namespace

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("test_packed_rows: no CUDA device, skipping\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  std::printf("%-4s %-22s %-52s %-9s %-6s %-6s %-6s %-6s %s\n", "#", "check", "shape", "err/tol", "bad", "unwr",
              "stray", "exact", "result");
  int n = 0, failures = 0;
  auto record = [&](const char* what, const std::string& shape, const Tally& t) {
    print_row(n, what, shape, t);
    failures += t.ok() ? 0 : 1;
    ++n;
  };
  const int dims[] = {64, 100, 128, 256, 1024, 1030, 9000};

  // 1. dense LayerNorms on constant / 1e4 +- 1 / -3e4 constant / normal rows (every variant)
  for (const int D : dims) {
    for (const int64_t rows : {int64_t(1), int64_t(37), int64_t(1001)}) {
      if (D == 9000 && rows > 37) continue;
      for (const DType act : {DType::f16, DType::f32}) {
        const Tally t = run_dense(D, rows, act, false, 0xA11CE000ull + uint64_t(n));
        record(act == DType::f16 ? "layer_norm f16" : "layer_norm f32",
               "D=" + std::to_string(D) + " rows=" + std::to_string(rows) + " " + hk::cuda::row_norm_variant(D), t);
      }
      const Tally t = run_dense(D, rows, DType::f32, true, 0xA11CE000ull + uint64_t(n));
      record("final_layer_norm", "D=" + std::to_string(D) + " rows=" + std::to_string(rows) + " S=5 rand " +
                                     hk::cuda::row_norm_variant(D), t);
    }
  }

  // 2. packed_offsets
  for (const int B : {0, 1, 3, 37, 10000, 2500000}) {
    for (const int S : {1, 7, 128}) {
      for (const Lens l : {Lens::null, Lens::random, Lens::edge, Lens::zeros, Lens::wild}) {
        if (B >= 10000 && S != 128 && l != Lens::random) continue;
        double us = 0;
        const bool timed = B == 10000 && S == 128 && l == Lens::random;
        Tally t = run_offsets(B, S, l, 0x0FF5E700ull + uint64_t(n), timed ? &us : nullptr);
        std::string shape = "B=" + std::to_string(B) + " S=" + std::to_string(S) + " lens=" + lens_name(l);
        if (timed) {
          char buf[64];
          std::snprintf(buf, sizeof buf, " %.1f us (limit 50)", us);
          shape += buf;
          if (!(us <= 50.0)) t.error = "too slow for a few-microsecond scan";
        }
        record("packed_offsets", shape, t);
      }
    }
  }

  // 3. packed pipeline
  std::vector<PackCase> pcs;
  for (const int D : dims) {
    for (const int B : {1, 3, 37}) {
      for (const int S : {1, 7, 128}) {
        if (int64_t(B) * S * D > int64_t(40) << 20) continue;  // keep the float64 reference quick
        for (const Lens l : {Lens::null, Lens::random, Lens::edge}) {
          PackCase c;
          c.D = D;
          c.B = B;
          c.S = S;
          c.lens = l;
          c.act = (B + S) % 2 ? DType::f16 : DType::f32;
          pcs.push_back(c);
        }
      }
    }
    // Tcap > T, Tcap > B*S, overflow, y aliasing x, y null, no o, all-zero lengths, f32/f16 swap
    PackCase c;
    c.D = D;
    c.B = D >= 1024 ? 3 : 37;
    c.S = D >= 1024 ? 7 : 128;
    c.tcap_extra = 19;
    pcs.push_back(c);
    c.tcap_beyond = true;
    c.act = DType::f32;
    pcs.push_back(c);
    c.tcap_beyond = false;
    c.tcap_extra = -5;
    pcs.push_back(c);
    c.tcap_extra = 0;
    c.y = YMode::alias;
    pcs.push_back(c);
    c.y = YMode::none;
    c.with_o = false;
    pcs.push_back(c);
    c.y = YMode::separate;
    c.with_o = true;
    c.lens = Lens::zeros;
    c.tcap_extra = 4;
    pcs.push_back(c);
    c.lens = Lens::wild;
    c.tcap_extra = 0;
    c.act = DType::f16;
    pcs.push_back(c);
  }
  for (const int D : {64, 128, 1030}) {
    PackCase c;  // no packed copy of the residual (x_packed null), with tail rows and y aliasing x
    c.D = D;
    c.B = 37;
    c.S = D > 128 ? 7 : 128;
    c.tcap_extra = 11;
    c.x_copy = false;
    pcs.push_back(c);
    c.y = YMode::alias;
    c.lens = Lens::edge;
    pcs.push_back(c);
  }
  {
    PackCase c;  // through a captured graph
    c.D = 128;
    c.B = 37;
    c.S = 128;
    c.tcap_extra = 33;
    c.y = YMode::alias;
    c.graph = true;
    pcs.push_back(c);
  }
  for (const PackCase& c : pcs) {
    int64_t T = 0, Tcap = 0;
    const Tally t = run_pack(c, 0x9AC6ED00ull + uint64_t(n), &T, &Tcap);
    const std::string shape = "D=" + std::to_string(c.D) + " B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) +
                              " " + lens_name(c.lens) + " T=" + std::to_string(T) + " Tcap=" + std::to_string(Tcap) +
                              " y=" + ymode_name(c.y) + (c.with_o ? "" : " no-o") +
                              (c.act == DType::f16 ? " f16" : " f32") + (c.graph ? " graph" : "") +
                              (c.x_copy ? "" : " no-copy");
    record(T > Tcap ? "pack (overflow)" : "pack + final_packed", shape, t);
  }

  std::printf("\n%d checks, %d failed\n", n, failures);
  return failures == 0 ? 0 : 1;
}
