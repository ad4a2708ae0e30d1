// Host-side tests of the CUDA backend: what runs without a GPU. Registration and the error a
// GPU-less machine gets, the weight image (q/k/v fusion, types, alignment), the arena layout,
// the row-kernel launch table and the environment knobs. The kernels are tested by test/gpu.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "arena.hpp"
#include "cuda/backend.hpp"
#include "cuda/engine.hpp"
#include "gemm_cublaslt.cuh"
#include "packing.hpp"
#include "perm_col.hpp"
#include "hk/engine.hpp"
#include "hk/error.hpp"
#include "hk/synthetic.hpp"
#include "rownorm.cuh"
#include "weights.hpp"
#include "env_guard.hpp"

namespace {

using hk::cuda::DType;

// An independent look at the machine: is there a device the backend should accept?
bool usable_gpu_present() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) == cudaSuccess && p.major >= 8) return true;
  }
  return false;
}

hk::ModelConfig small_config() {
  hk::ModelConfig c;
  c.d_model = 8;
  c.n_heads = 2;
  c.n_layers = 2;
  c.ffn_dim = 12;
  c.causal = true;
  return c;
}

TEST(CudaBackendHost, IsRegisteredFirst) {
  const auto all = hk::backends();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front()->name(), "cuda");
  EXPECT_EQ(&hk::cuda::backend(), all.front());
}

TEST(CudaBackendHost, ReasonMatchesTheMachine) {
  const std::string why = hk::cuda::backend().unavailable_reason();
  std::printf("unavailable_reason: \"%s\"\n", why.c_str());
  if (usable_gpu_present()) {
    EXPECT_TRUE(why.empty()) << why;
  } else {
    EXPECT_FALSE(why.empty());
    EXPECT_NE(why.find("CUDA"), std::string::npos) << why;
  }
}

TEST(CudaBackendHost, MakeEngineGivesAClearErrorWithoutGpu) {
  if (usable_gpu_present()) GTEST_SKIP() << "a usable GPU is present: test/gpu covers engine creation";
  const hk::Model model = hk::synthetic_model(small_config(), 1);
  hk::EngineOptions o;
  o.backend = "cuda";
  o.max_batch = 2;
  o.seq_len = 4;
  try {
    hk::make_engine(model, o);
    FAIL() << "make_engine({backend cuda}) succeeded without a GPU";
  } catch (const hk::Error& e) {
    const std::string msg = e.what();
    std::printf("make_engine: %s\n", msg.c_str());
    EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
    EXPECT_NE(msg.find(hk::cuda::backend().unavailable_reason()), std::string::npos) << msg;
  }
  EXPECT_THROW(hk::cuda::backend().create(model, o), hk::Error);
  // "auto" must fall through to a host backend rather than fail.
  o.backend = "auto";
  std::unique_ptr<hk::Engine> e;
  EXPECT_NO_THROW(e = hk::make_engine(model, o));
  if (e) EXPECT_NE(e->backend(), "cuda");
}

float half_bits_to_float(const unsigned char* p) {
  __half h;
  std::memcpy(&h, p, sizeof(h));
  return __half2float(h);
}
float float_at(const unsigned char* p) {
  float f;
  std::memcpy(&f, p, sizeof(f));
  return f;
}

// Every element of `want` (float64) at byte offset `off` of the image, converted as the device
// type expects: fp16 by one rounding from float64, fp32 by one rounding.
void expect_tensor(const hk::cuda::WeightImage& img, size_t off, const std::vector<double>& want, DType t,
                   const char* what) {
  const size_t elem = t == DType::f16 ? 2 : 4;
  ASSERT_LE(off + want.size() * elem, img.bytes.size()) << what;
  EXPECT_EQ(off % hk::cuda::kTensorAlign, 0u) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    const unsigned char* p = img.bytes.data() + off + i * elem;
    const float got = t == DType::f16 ? half_bits_to_float(p) : float_at(p);
    const float exp = t == DType::f16 ? __half2float(__double2half(want[i])) : float(want[i]);
    ASSERT_EQ(got, exp) << what << " element " << i;
  }
}

std::vector<double> concat(std::initializer_list<const std::vector<double>*> parts) {
  std::vector<double> all;
  for (const auto* p : parts) all.insert(all.end(), p->begin(), p->end());
  return all;
}

void check_image(hk::Precision prec) {
  const hk::Model m = hk::synthetic_model(small_config(), 7, /*nontrivial_ln=*/true);
  const hk::cuda::WeightImage img = hk::cuda::build_weight_image(m, prec);
  const DType g = prec == hk::Precision::fast ? DType::f16 : DType::f32;
  EXPECT_EQ(img.gemm_type, g);
  ASSERT_EQ(img.layers.size(), m.layers.size());
  std::vector<std::pair<size_t, size_t>> spans;  // [offset, bytes) of every tensor
  auto note = [&spans](size_t off, size_t n, DType t) { spans.push_back({off, n * (t == DType::f16 ? 2 : 4)}); };
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const hk::LayerWeights& w = m.layers[l];
    const auto& o = img.layers[l];
    const auto qkv_w = concat({&w.q_w, &w.k_w, &w.v_w}), qkv_b = concat({&w.q_b, &w.k_b, &w.v_b});
    expect_tensor(img, o.ln1_w, w.norm1_w, DType::f32, "ln1_w");
    expect_tensor(img, o.ln1_b, w.norm1_b, DType::f32, "ln1_b");
    expect_tensor(img, o.w_qkv, qkv_w, g, "w_qkv (rows q | k | v)");
    expect_tensor(img, o.b_qkv, qkv_b, g, "b_qkv");
    expect_tensor(img, o.w_o, w.o_w, g, "w_o");
    expect_tensor(img, o.b_o, w.o_b, DType::f32, "b_o (fp32: residual epilogue)");
    expect_tensor(img, o.ln2_w, w.norm2_w, DType::f32, "ln2_w");
    expect_tensor(img, o.ln2_b, w.norm2_b, DType::f32, "ln2_b");
    expect_tensor(img, o.w_in, w.ffn_in_w, g, "w_in");
    expect_tensor(img, o.b_in, w.ffn_in_b, g, "b_in");
    expect_tensor(img, o.w_out, w.ffn_out_w, g, "w_out");
    expect_tensor(img, o.b_out, w.ffn_out_b, DType::f32, "b_out (fp32: residual epilogue)");
    note(o.ln1_w, w.norm1_w.size(), DType::f32);
    note(o.ln1_b, w.norm1_b.size(), DType::f32);
    note(o.w_qkv, qkv_w.size(), g);
    note(o.b_qkv, qkv_b.size(), g);
    note(o.w_o, w.o_w.size(), g);
    note(o.b_o, w.o_b.size(), DType::f32);
    note(o.ln2_w, w.norm2_w.size(), DType::f32);
    note(o.ln2_b, w.norm2_b.size(), DType::f32);
    note(o.w_in, w.ffn_in_w.size(), g);
    note(o.b_in, w.ffn_in_b.size(), g);
    note(o.w_out, w.ffn_out_w.size(), g);
    note(o.b_out, w.ffn_out_b.size(), DType::f32);
  }
  expect_tensor(img, img.final_w, m.final_norm_w, DType::f32, "final_w");
  expect_tensor(img, img.final_b, m.final_norm_b, DType::f32, "final_b");
  note(img.final_w, m.final_norm_w.size(), DType::f32);
  note(img.final_b, m.final_norm_b.size(), DType::f32);
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    EXPECT_LE(spans[i - 1].first + spans[i - 1].second, spans[i].first) << "tensors overlap";
}

// The k order of the column whole-model kernel's A operands (perm_col.hpp) against the layout its
// weight loads assume (model_persistent.cu load_b): in each 32-column group, lane t's 16-byte load
// holds the weights of logical columns 8t .. 8t + 7, element e = 4s + 2h + i being its fragment
// register h of k16 step s, whose mma column (what ldmatrix reads at the physical position) is
// 16s + 8h + 2t + i; a trailing group of 16: an 8-byte load of 4t .. 4t + 3, element 2h + i at
// physical 8h + 2t + i. Also: a bijection of [0, K) with pairs (c, c + 1) kept adjacent.
TEST(CudaColumnKernel, PermutedKOrderMatchesTheWeightLoads) {
  for (int K = 16; K <= 256; K += 16) {
    std::vector<int> seen(size_t(K), 0);
    for (int c = 0; c < K; c += 2) {
      const int p = hk::cuda::perm_col(c, K);
      ASSERT_GE(p, 0) << "K " << K << " c " << c;
      ASSERT_LT(p + 1, K) << "K " << K << " c " << c;
      ASSERT_EQ(p % 2, 0) << "K " << K << " c " << c;
      ++seen[size_t(p)];
      ++seen[size_t(p + 1)];
    }
    for (int p = 0; p < K; ++p) EXPECT_EQ(seen[size_t(p)], 1) << "K " << K << " position " << p;
    for (int group = 0; group < K; group += 32) {
      const bool full = group + 32 <= K;
      for (int t = 0; t < 4; ++t)
        for (int s = 0; s < (full ? 2 : 1); ++s)
          for (int h = 0; h < 2; ++h) {
            const int logical = full ? group + 8 * t + 4 * s + 2 * h : group + 4 * t + 2 * h;
            const int physical = full ? group + 16 * s + 8 * h + 2 * t : group + 8 * h + 2 * t;
            EXPECT_EQ(hk::cuda::perm_col(logical, K), physical)
                << "K " << K << " group " << group << " t " << t << " s " << s << " h " << h;
          }
    }
  }
}

TEST(CudaWeightImage, FastIsFp16WithFusedQkv) { check_image(hk::Precision::fast); }
TEST(CudaWeightImage, Fp32IsFp32WithFusedQkv) { check_image(hk::Precision::fp32); }
TEST(CudaWeightImage, ReferencePrecisionIsRejected) {
  const hk::Model m = hk::synthetic_model(small_config(), 7);
  EXPECT_THROW(hk::cuda::build_weight_image(m, hk::Precision::reference), hk::Error);
}

TEST(CudaArenaLayout, BuffersAreDisjointAlignedAndLargeEnough) {
  for (hk::Precision prec : {hk::Precision::fast, hk::Precision::fp32}) {
    for (auto [B, S, D, F] : {std::tuple{1, 1, 8, 8}, std::tuple{3, 7, 24, 40}, std::tuple{64, 128, 1024, 1024},
                              std::tuple{10000, 128, 128, 128}, std::tuple{2, 9, 30, 50}}) {
      hk::ModelConfig c;
      c.d_model = D;
      c.n_heads = 1;
      c.n_layers = 1;
      c.ffn_dim = F;
      const auto l = hk::cuda::activation_layout(c, B, S, prec, hk::cuda::kLtWorkspaceBytes);
      const size_t T = size_t(B) * S, a = prec == hk::Precision::fast ? 2 : 4;
      EXPECT_EQ(l.act, prec == hk::Precision::fast ? DType::f16 : DType::f32);
      std::vector<std::pair<size_t, size_t>> spans = {
          {l.x_in, T * D * 4}, {l.x, T * D * 4},          {l.h, T * D * a},         {l.qkv, T * 3 * D * a},
          {l.o, T * D * a},    {l.f, T * F * a},          {l.y[0], T * D * 4},      {l.y[1], T * D * 4},
          {l.lengths_in, size_t(B) * 4}, {l.lengths_full, size_t(B) * 4}, {l.seq_start, size_t(B + 1) * 4},
          {l.row_dst, T * 4}, {l.pack_flag, 4}, {l.workspace, l.workspace_bytes}};
      for (const auto& s : spans) {
        EXPECT_EQ(s.first % 256, 0u);
        EXPECT_LE(s.first + s.second, l.total);
      }
      std::sort(spans.begin(), spans.end());
      for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].first + spans[i - 1].second, spans[i].first);
    }
  }
}

TEST(CudaRowNormLaunch, EveryWidthIsCoveredWithinTheRegisterBudget) {
  int warp = 0, block = 0, loop = 0;
  for (int D = 1; D <= 20000; ++D) {
    const hk::cuda::RowNormLaunch l = hk::cuda::choose_row_norm_launch(D);
    if (l.threads_per_row == 0) {
      ++loop;
      EXPECT_GT(D, 8192) << "a width that fits in registers fell back to the looping kernel";
      continue;
    }
    ASSERT_TRUE(l.threads_per_row == 32 || l.threads_per_row == 256) << D;
    ASSERT_EQ(D % l.vec, 0) << "vector loads need D % vec == 0, D = " << D;
    ASSERT_LE(l.per_thread * l.vec, 32) << D;
    ASSERT_GE(int64_t(l.threads_per_row) * l.per_thread * l.vec, D) << "row not covered, D = " << D;
    (l.threads_per_row == 32 ? warp : block)++;
    if (D <= 1024) EXPECT_EQ(l.threads_per_row, 32) << "D <= 1024 should take a warp per row, D = " << D;
    if (D % 4 == 0) EXPECT_EQ(l.vec, 4) << "D % 4 == 0 should take 16-byte loads, D = " << D;
  }
  EXPECT_STREQ(hk::cuda::row_norm_variant(128), "cuda.warp");
  EXPECT_STREQ(hk::cuda::row_norm_variant(2048), "cuda.block");
  EXPECT_STREQ(hk::cuda::row_norm_variant(16384), "cuda.block_loop");
  std::printf("widths 1..20000: %d warp, %d block, %d looping\n", warp, block, loop);
}

using hk::test::EnvGuard;

TEST(CudaRoutes, EnvironmentKnobs) {
  EnvGuard g1("HK_GELU"), g2("HK_ATTENTION"), g3("HK_GRAPH"), g4("HK_CUDA_POISON");
  unsetenv("HK_GELU");
  unsetenv("HK_ATTENTION");
  unsetenv("HK_GRAPH");
  unsetenv("HK_CUDA_POISON");
  hk::cuda::Routes r = hk::cuda::routes_from_environment();
  EXPECT_FALSE(r.gelu_epilogue);  // erf until measured
  EXPECT_FALSE(r.prefer_cudnn);
  EXPECT_TRUE(r.graphs);
  EXPECT_FALSE(r.poison);
  setenv("HK_GELU", "epilogue", 1);
  setenv("HK_ATTENTION", "cudnn", 1);
  setenv("HK_GRAPH", "0", 1);
  setenv("HK_CUDA_POISON", "1", 1);
  r = hk::cuda::routes_from_environment();
  EXPECT_TRUE(r.gelu_epilogue);
  EXPECT_TRUE(r.prefer_cudnn);
  EXPECT_FALSE(r.graphs);
  EXPECT_TRUE(r.poison);
  for (const char* name : {"HK_GELU", "HK_ATTENTION", "HK_GRAPH", "HK_CUDA_POISON"}) {
    EnvGuard keep(name);
    setenv(name, "bogus", 1);
    try {
      hk::cuda::routes_from_environment();
      ADD_FAILURE() << name << "=bogus was accepted";
    } catch (const hk::Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

// The padding-free bucket rule: rows cover every valid token, come in whole granules of
// max(256, B*S/32), stay dense where packing cannot pay (small B*S, > 85% valid, pinned off).
TEST(CudaPacking, BucketRule) {
  using hk::cuda::padding_free_rows;
  // Case 6: B*S = 1,280,000, granule 40,192 rows.
  const int64_t dense6 = 10000LL * 128;
  EXPECT_EQ(padding_free_rows(10000, 128, -1, ""), dense6);        // unknown count: dense
  EXPECT_EQ(padding_free_rows(10000, 128, dense6, ""), dense6);    // nothing to skip
  EXPECT_EQ(padding_free_rows(10000, 128, 645652, "0"), dense6);   // pinned off
  const int64_t r6 = padding_free_rows(10000, 128, 645652, "");
  EXPECT_GE(r6, 645652);
  EXPECT_EQ(r6 % 40192, 0);
  EXPECT_LT(r6 - 645652, 40192);
  // > 85% valid: dense under auto, packed when pinned.
  EXPECT_EQ(padding_free_rows(10000, 128, 1200000, ""), dense6);
  EXPECT_LT(padding_free_rows(10000, 128, 1200000, "1"), dense6);
  // B*S < 4096 (case 2): dense under auto however few tokens, packed when pinned.
  EXPECT_EQ(padding_free_rows(1, 128, 10, ""), 128);
  EXPECT_EQ(padding_free_rows(1, 128, 10, "1"), 128);  // a 256-row granule is not smaller than 128
  EXPECT_EQ(padding_free_rows(16, 128, 100, "1"), 256);
  EXPECT_EQ(padding_free_rows(16, 128, 100, ""), 2048);
  // Beyond int32 rows the packed offsets would overflow: dense even when pinned.
  EXPECT_EQ(padding_free_rows(20000000, 128, 1000, "1"), 20000000LL * 128);
  // Zero valid tokens still gets one granule (the tail rows are zeroed and computed).
  EXPECT_EQ(padding_free_rows(64, 128, 0, ""), 256);
  // Every token count of a mid-size batch: covered, granular, never more than dense.
  for (int64_t t = 0; t <= 8192; t += 97) {
    const int64_t r = padding_free_rows(64, 128, t, "1");
    EXPECT_GE(r, t);
    EXPECT_LE(r, 8192);
    if (r < 8192) EXPECT_EQ(r % 256, 0) << t;
  }
}

TEST(CudaRoutes, PackAndChainKnobs) {
  EnvGuard g1("HK_PACK"), g2("HK_CHAINS"), g3("HK_ATTENTION");
  setenv("HK_PACK", "1", 1);
  setenv("HK_CHAINS", "persistent", 1);
  setenv("HK_ATTENTION", "materialized", 1);
  hk::cuda::Routes r = hk::cuda::routes_from_environment();
  EXPECT_EQ(r.pins["pack"], "1");
  EXPECT_EQ(r.pins["chains"], "persistent");
  EXPECT_EQ(r.pins["attention"], "materialized");
  setenv("HK_PACK", "auto", 1);
  unsetenv("HK_CHAINS");
  unsetenv("HK_ATTENTION");
  r = hk::cuda::routes_from_environment();
  EXPECT_EQ(r.pins.count("pack"), 0u);
  EXPECT_EQ(r.pins.count("chains"), 0u);
  setenv("HK_CHAINS", "post_attn_qkv", 1);
  EXPECT_EQ(hk::cuda::routes_from_environment().pins["chains"], "post_attn_qkv");
  setenv("HK_CHAINS", "qkv", 1);
  EXPECT_THROW(hk::cuda::routes_from_environment(), hk::Error);
  unsetenv("HK_CHAINS");
  setenv("HK_PACK", "2", 1);
  EXPECT_THROW(hk::cuda::routes_from_environment(), hk::Error);
}

}  // namespace
