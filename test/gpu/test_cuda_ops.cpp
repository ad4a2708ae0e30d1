// GPU tests of the CUDA backend's op families against float64 references, each launcher called
// directly: the LayerNorm row kernels (every launch variant: warp, block, looping, vector and
// scalar paths), the final LayerNorm (padding zeroed, padded rows never read), the in-place erf
// GELU (vector body and scalar tail), and the cuBLASLt GEMMs (every epilogue, fp16 and fp32, odd
// shapes, in-place and 16-byte-aligned residuals, every heuristic candidate). Outputs are
// poisoned with NaN and followed by guard elements that must stay untouched.
// Exits 77 (skipped) without a GPU (gpu_test_main.cpp).
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/cublaslt_api.hpp"
#include "gelu.cuh"
#include "gemm_cublaslt.cuh"
#include "gpu_util.hpp"
#include "graph.hpp"
#include "rownorm.cuh"

namespace {

using hk::cuda::DType;
using hk::gputest::DevBuf;
using hk::gputest::half_round;

const char* dname(DType t) { return t == DType::f16 ? "f16" : "f32"; }
size_t esize(DType t) { return t == DType::f16 ? 2 : 4; }

// Reads element i of a downloaded byte image holding `t` values.
double elem(const std::vector<unsigned char>& bytes, size_t i, DType t) {
  if (t == DType::f16) {
    __half h;
    std::memcpy(&h, bytes.data() + i * 2, 2);
    return double(__half2float(h));
  }
  float f;
  std::memcpy(&f, bytes.data() + i * 4, 4);
  return double(f);
}

// ---- LayerNorm ----------------------------------------------------------------------------------

std::vector<double> ln_ref(const std::vector<float>& x, int64_t rows, int D, const std::vector<float>& w,
                           const std::vector<float>& b, double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = &x[size_t(r) * D];
    double mean = 0, var = 0;
    for (int c = 0; c < D; ++c) mean += xr[c];
    mean /= D;
    for (int c = 0; c < D; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    var /= D;
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < D; ++c) y[size_t(r) * D + c] = (xr[c] - mean) * inv * w[c] + b[c];
  }
  return y;
}

const std::vector<int> kWidths = {1, 3, 7, 8, 24, 30, 40, 127, 128, 256, 260, 1000, 1022, 1024,
                                  1028, 1030, 2048, 4100, 8190, 8192, 8196, 9000, 16388};

struct RowData {
  std::vector<float> x, w, b;
};
RowData row_data(int64_t rows, int D, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n(0.f, 2.f);
  std::uniform_real_distribution<float> u(0.5f, 1.5f), v(-0.5f, 0.5f);
  RowData d;
  d.x.resize(size_t(rows) * D);
  for (auto& e : d.x) e = 3.f + n(g);  // an offset mean: the centring must be done right
  d.w.resize(size_t(D));
  d.b.resize(size_t(D));
  for (auto& e : d.w) e = u(g);
  for (auto& e : d.b) e = v(g);
  return d;
}

TEST(CudaOps, LayerNormEveryVariant) {
  std::printf("%-12s %7s %6s %-16s %12s %s\n", "op", "D", "rows", "variant", "worst/tol", "result");
  int failures = 0;
  for (DType t : {DType::f16, DType::f32}) {
    for (int D : kWidths) {
     // rows per block of the warp-per-row launch: the default, and the tuner's alternatives
     for (int rpb : {0, 1, 2, 8}) {
      if (rpb != 0 && std::string(hk::cuda::row_norm_variant(D)) != "cuda.warp") continue;
      const int64_t rows = D > 4096 ? 5 : 67;
      const RowData d = row_data(rows, D, uint64_t(D) * 31 + int(t));
      DevBuf x(d.x.size() * 4), w(size_t(D) * 4), b(size_t(D) * 4);
      const size_t guard = size_t(D) * 2;  // two rows past the end must stay untouched
      DevBuf out((size_t(rows) * D + guard) * esize(t));
      x.upload(d.x);
      w.upload(d.w);
      b.upload(d.b);
      hk::cuda::layer_norm(x.get<float>(), out.get(), t, w.get<float>(), b.get<float>(), rows, D, 1e-5f, nullptr,
                           rpb);
      HK_TEST_CUDA(cudaDeviceSynchronize());
      const auto got = out.download<unsigned char>(out.bytes());
      const auto ref = ln_ref(d.x, rows, D, d.w, d.b, 1e-5);
      double worst = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        const double tol = t == DType::f16 ? 1e-3 * std::fabs(ref[i]) + 1e-4 : 1e-5 * (1 + std::fabs(ref[i]));
        const double e = std::fabs(elem(got, i, t) - ref[i]);
        worst = std::max(worst, std::isfinite(e) ? e / tol : INFINITY);
      }
      const bool guard_ok = hk::gputest::all_bytes_poison(got, ref.size() * esize(t));
      const bool ok = worst <= 1 && guard_ok;
      failures += !ok;
      std::printf("%-12s %7d %6lld %-16s %12.3g %s%s\n", (std::string("ln.") + dname(t)).c_str(), D, (long long)rows,
                  (std::string(hk::cuda::row_norm_variant(D)) + (rpb ? ".r" + std::to_string(rpb) : "")).c_str(),
                  worst, ok ? "ok" : "FAIL", guard_ok ? "" : " (guard written)");
     }
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(CudaOps, FinalLayerNormZerosPaddingWithoutReadingIt) {
  int failures = 0;
  for (int D : {1, 7, 24, 128, 1030, 2048, 9000}) {
    for (bool with_lengths : {true, false}) {
      const int B = 3, S = 5;
      const int64_t rows = int64_t(B) * S;
      const std::vector<int32_t> lengths = {0, 2, 5};
      RowData d = row_data(rows, D, uint64_t(D) + 7);
      // Padded rows hold NaN: the kernel must not read them (their output is zero regardless).
      if (with_lengths)
        for (int bb = 0; bb < B; ++bb)
          for (int s = lengths[size_t(bb)]; s < S; ++s)
            for (int c = 0; c < D; ++c) d.x[(size_t(bb) * S + s) * D + c] = NAN;
      DevBuf x(d.x.size() * 4), w(size_t(D) * 4), b(size_t(D) * 4), len(B * 4);
      DevBuf out((size_t(rows) * D + size_t(D)) * 4);
      x.upload(d.x);
      w.upload(d.w);
      b.upload(d.b);
      len.upload(lengths);
      hk::cuda::final_layer_norm(x.get<float>(), out.get<float>(), w.get<float>(), b.get<float>(), rows, D, 1e-5f,
                                 with_lengths ? len.get<int32_t>() : nullptr, S, nullptr);
      HK_TEST_CUDA(cudaDeviceSynchronize());
      const auto got = out.download<float>(size_t(rows) * D + size_t(D));
      const auto ref = ln_ref(d.x, rows, D, d.w, d.b, 1e-5);
      double worst = 0;
      long bad_pad = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const bool pad = with_lengths && (r % S) >= lengths[size_t(r / S)];
        for (int c = 0; c < D; ++c) {
          const size_t i = size_t(r) * D + c;
          if (pad) {
            bad_pad += got[i] != 0.f;
          } else {
            const double e = std::fabs(got[i] - ref[i]) / (1e-5 * (1 + std::fabs(ref[i])));
            worst = std::max(worst, std::isfinite(e) ? e : INFINITY);
          }
        }
      }
      bool guard_ok = true;
      for (size_t i = size_t(rows) * D; i < got.size(); ++i) guard_ok &= std::isnan(got[i]);
      const bool ok = worst <= 1 && bad_pad == 0 && guard_ok;
      failures += !ok;
      std::printf("%-12s %7d lengths %-5s %-16s %12.3g pad!=0: %ld %s\n", "final_ln", D,
                  with_lengths ? "0/2/5" : "null", hk::cuda::row_norm_variant(D), worst, bad_pad, ok ? "ok" : "FAIL");
    }
  }
  EXPECT_EQ(failures, 0);
}

// ---- GELU ------------------------------------------------------------------------------------------

double gelu_erf(double z) { return 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0))); }
double gelu_tanh(double z) {
  return 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
}

TEST(CudaOps, GeluErfInPlace) {
  int failures = 0;
  for (DType t : {DType::f16, DType::f32}) {
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(8), int64_t(9), int64_t(1000), int64_t(4099),
                      int64_t((1 << 20) + 3)}) {
      std::mt19937_64 g(uint64_t(n) * 3 + int(t));
      std::uniform_real_distribution<double> u(-6.0, 6.0);
      std::vector<double> z(static_cast<size_t>(n));
      for (auto& v : z) v = u(g);
      const double special[] = {0.0, -0.0, 10.0, -10.0, 1e-3, -1e-3, 0.5};
      for (size_t i = 0; i < std::min<size_t>(z.size(), 7); ++i) z[i] = special[i];
      const size_t guard = 16;
      DevBuf f((size_t(n) + guard) * esize(t));
      if (t == DType::f16) {
        for (auto& v : z) v = half_round(v);
        f.upload(hk::gputest::to_half(z));
      } else {
        for (auto& v : z) v = double(float(v));
        f.upload(hk::gputest::to_float(z));
      }
      hk::cuda::gelu_erf_inplace(f.get(), t, n, nullptr);
      HK_TEST_CUDA(cudaDeviceSynchronize());
      const auto got = f.download<unsigned char>(f.bytes());
      double worst = 0;
      for (size_t i = 0; i < size_t(n); ++i) {
        const double r = gelu_erf(z[i]);
        const double tol = t == DType::f16 ? 1e-3 * std::fabs(r) + 1e-6 * std::fabs(z[i]) + 1e-7
                                           : 1e-6 * (std::fabs(z[i]) + std::fabs(r)) + 1e-7;
        const double e = std::fabs(elem(got, i, t) - r) / tol;
        worst = std::max(worst, std::isfinite(e) ? e : INFINITY);
      }
      const bool guard_ok = hk::gputest::all_bytes_poison(got, size_t(n) * esize(t));
      const bool ok = worst <= 1 && guard_ok;
      failures += !ok;
      std::printf("%-12s n %9lld %12.3g %s%s\n", (std::string("gelu.") + dname(t)).c_str(), (long long)n, worst,
                  ok ? "ok" : "FAIL", guard_ok ? "" : " (guard written)");
    }
  }
  EXPECT_EQ(failures, 0);
}

// ---- GEMM ------------------------------------------------------------------------------------------

struct GemmCase {
  int64_t rows;
  int n, k;
  const char* note;
};
const std::vector<GemmCase> kGemms = {
    {1, 8, 8, "one row"},
    {7, 24, 40, "odd rows, D=24/40 widths"},
    {3, 30, 10, "ld not a multiple of 8"},
    {33, 120, 40, "odd rows"},
    {130, 384, 128, "qkv of D=128"},
    {512, 128, 512, "K > N"},
    {100, 1000, 1024, "wide"},
    {128, 3072, 1024, "qkv of D=1024"},
};

struct GemmData {
  std::vector<double> x, w, bias, res;  // exactly the values the device holds
};

GemmData gemm_data(const GemmCase& c, DType in, DType out, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> n(0, 1);
  const double bound = 1.0 / std::sqrt(double(c.k));
  std::uniform_real_distribution<double> uw(-bound, bound), ub(-0.5, 0.5);
  auto q = [](double v, DType t) { return t == DType::f16 ? half_round(v) : double(float(v)); };
  GemmData d;
  d.x.resize(size_t(c.rows) * c.k);
  d.w.resize(size_t(c.n) * c.k);
  d.bias.resize(size_t(c.n));
  d.res.resize(size_t(c.rows) * c.n);
  for (auto& v : d.x) v = q(n(g), in);
  for (auto& v : d.w) v = q(uw(g), in);
  for (auto& v : d.bias) v = q(ub(g), out);
  for (auto& v : d.res) v = q(n(g), DType::f32);
  return d;
}

void upload_as(DevBuf& buf, const std::vector<double>& v, DType t, size_t byte_offset = 0) {
  if (t == DType::f16) {
    buf.upload(hk::gputest::to_half(v), byte_offset);
  } else {
    buf.upload(hk::gputest::to_float(v), byte_offset);
  }
}

enum class ResidualMode { none, in_place, offset16 };

TEST(CudaOps, CublasLtGemmEveryEpilogueAndCandidate) {
  cublasLtHandle_t lt = nullptr;
  ASSERT_EQ(hk::cuda::lt::api().Create(&lt), CUBLAS_STATUS_SUCCESS);
  DevBuf workspace(hk::cuda::kLtWorkspaceBytes);
  std::printf("%-14s %-20s %-6s %-10s %5s %12s %s\n", "epilogue", "rows x n x k", "in", "residual", "algos",
              "worst/tol", "result");
  int failures = 0;
  struct Variant {
    hk::cuda::GemmEpilogue epi;
    DType in, out;
    ResidualMode res;
  };
  using E = hk::cuda::GemmEpilogue;
  const std::vector<Variant> variants = {
      {E::bias, DType::f16, DType::f16, ResidualMode::none},
      {E::bias, DType::f32, DType::f32, ResidualMode::none},
      {E::bias_gelu_tanh, DType::f16, DType::f16, ResidualMode::none},
      {E::bias_residual, DType::f16, DType::f32, ResidualMode::in_place},
      {E::bias_residual, DType::f16, DType::f32, ResidualMode::offset16},
      {E::bias_residual, DType::f32, DType::f32, ResidualMode::in_place},
      {E::bias_residual, DType::f32, DType::f32, ResidualMode::offset16},
  };
  double tanh_vs_erf = 0;
  int accepted_all = 0;  // neighbours accepted over every shape and variant
  for (const GemmCase& c : kGemms) {
    for (const Variant& v : variants) {
      const GemmData d = gemm_data(c, v.in, v.out, uint64_t(c.rows * 131 + c.n * 7 + c.k) + int(v.epi));
      const size_t out_elems = size_t(c.rows) * c.n, guard = 64;
      DevBuf x(d.x.size() * esize(v.in)), w(d.w.size() * esize(v.in)), bias(d.bias.size() * esize(v.out));
      DevBuf out((out_elems + guard) * esize(v.out));
      DevBuf res_buf(out_elems * 4 + 16);
      upload_as(x, d.x, v.in);
      upload_as(w, d.w, v.in);
      upload_as(bias, d.bias, v.out);
      const float* residual = nullptr;
      if (v.res == ResidualMode::offset16) {  // like a caller's x at a 16-byte (not 256) boundary
        res_buf.upload(hk::gputest::to_float(d.res), 16);
        residual = reinterpret_cast<const float*>(res_buf.get<char>() + 16);
      } else if (v.res == ResidualMode::in_place) {
        residual = out.get<float>();
      }
      hk::cuda::GemmShape shape{c.rows, c.n, c.k, v.in, v.out, v.epi};
      hk::cuda::LtGemm gemm(lt, shape, bias.get());
      if (!gemm.available()) {
        // Every variant the engine relies on must exist; the tanh epilogue may be missing.
        const bool optional = v.epi == E::bias_gelu_tanh;
        failures += !optional;
        std::printf("%-14s %6lld x %5d x %5d %-6s: no cuBLASLt algorithm%s\n", to_string(v.epi), (long long)c.rows,
                    c.n, c.k, dname(v.in), optional ? " (optional route)" : " FAIL");
        continue;
      }
      const int binding = gemm.bind_bias(bias.get());
      // Reference in float64 from the stored values; the tolerance bounds fp32 accumulation of
      // k exact products (fp16 x fp16 is exact in fp32) plus the final rounding.
      std::vector<double> ref(out_elems), tol(out_elems);
      for (int64_t r = 0; r < c.rows; ++r)
        for (int o = 0; o < c.n; ++o) {
          double acc = 0, mag = 0;
          for (int i = 0; i < c.k; ++i) {
            const double p = d.x[size_t(r) * c.k + i] * d.w[size_t(o) * c.k + i];
            acc += p;
            mag += std::fabs(p);
          }
          double z = acc + d.bias[size_t(o)];
          mag += std::fabs(d.bias[size_t(o)]);
          if (v.epi == E::bias_residual) {
            z += d.res[size_t(r) * c.n + o];
            mag += std::fabs(d.res[size_t(r) * c.n + o]);
          }
          const double acc_tol = (c.k + 3) * std::ldexp(1.0, -24) * mag + 1e-30;
          const size_t i = size_t(r) * c.n + o;
          if (v.epi == E::bias_gelu_tanh) {
            ref[i] = gelu_tanh(z);
            tanh_vs_erf = std::max(tanh_vs_erf, std::fabs(gelu_tanh(z) - gelu_erf(z)));
            tol[i] = 1.2 * acc_tol + 1e-3 * std::fabs(ref[i]) + 2e-4;  // the epilogue's own tanh
          } else {
            ref[i] = z;
            tol[i] = acc_tol + (v.out == DType::f16 ? std::ldexp(std::fabs(z), -11) + 1e-7 : 0.0);
          }
        }
      // Besides the heuristic's candidates, configurations around its first (the tuner's
      // HK_GEMM_NEIGHBOURS candidates): those cublasLtMatmulAlgoCheck accepts, up to 24 of them
      // spread over the list, must compute the same product within the same bound.
      const int base = int(gemm.candidates().size());
      EXPECT_EQ(gemm.base_count(), base);
      const std::vector<cublasLtMatmulAlgo_t> around = gemm.neighbours(0, true, true);
      const std::vector<int> extra = gemm.set_extra(around);
      std::vector<int> tested;
      for (int i = 0; i < base; ++i) tested.push_back(i);
      const int accepted = int(gemm.candidates().size()) - base;
      accepted_all += accepted;
      int expect_next = base;
      for (int idx : extra) {
        if (idx < 0) continue;
        EXPECT_EQ(idx, expect_next);  // accepted ones are appended in order
        ++expect_next;
      }
      EXPECT_EQ(expect_next, int(gemm.candidates().size()));
      const int stride = std::max(1, (accepted + 23) / 24);
      for (int i = 0; i < accepted; i += stride) tested.push_back(base + i);
      double worst_all = 0;
      bool guard_ok = true;
      for (int cand : tested) {
        gemm.select(cand);
        out.poison();
        if (v.res == ResidualMode::in_place) out.upload(hk::gputest::to_float(d.res));
        gemm.run(binding, w.get(), x.get(), residual, out.get(), workspace.get(), nullptr);
        HK_TEST_CUDA(cudaDeviceSynchronize());
        const auto got = out.download<unsigned char>(out.bytes());
        double worst = 0;
        for (size_t i = 0; i < out_elems; ++i) {
          const double e = std::fabs(elem(got, i, v.out) - ref[i]) / tol[i];
          worst = std::max(worst, std::isfinite(e) ? e : INFINITY);
        }
        guard_ok &= hk::gputest::all_bytes_poison(got, out_elems * esize(v.out));
        if (worst > 1) std::printf("    candidate %d (%s): worst/tol %.3g\n", cand, gemm.describe(cand).c_str(), worst);
        worst_all = std::max(worst_all, worst);
      }
      gemm.set_extra({});  // back to the heuristic's candidates, the selection with them
      EXPECT_EQ(int(gemm.candidates().size()), base);
      EXPECT_LT(gemm.selected(), base);
      const bool ok = worst_all <= 1 && guard_ok;
      failures += !ok;
      const char* res_name = v.res == ResidualMode::none ? "-" : v.res == ResidualMode::in_place ? "in place" : "+16 B";
      std::printf("%-14s %6lld x %5d x %5d %-6s %-10s %5d %12.3g %s%s  [%s; %d of %zu neighbours accepted, %zu run]\n",
                  to_string(v.epi), (long long)c.rows, c.n, c.k, dname(v.in), res_name, base, worst_all,
                  ok ? "ok" : "FAIL", guard_ok ? "" : " (guard written)", c.note, accepted, around.size(),
                  tested.size() - size_t(base));
    }
  }
  std::printf("max |GELU_tanh - GELU_erf| over the tested pre-activations: %.3g\n", tanh_vs_erf);
  EXPECT_GT(accepted_all, 0) << "no configuration around the heuristic's was accepted for any shape";
  hk::cuda::lt::api().Destroy(lt);
  EXPECT_EQ(failures, 0);
}

// ---- memset nodes of a graph as kernel nodes (graph.hpp) ---------------------------------------

int count_nodes(cudaGraph_t g, cudaGraphNodeType type) {
  size_t n = 0;
  HK_TEST_CUDA(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) HK_TEST_CUDA(cudaGraphGetNodes(g, nodes.data(), &n));
  int c = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t{};
    HK_TEST_CUDA(cudaGraphNodeGetType(node, &t));
    c += t == type;
  }
  return c;
}

cudaGraphNode_t add_memset(cudaGraph_t g, std::vector<cudaGraphNode_t> deps, void* dst, unsigned value,
                           unsigned elem, size_t width, size_t height, size_t pitch) {
  cudaMemsetParams m{};
  m.dst = dst;
  m.value = value;
  m.elementSize = elem;
  m.width = width;
  m.height = height;
  m.pitch = pitch;
  cudaGraphNode_t node = nullptr;
  HK_TEST_CUDA(cudaGraphAddMemsetNode(&node, g, deps.data(), deps.size(), &m));
  return node;
}

// A hand-built graph: 4-byte, 2-byte (2D, pitched) and 1-byte memsets, one feeding a copy that must
// see its writes; rewritten, no memset node is left, and the bytes written (replayed three times,
// the buffers poisoned in between) are exactly those of the memsets, nothing outside them.
TEST(CudaOps, GraphMemsetNodesRunAsKernels) {
  constexpr size_t kBytes = 4096;
  DevBuf a(kBytes), b(kBytes);
  unsigned char* pa = a.get<unsigned char>();
  std::vector<unsigned char> want_a(kBytes, hk::gputest::kPoisonByte), want_b(kBytes, hk::gputest::kPoisonByte);
  auto put = [&](size_t off, unsigned value, unsigned elem, size_t width, size_t height, size_t pitch) {
    for (size_t r = 0; r < height; ++r)
      for (size_t c = 0; c < width; ++c)
        std::memcpy(&want_a[off + r * pitch + c * elem], &value, elem);  // little endian: the low bytes
  };
  cudaGraph_t g = nullptr;
  HK_TEST_CUDA(cudaGraphCreate(&g, 0));
  const cudaGraphNode_t m4 = add_memset(g, {}, pa + 4, 0xDEADBEEFu, 4, 5, 1, 0);
  put(4, 0xDEADBEEFu, 4, 5, 1, 0);
  const cudaGraphNode_t m2 = add_memset(g, {m4}, pa + 64, 0x1234u, 2, 7, 3, 96);
  put(64, 0x1234u, 2, 7, 3, 96);
  add_memset(g, {}, pa + 1024, 0x5Au, 1, 1000, 1, 0);  // several blocks of the kernel
  put(1024, 0x5Au, 1, 1000, 1, 0);
  add_memset(g, {}, pa + 2400, 0u, 4, 77, 4, 308);  // 2D, 4-byte, zeros
  put(2400, 0u, 4, 77, 4, 308);
  cudaMemcpy3DParms cp{};
  cp.srcPtr = make_cudaPitchedPtr(pa, 512, 512, 1);
  cp.dstPtr = make_cudaPitchedPtr(b.get(), 512, 512, 1);
  cp.extent = make_cudaExtent(512, 1, 1);
  cp.kind = cudaMemcpyDeviceToDevice;
  cudaGraphNode_t copy = nullptr;
  HK_TEST_CUDA(cudaGraphAddMemcpyNode(&copy, g, &m2, 1, &cp));
  std::memcpy(want_b.data(), want_a.data(), 512);

  ASSERT_EQ(count_nodes(g, cudaGraphNodeTypeMemset), 4);
  EXPECT_EQ(hk::cuda::memset_nodes_as_kernels(g), 4);
  EXPECT_EQ(count_nodes(g, cudaGraphNodeTypeMemset), 0);
  EXPECT_EQ(count_nodes(g, cudaGraphNodeTypeKernel), 4);
  EXPECT_EQ(count_nodes(g, cudaGraphNodeTypeMemcpy), 1);
  size_t deps = 0;
  HK_TEST_CUDA(cudaGraphNodeGetDependencies(copy, nullptr, nullptr, &deps));
  EXPECT_EQ(deps, 1u) << "the copy lost its dependency on the rewritten memset";
  EXPECT_EQ(hk::cuda::memset_nodes_as_kernels(g), 0);  // nothing left to rewrite
  cudaGraphExec_t exec = nullptr;
  HK_TEST_CUDA(cudaGraphInstantiate(&exec, g, 0));
  for (int rep = 0; rep < 3; ++rep) {
    a.poison();
    b.poison();
    HK_TEST_CUDA(cudaGraphLaunch(exec, nullptr));
    HK_TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(a.download<unsigned char>(kBytes), want_a) << "replay " << rep;
    EXPECT_EQ(b.download<unsigned char>(kBytes), want_b) << "replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
}

// cuBLASLt GEMMs captured into graphs: for every heuristic candidate of shapes of the case plans whose
// capture holds memset nodes, the rewritten graph gives the eager launch's bits, replay after replay.
TEST(CudaOps, CublasLtGraphsWithMemsetNodesAsKernels) {
  cublasLtHandle_t lt = nullptr;
  ASSERT_EQ(hk::cuda::lt::api().Create(&lt), CUBLAS_STATUS_SUCCESS);
  DevBuf workspace(hk::cuda::kLtWorkspaceBytes);
  cudaStream_t s = nullptr;
  HK_TEST_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  using E = hk::cuda::GemmEpilogue;
  struct Shape {
    GemmCase c;
    E epi;
    DType out;
  };
  const std::vector<Shape> shapes = {
      {{16384, 768, 256, "case 12 qkv, full length"}, E::bias, DType::f16},
      {{16384, 256, 256, "case 12 out_proj, full length"}, E::bias_residual, DType::f32},
      {{8192, 3072, 1024, "case 8 qkv, full length"}, E::bias, DType::f16},
      {{8192, 1024, 1024, "case 8 ffn_out, full length"}, E::bias_residual, DType::f32},
      {{65536, 384, 128, "case 13 qkv, full length"}, E::bias, DType::f16},
  };
  int with_memsets = 0, failures = 0;
  for (const Shape& sh : shapes) {
    const GemmCase& c = sh.c;
    const GemmData d = gemm_data(c, DType::f16, sh.out, uint64_t(c.rows + c.n + c.k));
    const size_t out_bytes = size_t(c.rows) * c.n * esize(sh.out);
    DevBuf x(d.x.size() * 2), w(d.w.size() * 2), bias(d.bias.size() * esize(sh.out)), out(out_bytes);
    DevBuf res(size_t(c.rows) * c.n * 4);
    upload_as(x, d.x, DType::f16);
    upload_as(w, d.w, DType::f16);
    upload_as(bias, d.bias, sh.out);
    res.upload(hk::gputest::to_float(d.res));
    const float* residual = sh.epi == E::bias_residual ? res.get<float>() : nullptr;
    hk::cuda::LtGemm gemm(lt, {c.rows, c.n, c.k, DType::f16, sh.out, sh.epi}, bias.get());
    ASSERT_TRUE(gemm.available()) << c.note;
    const int binding = gemm.bind_bias(bias.get());
    for (int cand = 0; cand < int(gemm.candidates().size()); ++cand) {
      gemm.select(cand);
      out.poison();
      gemm.run(binding, w.get(), x.get(), residual, out.get(), workspace.get(), s);
      HK_TEST_CUDA(cudaStreamSynchronize(s));
      const auto want = out.download<unsigned char>(out_bytes);
      cudaGraph_t g = nullptr;
      HK_TEST_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      gemm.run(binding, w.get(), x.get(), residual, out.get(), workspace.get(), s);
      HK_TEST_CUDA(cudaStreamEndCapture(s, &g));
      const int memsets = count_nodes(g, cudaGraphNodeTypeMemset);
      const int replaced = hk::cuda::memset_nodes_as_kernels(g);
      bool same = replaced == memsets && count_nodes(g, cudaGraphNodeTypeMemset) == 0;
      if (memsets > 0) {
        ++with_memsets;
        cudaGraphExec_t exec = nullptr;
        HK_TEST_CUDA(cudaGraphInstantiate(&exec, g, 0));
        for (int rep = 0; rep < 3; ++rep) {
          out.poison();
          HK_TEST_CUDA(cudaGraphLaunch(exec, s));
          HK_TEST_CUDA(cudaStreamSynchronize(s));
          same &= out.download<unsigned char>(out_bytes) == want;
        }
        cudaGraphExecDestroy(exec);
      }
      cudaGraphDestroy(g);
      failures += !same;
      std::printf("%-32s candidate %d (%s): %d memset node(s), %d rewritten: %s\n", c.note, cand,
                  gemm.describe(cand).c_str(), memsets, replaced, same ? "ok" : "FAIL");
    }
  }
  std::printf("candidates whose graph held a memset node: %d\n", with_memsets);
  HK_TEST_CUDA(cudaStreamDestroy(s));
  hk::cuda::lt::api().Destroy(lt);
  EXPECT_EQ(failures, 0);
}

}  // namespace
