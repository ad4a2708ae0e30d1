// GPU test of the materialised-score attention route (attention_materialized.cuh) against a
// float64 CPU reference, plus timings next to the flash kernel at the shapes of cases.csv.
// Standalone program: one table row per check, exits 0 when all pass, 1 on any failure, 77 when
// no CUDA device is present (ctest SKIP_RETURN_CODE).
//
// Every case: fresh random fp16 qkv (fixed seed; q scaled by q_amp for peaky softmax rows), rows
// s >= lengths[b] filled with large finite values (+-30000..60000: a masked key or a zero P entry
// that leaks shows at once), pad columns of qkv (row stride > 3D) filled with NaN (never read), the
// output (pad columns and one guard row before and after included) poisoned with NaN and the
// workspace with NaN bytes. Then
//   - every element of rows s < lengths[b] is written, finite and within 2e-3 + 1e-2 |ref| (the
//     flash test's f16 bound; the reference takes the same fp16 q, k, v and rounds nothing else),
//   - rows s >= lengths[b] are exactly zero,
//   - pad columns and guard rows keep their poison.
// Branches named in the table: softmax register forms (S <= 64, 128, 256, 512, 1024 keys) and the
// loop form (S > 1024), odd S (ld padding), head_dim 8..256 (24, 40: not powers of two), strided
// rows, lengths null / S / random / 0-1-S mix, causal, graph capture with lengths changed between
// replays, B = 0.
#include "attention_materialized.cuh"

#include "attention_flash.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using hk::cuda::AttentionParams;
using hk::cuda::DType;
using hk::cuda::MaterializedAttention;

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

constexpr uint16_t kPoisonF16 = 0x7E00u;  // quiet NaN

double value_of(uint16_t bits) {
  __half_raw r;
  r.x = bits;
  return double(__half2float(__half(r)));
}
uint16_t bits_of(double v) { return __half_raw(__double2half(v)).x; }

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) { CHECK_CUDA(cudaMalloc(&ptr, std::max<size_t>(count, 1) * sizeof(T))); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // Pageable cudaMemcpy may return before its DMA lands and the route runs on a non-blocking
  // stream: synchronise the device so no late poison write overtakes the kernel's output.
  void upload(const std::vector<T>& v) {
    CHECK_CUDA(cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  std::vector<T> download() const {
    std::vector<T> v(n);
    CHECK_CUDA(cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

enum class Lens { full, null, mixed, random };  // mixed: 0, 1, S and random values
const char* lens_name(Lens l) {
  switch (l) {
    case Lens::full: return "S";
    case Lens::null: return "null";
    case Lens::mixed: return "0/1/S/r";
    default: return "rand";
  }
}

struct Case {
  int B = 1, S = 1, H = 1, hd = 8;
  bool causal = false;
  Lens lens = Lens::mixed;
  int qkv_pad = 0, out_pad = 0;  // extra elements per row (multiples of 8)
  double q_amp = 1.0;
  std::string note;
};

struct Problem {
  Case c;
  int D = 0;
  int64_t R = 0, O = 0;  // row strides of qkv and out
  std::vector<int32_t> lengths;
  std::vector<uint16_t> qkv16;  // [B*S, R]
  std::vector<double> qkv;      // the same values (valid rows only matter)
};

void fill_lengths(Problem& p, std::mt19937_64& rng) {
  const Case& c = p.c;
  std::uniform_int_distribution<int> any_len(0, c.S);
  const int rot = int(rng() % 4);
  p.lengths.resize(size_t(c.B));
  for (int b = 0; b < c.B; ++b) {
    if (c.lens == Lens::full || c.lens == Lens::null) p.lengths[size_t(b)] = c.S;
    else if (c.lens == Lens::random) p.lengths[size_t(b)] = any_len(rng);
    else {
      const int edge[4] = {0, 1, c.S, any_len(rng)};
      p.lengths[size_t(b)] = edge[(b + rot) % 4];
    }
  }
}

Problem make_problem(const Case& c, std::mt19937_64& rng) {
  Problem p;
  p.c = c;
  p.D = c.H * c.hd;
  p.R = 3 * int64_t(p.D) + c.qkv_pad;
  p.O = p.D + c.out_pad;
  fill_lengths(p, rng);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> big(30000.0, 60000.0);
  const size_t n = size_t(c.B) * c.S * size_t(p.R);
  p.qkv16.assign(n, kPoisonF16);
  p.qkv.assign(n, std::nan(""));
  for (int b = 0; b < c.B; ++b)
    for (int s = 0; s < c.S; ++s) {
      const bool valid = s < p.lengths[size_t(b)];
      for (int col = 0; col < 3 * p.D; ++col) {
        double v = valid ? normal(rng) * (col < p.D ? c.q_amp : 1.0) : (rng() % 2 ? 1 : -1) * big(rng);
        const size_t i = (size_t(b) * c.S + s) * size_t(p.R) + col;
        p.qkv16[i] = bits_of(v);
        p.qkv[i] = value_of(p.qkv16[i]);
      }
    }
  return p;
}

// o[(b*S + s), h*hd + c] in float64 (MODEL.md) from the fp16 q, k, v; rows s >= len are 0.
std::vector<double> reference(const Problem& p) {
  const Case& c = p.c;
  std::vector<double> o(size_t(c.B) * c.S * p.D, 0.0);
  std::vector<double> sc(size_t(c.S));
  const double scale = 1.0 / std::sqrt(double(c.hd));
  for (int b = 0; b < c.B; ++b) {
    const int len = p.lengths[size_t(b)];
    const double* base = &p.qkv[size_t(b) * c.S * size_t(p.R)];
    for (int h = 0; h < c.H; ++h)
      for (int i = 0; i < len; ++i) {
        const double* q = base + size_t(i) * p.R + h * c.hd;
        const int jend = c.causal ? std::min(len, i + 1) : len;
        double mx = -INFINITY;
        for (int j = 0; j < jend; ++j) {
          const double* k = base + size_t(j) * p.R + p.D + h * c.hd;
          double dot = 0;
          for (int d = 0; d < c.hd; ++d) dot += q[d] * k[d];
          sc[size_t(j)] = dot * scale;
          mx = std::max(mx, sc[size_t(j)]);
        }
        double sum = 0;
        for (int j = 0; j < jend; ++j) sum += (sc[size_t(j)] = std::exp(sc[size_t(j)] - mx));
        double* orow = &o[(size_t(b) * c.S + i) * p.D + h * c.hd];
        for (int j = 0; j < jend; ++j) {
          const double* v = base + size_t(j) * p.R + 2 * p.D + h * c.hd;
          const double pj = sc[size_t(j)] / sum;
          for (int d = 0; d < c.hd; ++d) orow[d] += pj * v[d];
        }
      }
  }
  return o;
}

// Device side: qkv, lengths, out with one guard row before and after, the route's workspace.
struct DeviceProblem {
  DeviceBuffer<uint16_t> qkv, out;
  DeviceBuffer<int32_t> lengths;
  DeviceBuffer<unsigned char> ws;
  DeviceProblem(const Problem& p, size_t ws_bytes)
      : qkv(p.qkv16.size()), out((size_t(p.c.B) * p.c.S + 2) * size_t(p.O)), lengths(p.lengths.size()), ws(ws_bytes) {
    qkv.upload(p.qkv16);
    lengths.upload(p.lengths);
  }
  void poison() {
    out.upload(std::vector<uint16_t>(out.n, kPoisonF16));
    CHECK_CUDA(cudaMemset(ws.ptr, 0xFF, std::max<size_t>(ws.n, 1)));  // NaN as fp32 and fp16
    CHECK_CUDA(cudaDeviceSynchronize());
  }
};

// The shape of a problem (pointers null: enough for workspace()).
AttentionParams shape_of(const Problem& p) {
  AttentionParams a;
  a.seq_start = nullptr;
  a.B = p.c.B;
  a.S = p.c.S;
  a.H = p.c.H;
  a.head_dim = p.c.hd;
  a.qkv_row_stride = p.R;
  a.out_row_stride = p.O;
  a.scale = float(1.0 / std::sqrt(double(p.c.hd)));
  a.causal = p.c.causal;
  a.dtype = DType::f16;
  return a;
}

AttentionParams params_of(const Problem& p, const DeviceProblem& d) {
  AttentionParams a = shape_of(p);
  a.qkv = d.qkv.ptr;
  a.out = d.out.ptr + p.O;  // after the leading guard row
  a.lengths = p.c.lens == Lens::null ? nullptr : d.lengths.ptr;
  return a;
}

struct Outcome {
  double max_err = 0, worst_ratio = 0;
  long bad = 0, unwritten = 0, nonzero_pad = 0, clobbered = 0;
  std::string error;
  bool ok() const { return error.empty() && bad == 0 && unwritten == 0 && nonzero_pad == 0 && clobbered == 0; }
};

void check(const Problem& p, const std::vector<double>& ref, const DeviceProblem& d, Outcome& r) {
  const std::vector<uint16_t> got = d.out.download();
  const Case& c = p.c;
  const int64_t rows = int64_t(c.B) * c.S + 2;
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t col = 0; col < p.O; ++col) {
      const uint16_t bits = got[size_t(row * p.O + col)];
      const int64_t t = row - 1;  // token row
      if (row == 0 || row == rows - 1 || col >= p.D) {
        r.clobbered += bits != kPoisonF16;
        continue;
      }
      const double v = value_of(bits);
      if (!std::isfinite(v)) {
        ++r.unwritten;
        continue;
      }
      const int b = int(t / c.S), s = int(t % c.S);
      if (s >= p.lengths[size_t(b)]) {
        r.nonzero_pad += v != 0.0;
        continue;
      }
      const double want = ref[size_t(t * p.D + col)];
      const double err = std::fabs(v - want), tol = 2e-3 + 1e-2 * std::fabs(want);
      r.max_err = std::max(r.max_err, err);
      r.worst_ratio = std::max(r.worst_ratio, err / tol);
      r.bad += err > tol;
    }
}

bool sync_ok(cudaStream_t stream, std::string& error) {
  const cudaError_t s = cudaStreamSynchronize(stream);
  const cudaError_t l = cudaGetLastError();
  if (s == cudaSuccess && l == cudaSuccess) return true;
  error = cudaGetErrorString(s != cudaSuccess ? s : l);
  return false;
}

int g_checks = 0, g_failures = 0;

void report(const Case& c, const Outcome& r) {
  ++g_checks;
  g_failures += !r.ok();
  char pads[32];
  std::snprintf(pads, sizeof(pads), "+%d/+%d", c.qkv_pad, c.out_pad);
  std::printf("%4d %5d %5d %3d %4d %3d %-7s %-7s %4.1f %10.3e %7.3f %5ld %5ld %5ld %5ld  %s  %s%s\n", g_checks, c.B,
              c.S, c.H, c.hd, int(c.causal), lens_name(c.lens), pads, c.q_amp, r.max_err, r.worst_ratio, r.bad,
              r.unwritten, r.nonzero_pad, r.clobbered, r.ok() ? "PASS" : "FAIL", c.note.c_str(),
              r.error.empty() ? "" : ("  error: " + r.error).c_str());
}

// One case through the route: prepare, poison, run (eagerly or captured and replayed), compare.
// Graph cases replay a second time after new, shorter lengths were written in place (the graph
// must read them at run time; rows that turn into padding hold normal values).
void run_case(const Case& c, MaterializedAttention& route, std::mt19937_64& rng, cudaStream_t stream, bool graph) {
  Problem p = make_problem(c, rng);
  DeviceProblem dev(p, hk::cuda::attention_materialized_workspace(shape_of(p)));
  const AttentionParams a = params_of(p, dev);
  Outcome r;
  if (!hk::cuda::attention_materialized_supports(a, SIZE_MAX)) {
    r.error = "supports() = false";
    report(c, r);
    return;
  }
  std::string why;
  if (!route.prepare(a, &why)) {
    r.error = "prepare: " + why;
    report(c, r);
    return;
  }
  dev.poison();
  try {
    if (!graph) {
      route.run(a, dev.ws.ptr, stream);
      if (sync_ok(stream, r.error)) check(p, reference(p), dev, r);
    } else {
      cudaGraph_t g = nullptr;
      cudaGraphExec_t exec = nullptr;
      CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      route.run(a, dev.ws.ptr, stream);
      CHECK_CUDA(cudaStreamEndCapture(stream, &g));
      CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
      CHECK_CUDA(cudaGraphLaunch(exec, stream));
      if (sync_ok(stream, r.error)) check(p, reference(p), dev, r);
      if (r.ok()) {
        for (int32_t& l : p.lengths) l = int32_t(rng() % uint64_t(l + 1));  // same qkv, lengths <= old
        dev.lengths.upload(p.lengths);
        dev.poison();
        CHECK_CUDA(cudaGraphLaunch(exec, stream));
        if (sync_ok(stream, r.error)) check(p, reference(p), dev, r);
      }
      CHECK_CUDA(cudaGraphExecDestroy(exec));
      CHECK_CUDA(cudaGraphDestroy(g));
    }
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  report(c, r);
}

void correctness(std::mt19937_64& rng, cudaStream_t stream) {
  MaterializedAttention route;  // own cuBLASLt handle
  std::printf("\n%4s %5s %5s %3s %4s %3s %-7s %-7s %4s %10s %7s %5s %5s %5s %5s  %s\n", "id", "B", "S", "H", "hd", "cau",
              "lens", "pads", "qamp", "max_err", "err/tol", "bad", "unwr", "pad!0", "clob", "result");
  auto add = [&](int B, int S, int H, int hd, bool causal, Lens lens, const std::string& note, int qp = 0, int op = 0,
                 double amp = 1.0, bool graph = false) {
    Case c;
    c.B = B;
    c.S = S;
    c.H = H;
    c.hd = hd;
    c.causal = causal;
    c.lens = lens;
    c.qkv_pad = qp;
    c.out_pad = op;
    c.q_amp = amp;
    c.note = note;
    run_case(c, route, rng, stream, graph);
  };
  // The 13 shapes of cases.csv (B reduced; S and head_dim as in the case), both mask modes.
  struct Shape { int id, B, S, D, H; };
  const Shape cases[] = {{1, 4, 128, 128, 4},  {2, 1, 128, 128, 4},  {3, 16, 32, 128, 4},  {4, 4, 128, 64, 4},
                         {5, 3, 256, 128, 8},  {6, 5, 128, 128, 4},  {7, 3, 128, 128, 16}, {8, 2, 128, 1024, 4},
                         {9, 4, 128, 128, 1},  {10, 2, 512, 128, 4}, {11, 6, 128, 128, 16}, {12, 3, 128, 256, 8},
                         {13, 2, 1024, 128, 4}};
  for (const Shape& s : cases)
    for (int causal = 0; causal < 2; ++causal)
      add(s.B, s.S, s.H, s.D / s.H, causal, Lens::mixed, "case " + std::to_string(s.id));
  // Odd S (ld padding, softmax pairs crossing S), head_dim sweep, lengths modes.
  for (int S : {1, 7, 100})
    for (int causal = 0; causal < 2; ++causal) {
      add(5, S, 2, 32, causal, Lens::mixed, "odd S");
      add(1, S, 3, 8, causal, Lens::full, "odd S, B=1");
    }
  for (int hd : {8, 16, 24, 32, 40, 64, 128, 256})
    for (int causal = 0; causal < 2; ++causal) add(3, 64, 2, hd, causal, Lens::mixed, "head_dim sweep");
  for (Lens lens : {Lens::full, Lens::null, Lens::random})
    for (int causal = 0; causal < 2; ++causal) add(4, 77, 4, 16, causal, lens, "lengths mode");
  // Softmax forms: 64 < S <= 128 .. 1024 registers; S > 1024 the loop form (odd S too).
  add(2, 200, 2, 16, false, Lens::mixed, "softmax 4 pairs/lane");
  add(2, 500, 2, 16, true, Lens::mixed, "softmax 8 pairs/lane");
  add(1, 1100, 2, 16, false, Lens::mixed, "softmax loop form");
  add(2, 1601, 1, 32, true, Lens::mixed, "softmax loop form, odd S");
  // Strided rows (pad columns must stay untouched), peaky softmax rows.
  add(3, 100, 4, 32, true, Lens::mixed, "strided rows", 16, 8);
  add(3, 128, 4, 64, false, Lens::random, "peaky rows (q x4)", 0, 0, 4.0);
  // Graph capture, lengths changed between replays.
  add(4, 128, 4, 32, true, Lens::mixed, "graph capture + replay, new lengths", 0, 0, 1.0, true);
  add(3, 100, 2, 64, false, Lens::mixed, "graph capture + replay, new lengths", 8, 8, 1.0, true);
}

// Host-side contract of supports() / workspace() / prepare() / run().
void check_api(cudaStream_t stream) {
  alignas(16) static unsigned char dummy[256];
  AttentionParams base;
  base.qkv = dummy;
  base.out = dummy;
  base.B = 2;
  base.S = 128;
  base.H = 4;
  base.head_dim = 32;
  base.qkv_row_stride = 384;
  base.out_row_stride = 128;
  base.scale = 1.f;
  base.dtype = DType::f16;
  const size_t ws = hk::cuda::attention_materialized_workspace(base);
  struct Probe {
    const char* what;
    AttentionParams p;
    size_t max_ws;
    bool expect;
  };
  std::vector<Probe> probes;
  auto with = [&](const char* what, bool expect, auto&& edit, size_t max_ws = SIZE_MAX) {
    AttentionParams p = base;
    edit(p);
    probes.push_back({what, p, max_ws, expect});
  };
  with("f16 dense hd32", true, [](AttentionParams&) {});
  with("workspace == limit", true, [](AttentionParams&) {}, ws);
  with("workspace > limit", false, [](AttentionParams&) {}, ws - 1);
  with("f32", false, [](AttentionParams& p) { p.dtype = DType::f32; });
  with("packed (seq_start set)", false, [](AttentionParams& p) { p.seq_start = reinterpret_cast<const int32_t*>(dummy); });
  with("hd 12", false, [](AttentionParams& p) { p.head_dim = 12; p.qkv_row_stride = 144; p.out_row_stride = 48; });
  with("hd 4", false, [](AttentionParams& p) { p.head_dim = 4; p.qkv_row_stride = 48; p.out_row_stride = 16; });
  with("qkv stride < 3D", false, [](AttentionParams& p) { p.qkv_row_stride = 376; });
  with("qkv stride % 8", false, [](AttentionParams& p) { p.qkv_row_stride = 388; });
  with("out stride % 8", false, [](AttentionParams& p) { p.out_row_stride = 132; });
  with("misaligned qkv", false, [](AttentionParams& p) { p.qkv = dummy + 2; });
  with("misaligned out", false, [](AttentionParams& p) { p.out = dummy + 8; });
  with("null out", false, [](AttentionParams& p) { p.out = nullptr; });
  with("B = 0", true, [](AttentionParams& p) { p.B = 0; p.qkv = nullptr; p.out = nullptr; }, 0);
  for (const Probe& pr : probes) {
    const bool got = hk::cuda::attention_materialized_supports(pr.p, pr.max_ws);
    const bool ok = got == pr.expect;
    ++g_checks;
    g_failures += !ok;
    std::printf("%4s  supports(%s) = %s  %s\n", "api", pr.what, got ? "true" : "false", ok ? "PASS" : "FAIL");
  }
  auto verdict = [](const char* what, bool ok) {
    ++g_checks;
    g_failures += !ok;
    std::printf("%4s  %s  %s\n", "api", what, ok ? "PASS" : "FAIL");
  };
  // H*B*S*ld*4 (ld = 128) + the cuBLASLt scratch, rounded to 256 bytes.
  verdict("workspace(B2 S128 H4) = 512 KiB + cuBLASLt scratch",
          ws == size_t(4) * 2 * 128 * 128 * 4 + hk::cuda::kMaterializedLtWorkspaceBytes);
  AttentionParams odd = base;
  odd.B = 1;
  odd.H = 1;
  odd.S = 7;  // 7 rows of ld 8 floats: 224 bytes
  verdict("workspace(B1 H1 S7) rounds ld to 8, bytes to 256",
          hk::cuda::attention_materialized_workspace(odd) == 256 + hk::cuda::kMaterializedLtWorkspaceBytes);
  AttentionParams empty = base;
  empty.B = 0;
  verdict("workspace(B=0) = 0", hk::cuda::attention_materialized_workspace(empty) == 0);
  MaterializedAttention route;
  bool threw = false;
  try {
    route.run(base, nullptr, stream);
  } catch (const std::logic_error&) {
    threw = true;
  }
  verdict("run() of an unprepared shape throws std::logic_error", threw);
  bool ok = route.prepare(empty) && route.prepared(empty);
  try {
    route.run(empty, nullptr, stream);
    ok = ok && cudaStreamSynchronize(stream) == cudaSuccess && cudaGetLastError() == cudaSuccess;
  } catch (const std::exception&) {
    ok = false;
  }
  verdict("B = 0: prepare() true, run() is a no-op", ok);
  AttentionParams f32 = base;
  f32.dtype = DType::f32;
  std::string why;
  verdict("prepare(f32) = false with a reason", !route.prepare(f32, &why) && !why.empty());
}

// ---- timings ------------------------------------------------------------------------------------
template <class F>
double median_ms(F&& launch, cudaStream_t stream, int reps = 30) {
  for (int i = 0; i < 3; ++i) launch();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<cudaEvent_t> ev(2 * size_t(reps));
  for (auto& e : ev) CHECK_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(ev[2 * i], stream));
    launch();
    CHECK_CUDA(cudaEventRecord(ev[2 * i + 1], stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) CHECK_CUDA(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) CHECK_CUDA(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2];
}

// Fills n fp16 values ~ roughly N(0, 1) (sum of four uniforms, scaled) from a hash of the index:
// full-size buffers (case 6: ~1 GB of qkv) without a host generator.
__global__ void fill_normalish(__half* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ uint32_t(i >> 32) * 2246822519u ^ seed;
    float s = 0.f;
    for (int k = 0; k < 4; ++k) {
      h ^= h >> 15;
      h *= 2246822519u;
      h ^= h >> 13;
      h *= 3266489917u;
      h ^= h >> 16;
      s += float(h & 0xFFFFFF) / float(0x1000000);
    }
    x[i] = __float2half((s - 2.f) * 1.7320508f);  // variance of the sum of 4 U(0,1) is 1/3
  }
}

// One cases.csv shape at its full B: the route (eager launches: 2H GEMMs + softmax) vs the flash
// kernel, lengths ~ U{1..S}. The two outputs must agree within twice the f16 bound (both carry
// their own rounding); padded rows zero in both. Times are printed, not asserted.
void time_case(int id, int B, int S, int D, int H, bool causal, std::mt19937_64& rng, cudaStream_t stream,
               MaterializedAttention& route) {
  const int hd = D / H;
  const int64_t T = int64_t(B) * S;
  DeviceBuffer<__half> qkv(size_t(T) * 3 * D), o_mat(size_t(T) * D), o_flash(size_t(T) * D);
  DeviceBuffer<int32_t> lengths{size_t(B)};
  std::vector<int32_t> len(static_cast<size_t>(B));
  std::uniform_int_distribution<int> any_len(1, S);
  for (auto& l : len) l = any_len(rng);
  lengths.upload(len);
  fill_normalish<<<1024, 256, 0, stream>>>(qkv.ptr, int64_t(qkv.n), uint32_t(rng()));
  CHECK_CUDA(cudaGetLastError());
  AttentionParams a;
  a.qkv = qkv.ptr;
  a.out = o_mat.ptr;
  a.lengths = lengths.ptr;
  a.B = B;
  a.S = S;
  a.H = H;
  a.head_dim = hd;
  a.qkv_row_stride = 3 * int64_t(D);
  a.out_row_stride = D;
  a.scale = float(1.0 / std::sqrt(double(hd)));
  a.causal = causal;
  a.dtype = DType::f16;
  AttentionParams f = a;
  f.out = o_flash.ptr;
  const size_t ws_bytes = hk::cuda::attention_materialized_workspace(a);
  std::printf("case %2d: B=%5d S=%4d D=%4d H=%2d hd=%3d causal=%d  scores %8.1f MiB  ", id, B, S, D, H, hd, int(causal),
              double(ws_bytes - hk::cuda::kMaterializedLtWorkspaceBytes) / (1 << 20));
  double t_flash = -1;
  if (hk::cuda::attention_flash_supports(f)) t_flash = median_ms([&] { hk::cuda::attention_flash(f, stream); }, stream);
  std::string why;
  if (!hk::cuda::attention_materialized_supports(a, SIZE_MAX) || !route.prepare(a, &why)) {
    std::printf("materialized: not supported %s\n", why.c_str());
    return;
  }
  size_t free_b = 0, total_b = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  if (ws_bytes + (size_t(1) << 30) > free_b) {
    std::printf("materialized: workspace does not fit the free device memory, skipped\n");
    return;
  }
  DeviceBuffer<unsigned char> ws(ws_bytes);
  const double t_mat = median_ms([&] { route.run(a, ws.ptr, stream); }, stream);
  std::printf("materialized %8.4f ms  %-40s %8.4f ms  flash/mat %.2fx\n", t_mat,
              t_flash >= 0 ? hk::cuda::attention_flash_name(f) : "flash unsupported", t_flash,
              t_flash > 0 ? t_flash / t_mat : 0.0);
  std::printf("         %s\n", route.plan_info(a).c_str());
  CHECK_CUDA(cudaStreamSynchronize(stream));
  if (t_flash < 0) return;
  // Agreement with flash.
  std::vector<__half> m(o_mat.n), fl(o_flash.n);
  CHECK_CUDA(cudaMemcpy(m.data(), o_mat.ptr, m.size() * sizeof(__half), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(fl.data(), o_flash.ptr, fl.size() * sizeof(__half), cudaMemcpyDeviceToHost));
  long bad = 0;
  double max_diff = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    const int64_t t = int64_t(i) / D;
    const int b = int(t / S), s = int(t % S);
    const double x = __half2float(m[i]), y = __half2float(fl[i]);
    if (s >= len[size_t(b)]) {
      bad += !(x == 0.0 && y == 0.0);
      continue;
    }
    const double diff = std::fabs(x - y);
    max_diff = std::max(max_diff, diff);
    bad += !(diff <= 2 * (2e-3 + 1e-2 * std::fabs(y)));
  }
  ++g_checks;
  g_failures += bad != 0;
  std::printf("         max|materialized - flash| %.2e, %ld elements outside 2x the bound  %s\n", max_diff, bad,
              bad == 0 ? "PASS" : "FAIL");
}

}  // namespace

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("test_attention_materialized: no CUDA device, skipped\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937_64 rng(20261201);

  try {
    check_api(stream);
    correctness(rng, stream);
  } catch (const std::exception& e) {
    std::printf("correctness aborted: %s\n", e.what());
    ++g_failures;
  }
  // HK_TEST_NO_TIMING=1 (e.g. under compute-sanitizer): correctness only.
  const char* nt = std::getenv("HK_TEST_NO_TIMING");
  if (!(nt && *nt && *nt != '0')) {
    std::printf("\ntimings (cudaEvent median of 30; the route's launches are eager, not graph-replayed):\n");
    try {
      MaterializedAttention route;
      const int cases[13][6] = {{1, 64, 128, 128, 4, 1},    {2, 1, 128, 128, 4, 1},   {3, 512, 32, 128, 4, 1},
                                {4, 64, 128, 64, 4, 1},     {5, 256, 256, 128, 8, 0}, {6, 10000, 128, 128, 4, 1},
                                {7, 64, 128, 128, 16, 1},   {8, 64, 128, 1024, 4, 1}, {9, 64, 128, 128, 1, 1},
                                {10, 16, 512, 128, 4, 0},   {11, 1024, 128, 128, 16, 1}, {12, 128, 128, 256, 8, 0},
                                {13, 64, 1024, 128, 4, 1}};
      for (const auto& c : cases) time_case(c[0], c[1], c[2], c[3], c[4], c[5] != 0, rng, stream, route);
    } catch (const std::exception& e) {
      std::printf("timing failed: %s\n", e.what());
      ++g_failures;
    }
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("\n%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
