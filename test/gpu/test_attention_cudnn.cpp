// GPU test of the cuDNN attention route (hk::cuda::CudnnAttention) against a float64 CPU
// reference. Standalone (own main): exit 0 all checks passed, 1 any failure, 77 cuDNN/GPU absent.
//
// Per shape (S in {1,32,128,130,256} x head_dim in {8..256} x causal, plus strided-row cases):
//   eager   run() on fresh random f16 qkv, lengths mixing 0, 1, S and random values, output
//           poisoned with NaN: valid rows within 2e-3 + 1e-2*|ref|, padded rows exactly zero,
//           columns past D and guard rows past the last token untouched (still poison);
//   graph   run() captured into a CUDA graph (global capture mode required) and replayed;
//   regraph new qkv and lengths written in place, the same graph replayed (nothing baked in);
//   rescale eager run with a different scale on the new data (the by-value scalar is rebound).
// Also: the API contract (supports() rejections, run() before prepare()). Times (prepare cold,
// run() and graph replay as cudaEvent medians of 50) are printed for information only.
#include "attention_cudnn.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using hk::cuda::AttentionParams;
using hk::cuda::CudnnAttention;
using hk::cuda::DType;

namespace {

#define CHECK_CUDA(expr)                                                                     \
  do {                                                                                       \
    cudaError_t e_ = (expr);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      throw std::runtime_error(std::string(#expr) + ": " + cudaGetErrorString(e_));          \
    }                                                                                        \
  } while (0)

constexpr int kB = 5;            // sequences per case
constexpr int kH = 3;            // heads
constexpr int kGuardRows = 2;    // rows past the last token that must stay untouched
constexpr uint16_t kPoison = 0x7E7E;  // f16 NaN, byte pattern 0x7E
constexpr int kTimingIters = 50;

float h2f(uint16_t bits) {
  __half_raw r;
  r.x = bits;
  return __half2float(__half(r));
}
uint16_t f2h(float f) {
  __half_raw r = __half(__float2half_rn(f));
  return r.x;
}

struct Shape {
  int S, hd;
  bool causal;
  int row_pad;  // extra elements per row of qkv and out (0 = dense rows)
  int B() const { return kB; }
  int H() const { return kH; }
  int D() const { return kH * hd; }
  int64_t rs() const { return 3LL * D() + row_pad; }
  int64_t os() const { return static_cast<int64_t>(D()) + row_pad; }
  int64_t tokens() const { return static_cast<int64_t>(kB) * S; }
};

// Lengths mixing the edge values 0, 1 and S with random ones.
std::vector<int32_t> make_lengths(int S, std::mt19937_64& rng, int variant) {
  std::uniform_int_distribution<int> any(1, S);
  std::vector<int32_t> len = variant == 0 ? std::vector<int32_t>{S, 0, any(rng), 1, any(rng)}
                                          : std::vector<int32_t>{any(rng), S, 1, any(rng), 0};
  return len;
}

std::vector<uint16_t> make_qkv(const Shape& sh, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> v(static_cast<size_t>(sh.tokens() * sh.rs()));
  for (auto& x : v) x = f2h(u(rng));
  return v;
}

// out[b*S+s, h*hd+c] per MODEL.md: softmax over allowed keys (j < len, and j <= s when causal),
// rows s >= len are zero.
std::vector<double> reference(const Shape& sh, const std::vector<uint16_t>& qkv,
                              const std::vector<int32_t>& len, float scale) {
  const int S = sh.S, hd = sh.hd, D = sh.D();
  const int64_t rs = sh.rs();
  std::vector<double> x(qkv.size());
  for (size_t i = 0; i < qkv.size(); ++i) x[i] = h2f(qkv[i]);
  std::vector<double> ref(static_cast<size_t>(sh.tokens()) * D, 0.0);
  std::vector<double> p(S);
  for (int b = 0; b < kB; ++b) {
    for (int h = 0; h < kH; ++h) {
      for (int i = 0; i < len[b]; ++i) {
        const double* q = &x[(static_cast<int64_t>(b) * S + i) * rs + h * hd];
        const int jmax = sh.causal ? std::min(i + 1, len[b]) : len[b];
        double m = -INFINITY;
        for (int j = 0; j < jmax; ++j) {
          const double* k = &x[(static_cast<int64_t>(b) * S + j) * rs + D + h * hd];
          double dot = 0;
          for (int c = 0; c < hd; ++c) dot += q[c] * k[c];
          p[j] = dot * static_cast<double>(scale);
          m = std::max(m, p[j]);
        }
        double sum = 0;
        for (int j = 0; j < jmax; ++j) sum += (p[j] = std::exp(p[j] - m));
        double* o = &ref[(static_cast<int64_t>(b) * S + i) * D + h * hd];
        for (int j = 0; j < jmax; ++j) {
          const double* v = &x[(static_cast<int64_t>(b) * S + j) * rs + 2 * D + h * hd];
          const double w = p[j] / sum;
          for (int c = 0; c < hd; ++c) o[c] += w * v[c];
        }
      }
    }
  }
  return ref;
}

struct Verdict {
  bool ok = true;
  double max_err = 0;      // over valid elements
  double worst_ratio = 0;  // max err / tolerance
  long bad = 0, nan = 0, pad_nonzero = 0, overwritten = 0;  // overwritten: poison outside out
  std::string first;

  std::string summary() const {
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "err %.2e (%.2f of tol) bad %ld nan %ld pad!=0 %ld overwritten %ld", max_err,
                  worst_ratio, bad, nan, pad_nonzero, overwritten);
    return std::string(buf) + (first.empty() ? "" : " first: " + first);
  }
};

Verdict verify(const Shape& sh, const std::vector<uint16_t>& out, const std::vector<double>& ref,
               const std::vector<int32_t>& len) {
  Verdict v;
  const int S = sh.S, D = sh.D();
  const int64_t os = sh.os();
  auto note = [&](const std::string& what) {
    v.ok = false;
    if (v.first.empty()) v.first = what;
  };
  for (int b = 0; b < kB; ++b) {
    for (int s = 0; s < S; ++s) {
      const int64_t t = static_cast<int64_t>(b) * S + s;
      for (int c = 0; c < os; ++c) {
        const uint16_t bits = out[t * os + c];
        auto where = [&] {
          return "b" + std::to_string(b) + " s" + std::to_string(s) + " c" + std::to_string(c) +
                 " len" + std::to_string(len[b]);
        };
        if (c >= D) {  // row padding: never written
          if (bits != kPoison) { ++v.overwritten; note("column past D written at " + where()); }
          continue;
        }
        if (s >= len[b]) {  // padded query row: exact zero (either sign)
          if ((bits & 0x7FFF) != 0) { ++v.pad_nonzero; note("padded row not zero at " + where()); }
          continue;
        }
        const double got = h2f(bits);
        const double want = ref[t * D + c];
        if (std::isnan(got)) { ++v.nan; note("NaN (unwritten?) at " + where()); continue; }
        const double err = std::fabs(got - want);
        const double tol = 2e-3 + 1e-2 * std::fabs(want);
        v.max_err = std::max(v.max_err, err);
        v.worst_ratio = std::max(v.worst_ratio, err / tol);
        if (err > tol) {
          ++v.bad;
          note(where() + " got " + std::to_string(got) + " want " + std::to_string(want));
        }
      }
    }
  }
  for (int64_t i = sh.tokens() * os; i < (sh.tokens() + kGuardRows) * os; ++i) {
    if (out[i] != kPoison) {
      ++v.overwritten;
      note("guard row past the last token written");
      break;
    }
  }
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Device buffers of one case.
struct Buffers {
  void* qkv = nullptr;
  void* out = nullptr;
  int32_t* lengths = nullptr;
  void* workspace = nullptr;
  size_t out_bytes = 0;
  ~Buffers() {
    cudaFree(qkv);
    cudaFree(out);
    cudaFree(lengths);
    cudaFree(workspace);
  }
};

struct CaseResult {
  std::string name;
  bool skipped = false, ok = true;
  std::string engine, eager, graph, regraph, rescale, capture_mode;
  double prepare_ms = 0, run_us = 0, graph_us = 0;
};

class Runner {
 public:
  Runner(CudnnAttention& att, cudaStream_t stream, int sm_major)
      : att_(att), stream_(stream), sm_major_(sm_major), rng_(0x5EEDC0DEULL) {}

  CaseResult run_case(const Shape& sh) {
    CaseResult r;
    char name[96];
    std::snprintf(name, sizeof(name), "S%-3d hd%-3d %s%s", sh.S, sh.hd,
                  sh.causal ? "causal" : "full  ", sh.row_pad ? " strided" : "");
    r.name = name;

    Buffers buf;
    CHECK_CUDA(cudaMalloc(&buf.qkv, sh.tokens() * sh.rs() * sizeof(uint16_t)));
    buf.out_bytes = (sh.tokens() + kGuardRows) * sh.os() * sizeof(uint16_t);
    CHECK_CUDA(cudaMalloc(&buf.out, buf.out_bytes));
    CHECK_CUDA(cudaMalloc(&buf.lengths, kB * sizeof(int32_t)));

    AttentionParams p;
    p.qkv = buf.qkv;
    p.out = buf.out;
    p.lengths = buf.lengths;
    p.B = kB;
    p.S = sh.S;
    p.H = kH;
    p.head_dim = sh.hd;
    p.qkv_row_stride = sh.rs();
    p.out_row_stride = sh.os();
    p.scale = 1.0f / std::sqrt(static_cast<float>(sh.hd));
    p.causal = sh.causal;
    p.dtype = DType::f16;

    const bool expect_supported = sh.hd <= (sm_major_ >= 9 ? 256 : 128);
    if (!att_.supports(p)) {
      r.skipped = true;
      r.ok = !expect_supported;
      r.eager = expect_supported ? "FAIL: supports() false for a shape this device runs"
                                 : "skip: head_dim above this architecture's limit";
      return r;
    }
    if (!expect_supported) {
      r.ok = false;
      r.eager = "FAIL: supports() true above the architecture's head_dim limit";
      return r;
    }

    // --- data A, eager ---
    auto len_a = make_lengths(sh.S, rng_, 0);
    auto qkv_a = make_qkv(sh, rng_);
    upload(buf, qkv_a, len_a);

    const auto t0 = std::chrono::steady_clock::now();
    att_.prepare(p, stream_);
    r.prepare_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const size_t ws = att_.workspace_bytes(p);
    if (ws > 0) CHECK_CUDA(cudaMalloc(&buf.workspace, ws));
    r.engine = att_.plan_info(p);

    const auto ref_a = reference(sh, qkv_a, len_a, p.scale);
    poison(buf);
    att_.run(p, buf.workspace, stream_);
    r.eager = judge(sh, buf, ref_a, len_a, r.ok);

    // --- graph capture of run(), replayed on the same data ---
    cudaGraphExec_t exec = capture(p, buf.workspace, r.capture_mode);
    if (r.capture_mode != "global") r.ok = false;  // must capture in the strictest mode
    if (exec == nullptr) {
      r.ok = false;
      r.graph = r.regraph = "FAIL: capture (" + r.capture_mode + ")";
    } else {
      poison(buf);
      CHECK_CUDA(cudaGraphLaunch(exec, stream_));
      r.graph = judge(sh, buf, ref_a, len_a, r.ok);

      // --- new qkv and lengths in place, same graph ---
      auto len_b = make_lengths(sh.S, rng_, 1);
      auto qkv_b = make_qkv(sh, rng_);
      upload(buf, qkv_b, len_b);
      const auto ref_b = reference(sh, qkv_b, len_b, p.scale);
      poison(buf);
      CHECK_CUDA(cudaGraphLaunch(exec, stream_));
      r.regraph = judge(sh, buf, ref_b, len_b, r.ok);

      r.graph_us = time_us([&] { CHECK_CUDA(cudaGraphLaunch(exec, stream_)); });
      CHECK_CUDA(cudaGraphExecDestroy(exec));

      // --- eager with another scale on data B ---
      AttentionParams p2 = p;
      p2.scale = p.scale * 0.75f;
      const auto ref_b2 = reference(sh, qkv_b, len_b, p2.scale);
      poison(buf);
      att_.run(p2, buf.workspace, stream_);
      r.rescale = judge(sh, buf, ref_b2, len_b, r.ok);
    }

    r.run_us = time_us([&] { att_.run(p, buf.workspace, stream_); });
    return r;
  }

 private:
  void upload(Buffers& buf, const std::vector<uint16_t>& qkv, const std::vector<int32_t>& len) {
    CHECK_CUDA(cudaMemcpy(buf.qkv, qkv.data(), qkv.size() * sizeof(uint16_t),
                          cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(buf.lengths, len.data(), len.size() * sizeof(int32_t),
                          cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());  // pageable copies may still be landing on return
  }

  void poison(Buffers& buf) {
    CHECK_CUDA(cudaMemset(buf.out, 0x7E, buf.out_bytes));
    CHECK_CUDA(cudaDeviceSynchronize());
  }

  std::string judge(const Shape& sh, Buffers& buf, const std::vector<double>& ref,
                    const std::vector<int32_t>& len, bool& ok) {
    CHECK_CUDA(cudaStreamSynchronize(stream_));
    CHECK_CUDA(cudaGetLastError());
    std::vector<uint16_t> out(buf.out_bytes / sizeof(uint16_t));
    CHECK_CUDA(cudaMemcpy(out.data(), buf.out, buf.out_bytes, cudaMemcpyDeviceToHost));
    const Verdict v = verify(sh, out, ref, len);
    if (!v.ok) ok = false;
    return (v.ok ? "ok   " : "FAIL ") + v.summary();
  }

  // Captures one run() in global mode (the strictest). When that fails, thread-local mode is
  // tried so the report tells the two apart and the replay checks still run; `mode_used` then
  // reads "global failed, thread-local" and the case fails. Null when neither captures.
  cudaGraphExec_t capture(const AttentionParams& p, void* workspace, std::string& mode_used) {
    mode_used.clear();
    for (auto mode : {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal}) {
      const char* name = mode == cudaStreamCaptureModeGlobal ? "global" : "thread-local";
      mode_used += name;
      CHECK_CUDA(cudaStreamBeginCapture(stream_, mode));
      std::string error;
      try {
        att_.run(p, workspace, stream_);
      } catch (const std::exception& e) {
        error = e.what();
      }
      cudaGraph_t graph = nullptr;
      const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
      cudaGetLastError();
      if (error.empty() && end == cudaSuccess && graph != nullptr) {
        cudaGraphExec_t exec = nullptr;
        const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        if (inst == cudaSuccess) return exec;
        error = std::string("instantiate: ") + cudaGetErrorString(inst);
        cudaGetLastError();
      } else if (graph != nullptr) {
        cudaGraphDestroy(graph);
      }
      if (error.empty()) error = std::string("end capture: ") + cudaGetErrorString(end);
      std::printf("  capture in %s mode failed: %s\n", name, error.c_str());
      mode_used += " failed, ";
    }
    return nullptr;
  }

  template <class F>
  double time_us(F&& launch) {
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    launch();  // warm-up
    std::vector<double> t;
    for (int i = 0; i < kTimingIters; ++i) {
      CHECK_CUDA(cudaEventRecord(a, stream_));
      launch();
      CHECK_CUDA(cudaEventRecord(b, stream_));
      CHECK_CUDA(cudaEventSynchronize(b));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms * 1000.0);
    }
    CHECK_CUDA(cudaEventDestroy(a));
    CHECK_CUDA(cudaEventDestroy(b));
    return median(t);
  }

  CudnnAttention& att_;
  cudaStream_t stream_;
  int sm_major_;
  std::mt19937_64 rng_;
};

// supports() must refuse what the route cannot do, and run() must refuse an unprepared shape.
int contract_checks(CudnnAttention& att, cudaStream_t stream) {
  int failures = 0;
  auto expect = [&](bool cond, const char* what) {
    std::printf("  %-58s %s\n", what, cond ? "ok" : "FAIL");
    if (!cond) ++failures;
  };
  void* qkv = nullptr;
  void* out = nullptr;
  int32_t* len = nullptr;
  CHECK_CUDA(cudaMalloc(&qkv, 4 * 64 * 3 * 128 * 2 + 64));
  CHECK_CUDA(cudaMalloc(&out, 4 * 64 * 128 * 2 + 64));
  CHECK_CUDA(cudaMalloc(&len, 64));
  AttentionParams p;
  p.qkv = qkv;
  p.out = out;
  p.lengths = len;
  p.B = 4;
  p.S = 64;
  p.H = 2;
  p.head_dim = 64;
  p.qkv_row_stride = 3 * 128;
  p.out_row_stride = 128;
  p.scale = 0.125f;
  expect(att.supports(p), "supports(): dense f16 hd64");
  AttentionParams q = p;
  q.dtype = DType::f32;
  expect(!att.supports(q), "supports(): rejects f32");
  q = p;
  q.seq_start = len;
  expect(!att.supports(q), "supports(): rejects the packed layout (seq_start)");
  q = p;
  q.head_dim = 12;
  q.qkv_row_stride = 3 * 24;
  q.out_row_stride = 24;
  expect(!att.supports(q), "supports(): rejects head_dim not a multiple of 8");
  q = p;
  q.qkv = static_cast<char*>(qkv) + 2;
  expect(!att.supports(q), "supports(): rejects a qkv pointer not 16-byte aligned");
  q = p;
  q.out_row_stride = 132;
  expect(!att.supports(q), "supports(): rejects an out row stride not 16-byte aligned");
  q = p;
  q.lengths = nullptr;
  expect(!att.supports(q), "supports(): rejects null lengths");
  bool threw = false;
  try {
    att.run(p, nullptr, stream);
  } catch (const std::logic_error&) {
    threw = true;
  }
  expect(threw, "run() before prepare() throws std::logic_error");
  expect(att.plan_info(p).empty(), "plan_info() empty for an unprepared shape");
  cudaFree(qkv);
  cudaFree(out);
  cudaFree(len);
  return failures;
}

}  // namespace

int main() {
  std::string why;
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  if (!CudnnAttention::runtime_ok(&why)) {
    std::printf("SKIP: cuDNN attention route unavailable: %s\n", why.c_str());
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const int v = CudnnAttention::runtime_version();
  std::printf("cuDNN runtime %d.%d.%d (headers %d.%d.%d), device %s sm_%d%d\n", v / 10000,
              (v / 100) % 100, v % 100, CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL, prop.name,
              prop.major, prop.minor);

  int failures = 0;
  try {
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CudnnAttention att;
    std::printf("name: %s\n\ncontract:\n", att.name());
    failures += contract_checks(att, stream);

    std::vector<Shape> shapes;
    for (int S : {1, 32, 128, 130, 256}) {
      for (int hd : {8, 16, 32, 64, 128, 256}) {
        for (bool causal : {false, true}) shapes.push_back({S, hd, causal, 0});
      }
    }
    // Rows wider than the data: strides honoured, the extra columns never written.
    shapes.push_back({130, 64, false, 8});
    shapes.push_back({130, 64, true, 8});
    shapes.push_back({32, 8, true, 16});

    Runner runner(att, stream, prop.major);
    std::printf("\nB=%d H=%d; tolerance 2e-3 + 1e-2*|ref|; times: prepare cold (ms; the first "
                "includes cuDNN handle creation), run() and graph replay (us, median of %d)\n\n",
                kB, kH, kTimingIters);
    int skipped = 0;
    for (const Shape& sh : shapes) {
      CaseResult r;
      try {
        r = runner.run_case(sh);
      } catch (const std::exception& e) {
        r.name = "S" + std::to_string(sh.S) + " hd" + std::to_string(sh.hd) +
                 (sh.causal ? " causal" : " full") + (sh.row_pad ? " strided" : "");
        r.ok = false;
        r.eager = std::string("FAIL exception: ") + e.what();
        cudaGetLastError();
        cudaDeviceSynchronize();
      }
      if (r.skipped && r.ok) ++skipped;
      if (!r.ok) ++failures;
      std::printf("%-26s %s  [%s]\n", r.name.c_str(), r.ok ? "PASS" : "FAIL",
                  r.engine.empty() ? "-" : r.engine.c_str());
      std::printf("    eager   %s\n", r.eager.c_str());
      if (!r.graph.empty()) {
        std::printf("    graph   %s  (capture: %s)\n", r.graph.c_str(), r.capture_mode.c_str());
        std::printf("    regraph %s\n", r.regraph.c_str());
      }
      if (!r.rescale.empty()) std::printf("    rescale %s\n", r.rescale.c_str());
      if (!r.skipped) {
        std::printf("    time    prepare %.1f ms, run %.1f us, graph %.1f us\n", r.prepare_ms,
                    r.run_us, r.graph_us);
      }
      std::fflush(stdout);
    }
    std::printf("\n%zu shapes, %d skipped by architecture, %d failures\n", shapes.size(), skipped,
                failures);
    CHECK_CUDA(cudaStreamDestroy(stream));
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%s\n", failures == 0 ? "ALL PASSED" : "FAILED");
  return failures == 0 ? 0 : 1;
}
