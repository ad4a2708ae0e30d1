// The persistent whole-model kernel (entry points and limits: model_persistent.cuh).
//
// CTA = 8 warps; a pass holds up to 8 row tiles of 16: one sequence (S > 64) or several whole
// short sequences packed (S = 32: 4; S <= 16: 8). Warp w owns tile w of the pass for every layer:
// its fp32 residual (16 x D) is the mma accumulator acc[D/8][4] (thread g = lane/4, t = lane%4
// holds rows g, g+8, columns 8j + 2t, 8j + 2t + 1), so LayerNorms reduce over a quad with
// shuffles. Shared memory (per pass, rows = 16 * tiles):
//   sH [rows][D+8]   h (LN1 / LN2 output, fp16), the A operand of q/k/v and ffn_in
//   sQ [rows][LDQ]   q, overwritten per head by o (same rows, same columns), then f = GELU(..)
//   sK, sV [rows][D+8]   keys and values of every tile (read by every warp of the sequence)
//   two weight stages: [3 vectors of 512 B][panel N x (K+8) fp16]
// A layer is 6 stages, each one weight panel ([out, in] rows, K contiguous = the mma B operand):
//   0 Wq + bq, 1 Wk + bk, 2 Wv + bv: projections of the warp's own h rows into sQ / sK / sV
//   3 Wo + bo, ln2: attention of the warp's 16 queries (all heads), then x += o Wo^T + bo, h = LN2
//   4 Wi + bi:      f = fp16(GELU(fp16(h Wi^T + bi))) into sQ
//   5 Wf + bf, next ln1 (or final_norm): x += f Wf^T + bf; h = LN1 of the next layer, or y
// Step j waits for stage j, a CTA barrier frees the other buffer (every warp finished step j-1)
// and makes stage j and the k / v rows written in steps 1-2 visible, then stage j+1 (wrapping to
// layer 0 of the next pass) is issued and overlaps step j's compute. Everything else a warp reads
// it wrote itself (its own rows), so those hand-offs need only __syncwarp.
// Padding-free: a tile with no valid token (16 * tile >= len) skips every step and writes zero rows
// of y; in working tiles rows >= len are loaded as zeros (they stay finite; keys >= len are
// masked, and y rows >= len are written as zeros).
//
// Numerics follow the unfused route: fp16 GEMM operands with fp32 accumulation; h, q, k, v, P, o
// and the ffn_in pre-activation rounded to fp16; erf GELU in fp32 rounded to fp16; fp32 residual;
// LayerNorm statistics in fp32 (the tile kernel: sum and sum of squares of the row shifted by its
// first element, in one pass; the column kernel: the mean, then the centred sum of squares), rsqrtf.
#include "model_persistent.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common.cuh"
#include "launch.hpp"
#include "ptx.cuh"
#include "quad_stats.cuh"
#include "tile_attention.cuh"

namespace hk::cuda {
namespace {

using namespace ptx;

constexpr int kWarps = 8;               // one 16-row tile each: 128 rows = the largest S
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxTiles = kWarps;
constexpr int kMaxS = 16 * kMaxTiles;
constexpr int kMaxF = 128;              // Wi / Wf panels of one weight stage; f rows in sQ
constexpr int kFC = 64;                 // ffn_in columns per chunk: 32 accumulator registers
constexpr int kStepsPerLayer = 6;
constexpr int kVecSlot = 512;           // bytes: 128 fp32 (or 128 fp16) per stage vector
constexpr int kVecBytes = 3 * kVecSlot;
// Attention: tile_attention.cuh (64 keys per softmax block, 32 at head_dim 128: 64 spilled next
// to the residual; q reloaded per key tile at head_dim 128: holding it spilled on sm_80).
constexpr float kLog2e = 1.4426950408889634f;

// One CTA per SM: 8 warps x 255 registers. D = 128 needs them (residual 64 + projection
// accumulator 64 + B fragments; attention at head_dim 128: residual 64 + O 64 + q 32 + scores);
// D = 64 spilled at the 128 registers of two CTAs per SM (the attention with the residual live).
constexpr int kMinBlocks = 1;

struct Args {
  const PersistentLayer* layers;
  const float* final_w;
  const float* final_b;
  const float* x;
  float* y;
  const int32_t* lengths;
  int B, S, F, L;
  int st;       // 16-row tiles per sequence
  int pack;     // sequences per pass
  int npasses;  // ceil(B / pack)
  int cl;       // column kernel: CTAs per sequence (cluster size)
  float eps, scale_log2;
  bool causal;
  unsigned long long* trace;  // column kernel: phase stamps of the first sequence (null: none)
};

__host__ __device__ constexpr uint32_t round_up(uint32_t v, uint32_t m) { return (v + m - 1) / m * m; }
__host__ __device__ constexpr uint32_t umax(uint32_t a, uint32_t b) { return a > b ? a : b; }

// Shared-memory carve-up in bytes (host and device agree on it). Every region starts on a
// 16-byte boundary: rows of D + 8 halves are 2D + 16 bytes, D a multiple of 16.
struct Layout {
  uint32_t h, k, v, q, ln0, stage, stage_bytes, total;
  int ldq;  // halves per sQ row: f has F columns
};
__host__ __device__ inline Layout layout(int D, int F, int rows) {
  Layout l;
  const uint32_t ldd = uint32_t(D + 8);
  l.ldq = (D > F ? D : F) + 8;
  const uint32_t act = 2u * uint32_t(rows) * ldd;
  l.h = 0;
  l.k = act;
  l.v = 2 * act;
  l.q = 3 * act;
  l.ln0 = l.q + 2u * uint32_t(rows) * uint32_t(l.ldq);
  l.stage = round_up(l.ln0 + 8u * uint32_t(D), 128);
  const uint32_t panel = umax(umax(uint32_t(D) * ldd, uint32_t(F) * ldd), uint32_t(D) * uint32_t(F + 8));
  l.stage_bytes = round_up(uint32_t(kVecBytes) + 2u * panel, 128);
  l.total = l.stage + 2 * l.stage_bytes;
  return l;
}

// ---- copies ----------------------------------------------------------------------------------
// `bytes` (a multiple of 16) from global memory to shared memory, spread over the CTA.
__device__ __forceinline__ void copy_bytes(uint32_t dst, const void* src, int bytes, int tid) {
  const char* s = static_cast<const char*>(src);
  for (int i = tid * 16; i < bytes; i += kThreads * 16) cp_async_16(dst + uint32_t(i), s + i, 16);
}
// Rows [0, N) of a row-major fp16 [N, K] matrix into shared rows of K + 8 halves (+16 bytes puts
// ldmatrix's 8 rows in 8 distinct bank groups for every K that is a multiple of 16).
__device__ __forceinline__ void copy_panel(uint32_t dst, const __half* src, int N, int K, int tid) {
  const int kc = K >> 3;
  for (int i = tid; i < N * kc; i += kThreads) {
    const int r = i / kc, c = i - r * kc;
    cp_async_16(dst + uint32_t(r * (K + 8) + c * 8) * 2u, src + r * K + c * 8, 16);
  }
}

// Stage q (0 .. 6L-1) of a pass into `buf`: vectors first, then the panel.
template <int D>
__device__ void load_stage(const Args& a, uint32_t buf, int q, int tid) {
  const int l = q / kStepsPerLayer, part = q - l * kStepsPerLayer;
  const PersistentLayer& w = a.layers[l];
  const uint32_t panel = buf + kVecBytes;
  const int F = a.F;
  if (part < 3) {
    copy_bytes(buf, w.b_qkv + part * D, D * 2, tid);
    copy_panel(panel, w.w_qkv + part * D * D, D, D, tid);
  } else if (part == 3) {
    copy_bytes(buf, w.b_o, D * 4, tid);
    copy_bytes(buf + kVecSlot, w.ln2_w, D * 4, tid);
    copy_bytes(buf + 2 * kVecSlot, w.ln2_b, D * 4, tid);
    copy_panel(panel, w.w_o, D, D, tid);
  } else if (part == 4) {
    copy_bytes(buf, w.b_in, F * 2, tid);
    copy_panel(panel, w.w_in, F, D, tid);
  } else {
    const bool last = l + 1 == a.L;
    copy_bytes(buf, w.b_out, D * 4, tid);
    copy_bytes(buf + kVecSlot, last ? a.final_w : a.layers[l + 1].ln1_w, D * 4, tid);
    copy_bytes(buf + 2 * kVecSlot, last ? a.final_b : a.layers[l + 1].ln1_b, D * 4, tid);
    copy_panel(panel, w.w_out, D, F, tid);
  }
}

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// ---- warp GEMM ------------------------------------------------------------------------------------
// acc[NT][4] += A (16 x 16 ksteps; a_addr = the lane's ldmatrix address at k = 0) *
//               B (panel rows = n, K contiguous; b_addr = the lane's address of n-tile pair 0,
//                  pair_bytes between pairs); n-tile pairs >= npairs are skipped (warp-uniform).
template <int NT>
__device__ __forceinline__ void warp_gemm(float (&acc)[NT][4], uint32_t a_addr, uint32_t b_addr, uint32_t pair_bytes,
                                          int ksteps, int npairs) {
  // k steps not unrolled: one step (NT/2 ldmatrix, NT mma) is enough to schedule, and unrolled
  // steps let ptxas hoist B fragments next to the residual.
#pragma unroll 1
  for (int ks = 0; ks < ksteps; ++ks) {
    uint32_t af[4];
    ldsm_x4(af, a_addr + uint32_t(ks) * 32u);
#pragma unroll
    for (int pp = 0; pp < NT / 2; ++pp) {
      if (pp < npairs) {
        uint32_t b[4];
        ldsm_x4(b, b_addr + uint32_t(pp) * pair_bytes + uint32_t(ks) * 32u);
        mma_16816(acc[2 * pp], af, b[0], b[1]);
        mma_16816(acc[2 * pp + 1], af, b[2], b[3]);
      }
    }
  }
}

template <int NT>
__device__ __forceinline__ void zero(float (&c)[NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
}

// fp16(c + bias) of the first `ntiles` n-tiles into shared rows g (dst) and g + 8 (dst + row8).
template <int NT>
__device__ __forceinline__ void store_bias_f16(const float (&c)[NT][4], const __half* bias, uint32_t dst,
                                               uint32_t row8, int t) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(bias + 8 * j + 2 * t));
    st_shared_u32(dst + uint32_t(j) * 16u, pack_half2(c[j][0] + b.x, c[j][1] + b.y));
    st_shared_u32(dst + row8 + uint32_t(j) * 16u, pack_half2(c[j][2] + b.x, c[j][3] + b.y));
  }
}

// The split route's ffn_in: the GEMM writes fp16(acc + bias), the GELU pass reads that value and
// writes fp16(GELU).
__device__ __forceinline__ float gelu_of_f16(float z) {
  const float r = __half2float(__float2half_rn(z));
  return 0.5f * r * (1.f + erff(r * 0.70710678118654752f));
}

// ---- LayerNorm over the quad ------------------------------------------------------------------
// One-pass statistics of the thread's rows g, g + 8 and the normalised value (quad_stats.cuh).
using quad::RowStats;
using quad::ln_value;

// h = fp16(LN(acc) * w + b) into shared rows g (dst) and g + 8 (dst + row8); w, b: [D] fp32.
template <int NT>
__device__ __forceinline__ void ln_store_f16(const float (&acc)[NT][4], float eps, const float* w, const float* b,
                                             uint32_t dst, uint32_t row8, int t) {
  const RowStats st = quad::row_stats<NT>(acc, eps);
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const float2 wv = *reinterpret_cast<const float2*>(w + 8 * j + 2 * t);
    const float2 bv = *reinterpret_cast<const float2*>(b + 8 * j + 2 * t);
    st_shared_u32(dst + uint32_t(j) * 16u,
                  pack_half2(ln_value(acc[j][0], st, 0, wv.x, bv.x), ln_value(acc[j][1], st, 0, wv.y, bv.y)));
    st_shared_u32(dst + row8 + uint32_t(j) * 16u,
                  pack_half2(ln_value(acc[j][2], st, 1, wv.x, bv.x), ln_value(acc[j][3], st, 1, wv.y, bv.y)));
  }
}

__device__ __forceinline__ int seq_len(const Args& a, int b) {
  const int len = a.lengths ? a.lengths[b] : a.S;
  return len < 0 ? 0 : (len > a.S ? a.S : len);
}

// ---- the kernel -------------------------------------------------------------------------------------
template <int D, int HD>
__global__ void __launch_bounds__(kThreads, kMinBlocks) model_persistent_kernel(const Args a) {
  constexpr int NT = D / 8;              // n8 tiles across a D-wide row
  constexpr int LDD = D + 8;             // halves per row of sH, sK, sV and of [*, D] panels
  constexpr int H = D / HD;
  static_assert(D % 16 == 0 && D <= 128, "the residual row block lives in registers");
  static_assert(HD == 8 || (HD % 16 == 0 && HD <= D), "head_dim 8 or a multiple of 16");
  constexpr bool kHoldQ = HD < 128;

  extern __shared__ __align__(128) unsigned char smem[];
  const int F = a.F;
  const int rows = a.pack * a.st * 16;
  const Layout Lo = layout(D, F, rows);
  const int LDQ = Lo.ldq;
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;

  const uint32_t s0 = smem_u32(smem);
  const uint32_t sH = s0 + Lo.h, sK = s0 + Lo.k, sV = s0 + Lo.v, sQ = s0 + Lo.q, sStage = s0 + Lo.stage;
  float* ln0 = reinterpret_cast<float*>(smem + Lo.ln0);  // layer 0's ln1 weight | bias

  // ldmatrix lane addresses. A (16 x 16 at k = 0): lanes 0-15 rows 0-15 at k 0, lanes 16-31 at k 8.
  // B (two n8 tiles x k16 of a [n][k] panel): matrices (n 0-7, k 0-7), (n 0-7, k 8-15),
  // (n 8-15, k 0-7), (n 8-15, k 8-15).
  const int row_a = warp * 16 + (lane & 15);
  const uint32_t aH = sH + uint32_t(row_a * LDD + (lane >> 4) * 8) * 2u;
  const uint32_t aQ = sQ + uint32_t(row_a * LDQ + (lane >> 4) * 8) * 2u;
  const int b_row = (lane & 7) + ((lane >> 4) << 3);
  const int b_col = ((lane >> 3) & 1) * 8;
  const uint32_t bD = uint32_t(b_row * LDD + b_col) * 2u;        // panels of K = D
  const uint32_t bF = uint32_t(b_row * (F + 8) + b_col) * 2u;    // the Wf panel (K = F)
  // This thread's C-fragment rows g (and g + 8) of the warp's tile.
  const uint32_t cH = sH + uint32_t((warp * 16 + g) * LDD + 2 * t) * 2u;
  const uint32_t cK = sK + uint32_t((warp * 16 + g) * LDD + 2 * t) * 2u;
  const uint32_t cV = sV + uint32_t((warp * 16 + g) * LDD + 2 * t) * 2u;
  const uint32_t cQ = sQ + uint32_t((warp * 16 + g) * LDQ + 2 * t) * 2u;
  const uint32_t row8D = uint32_t(8 * LDD * 2), row8Q = uint32_t(8 * LDQ * 2);

  const int i_seq = warp / a.st, lt = warp - i_seq * a.st;  // sequence slot and tile of this warp
  const bool in_pass = warp < a.pack * a.st;
  // Attention of this warp's tile against the keys and values of its sequence slot.
  const int kv0 = i_seq * a.st * 16;
  const TileAttention att = tile_attention<HD>(sQ + uint32_t(kv0 * LDQ) * 2u, LDQ, sK + uint32_t(kv0 * LDD) * 2u,
                                               sV + uint32_t(kv0 * LDD) * 2u, LDD, lt, lane);

  for (int i = tid; i < D; i += kThreads) {
    ln0[i] = a.layers[0].ln1_w[i];
    ln0[D + i] = a.layers[0].ln1_b[i];
  }
  const int steps = kStepsPerLayer * a.L;
  load_stage<D>(a, sStage, 0, tid);
  cp_async_commit();
  __syncthreads();  // ln0 visible

  int q = 0, cur = 0;  // stage index in the pass, buffer holding it
#pragma unroll 1
  for (int pass = int(blockIdx.x); pass < a.npasses; pass += int(gridDim.x)) {
    const bool last_pass = pass + int(gridDim.x) >= a.npasses;
    const int b = pass * a.pack + i_seq;
    const bool has_tile = in_pass && b < a.B;
    const int len = has_tile ? seq_len(a, b) : 0;
    const bool active = lt * 16 < len;  // false without a tile (len = 0)
    const int r0 = lt * 16 + g, r1 = r0 + 8;  // this thread's rows in the sequence
    const int64_t seq_base = int64_t(b) * a.S * D;

    float acc[NT][4];
    if (active) {
      // x -> residual (rows >= len: zeros, never read: y may alias x), then LN1 of layer 0.
      // The residual is held relative to its row's first element c = x[r][0]: every mma k step
      // adds into it and rounds to its ulp, which is then the ulp of the row's spread, not of
      // its magnitude (|x| ~ 1e4 would lose ~1e-3 per step). Only LayerNorms read the residual
      // (shift-invariant) and x is never stored, so c is never added back.
      const float* xs = a.x + seq_base;
      const float c0 = r0 < len ? xs[int64_t(r0) * D] : 0.f;
      const float c1 = r1 < len ? xs[int64_t(r1) * D] : 0.f;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int col = 8 * j + 2 * t;
        const float2 x0 = r0 < len ? *reinterpret_cast<const float2*>(xs + int64_t(r0) * D + col) : make_float2(0.f, 0.f);
        const float2 x1 = r1 < len ? *reinterpret_cast<const float2*>(xs + int64_t(r1) * D + col) : make_float2(0.f, 0.f);
        acc[j][0] = x0.x - c0;
        acc[j][1] = x0.y - c0;
        acc[j][2] = x1.x - c1;
        acc[j][3] = x1.y - c1;
      }
      ln_store_f16<NT>(acc, a.eps, ln0, ln0 + D, cH, row8D, t);
    } else if (has_tile) {
      // A tile of padding only: its y rows are zeros.
      float* ys = a.y + seq_base + int64_t(lt) * 16 * D;
      const int n4 = (min(a.S - lt * 16, 16) * D) >> 2;
      for (int i = lane; i < n4; i += 32) reinterpret_cast<float4*>(ys)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }

    // Next weight stage: see the file comment. Returns the stage's buffer (shared address).
    auto step = [&]() -> uint32_t {
      cp_async_wait_all();
      __syncthreads();
      const int qn = q + 1 == steps ? 0 : q + 1;
      if (!(last_pass && qn == 0)) load_stage<D>(a, sStage + uint32_t(cur ^ 1) * Lo.stage_bytes, qn, tid);
      cp_async_commit();
      const uint32_t buf = sStage + uint32_t(cur) * Lo.stage_bytes;
      cur ^= 1;
      q = qn;
      return buf;
    };
    auto vec = [&](uint32_t buf, int slot) { return smem + (buf - s0) + slot * kVecSlot; };

#pragma unroll 1
    for (int l = 0; l < a.L; ++l) {
      // 0-2: q, k, v of the warp's rows.
#pragma unroll 1
      for (int part = 0; part < 3; ++part) {
        const uint32_t buf = step();
        if (active) {
          float c[NT][4];
          zero(c);
          warp_gemm<NT>(c, aH, buf + kVecBytes + bD, uint32_t(16 * LDD * 2), D / 16, NT / 2);
          const __half* bias = reinterpret_cast<const __half*>(vec(buf, 0));
          if (part == 0) store_bias_f16<NT>(c, bias, cQ, row8Q, t);
          else store_bias_f16<NT>(c, bias, part == 1 ? cK : cV, row8D, t);
        }
      }
      // 3: attention, out_proj, LN2.
      {
        const uint32_t buf = step();  // also: every tile's k, v of this layer are visible
        if (active) {
          const float sl2 = a.scale_log2;
#pragma unroll 1
          for (int hh = 0; hh < H; ++hh) tile_attention_head<HD, kHoldQ>(att, hh, lt, len, a.causal, sl2, lane);
          __syncwarp();  // o of every lane before the out_proj ldmatrix
          warp_gemm<NT>(acc, aQ, buf + kVecBytes + bD, uint32_t(16 * LDD * 2), D / 16, NT / 2);
          const float* bo = reinterpret_cast<const float*>(vec(buf, 0));
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const float2 bv = *reinterpret_cast<const float2*>(bo + 8 * j + 2 * t);
            acc[j][0] += bv.x;
            acc[j][1] += bv.y;
            acc[j][2] += bv.x;
            acc[j][3] += bv.y;
          }
          ln_store_f16<NT>(acc, a.eps, reinterpret_cast<const float*>(vec(buf, 1)),
                           reinterpret_cast<const float*>(vec(buf, 2)), cH, row8D, t);
          __syncwarp();
        }
      }
      // 4: f = GELU(h Wi^T + bi) into sQ, in chunks of kFC columns.
      {
        const uint32_t buf = step();
        if (active) {
          const __half* bias = reinterpret_cast<const __half*>(vec(buf, 0));
#pragma unroll 1
          for (int c0 = 0; c0 < F; c0 += kFC) {
            float c[kFC / 8][4];
            zero(c);
            warp_gemm<kFC / 8>(c, aH, buf + kVecBytes + bD + uint32_t(c0 * LDD * 2), uint32_t(16 * LDD * 2), D / 16,
                               min(kFC, F - c0) / 16);
#pragma unroll
            for (int j = 0; j < kFC / 8; ++j) {
              const int col = c0 + 8 * j;
              if (col < F) {
                const float2 bv = __half22float2(*reinterpret_cast<const __half2*>(bias + col + 2 * t));
                st_shared_u32(cQ + uint32_t(col) * 2u,
                              pack_half2(gelu_of_f16(c[j][0] + bv.x), gelu_of_f16(c[j][1] + bv.y)));
                st_shared_u32(cQ + row8Q + uint32_t(col) * 2u,
                              pack_half2(gelu_of_f16(c[j][2] + bv.x), gelu_of_f16(c[j][3] + bv.y)));
              }
            }
          }
          __syncwarp();
        }
      }
      // 5: x += f Wf^T + bf; then the next layer's LN1, or the final LayerNorm into y.
      {
        const uint32_t buf = step();
        if (active) {
          warp_gemm<NT>(acc, aQ, buf + kVecBytes + bF, uint32_t(16 * (F + 8) * 2), F / 16, NT / 2);
          const float* bf = reinterpret_cast<const float*>(vec(buf, 0));
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const float2 bv = *reinterpret_cast<const float2*>(bf + 8 * j + 2 * t);
            acc[j][0] += bv.x;
            acc[j][1] += bv.y;
            acc[j][2] += bv.x;
            acc[j][3] += bv.y;
          }
          const float* lw = reinterpret_cast<const float*>(vec(buf, 1));
          const float* lb = reinterpret_cast<const float*>(vec(buf, 2));
          if (l + 1 < a.L) {
            ln_store_f16<NT>(acc, a.eps, lw, lb, cH, row8D, t);
          } else {
            const RowStats st = quad::row_stats<NT>(acc, a.eps);
            float* ys = a.y + seq_base;
            const bool v0 = r0 < len, v1 = r1 < len;
#pragma unroll
            for (int j = 0; j < NT; ++j) {
              const int col = 8 * j + 2 * t;
              const float2 wv = *reinterpret_cast<const float2*>(lw + col);
              const float2 bv = *reinterpret_cast<const float2*>(lb + col);
              if (r0 < a.S) {
                *reinterpret_cast<float2*>(ys + int64_t(r0) * D + col) =
                    v0 ? make_float2(ln_value(acc[j][0], st, 0, wv.x, bv.x), ln_value(acc[j][1], st, 0, wv.y, bv.y))
                       : make_float2(0.f, 0.f);
              }
              if (r1 < a.S) {
                *reinterpret_cast<float2*>(ys + int64_t(r1) * D + col) =
                    v1 ? make_float2(ln_value(acc[j][2], st, 1, wv.x, bv.x), ln_value(acc[j][3], st, 1, wv.y, bv.y))
                       : make_float2(0.f, 0.f);
              }
            }
          }
          __syncwarp();
        }
      }
    }
  }
  cp_async_wait_all();
}

// ---- the column-split kernel ----------------------------------------------------------------------
// One sequence per cluster of C CTAs of 16 warps (C = 1: a CTA; C = 2, 4, 8: sm_90 thread-block
// clusters). CTA rank c owns the sequence's row tiles c, c + C, ... (interleaved: causal work
// spreads evenly) for the whole forward; only attention needs other rows: each CTA writes the k
// and v rows it computes into the other CTA (C = 2: stores to distributed shared memory, one
// cluster barrier per layer) or copies the k / v rows of its tiles into the other CTAs (C >= 4:
// bulk copies by the TMA engine that complete on the receiver's mbarrier); one cluster barrier per
// sequence; K / V double-buffered by layer parity when C > 1, so the next layer's writes never
// meet a slower CTA's reads. Within a CTA every product is split
// over the warps by output columns (n8 tiles: warp w takes tiles w, w + 16, ...) and runs over
// the CTA's valid row tiles (two at a time), so a short sequence (case 2: 1 x 128 with a few
// dozen valid rows) still has every warp at work; the B fragments of a warp's columns come from
// global memory (the weights stay in L2) straight into registers with 16-byte loads (the A
// operands h, o, f are stored in the k order of perm_col(), perm_col.hpp), issued with the
// epilogue's vectors before the barrier that precedes their product. Attention: (head, query tile)
// tasks over the warps, longest (causal) first, dealt out in a snake. LayerNorms: row per warp on
// the fp32 residual, which lives in shared memory (x += c + bias in the product epilogues, the
// unfused route's order).
// Shared memory (own rows nl = 16 ceil(ceil(S / 16) / C), all rows = 16 ceil(S / 16)):
//   sX   [nl][D + 4]          fp32 residual of the own rows
//   sH   [nl][D + 8]          h (LN output) and o (attention output), fp16, permuted k order: the
//                             A operand of q/k/v, out_proj and ffn_in
//   sQ   [nl][max(D, F) + 8]  q (fp16, natural order), then f (permuted): ffn_out's A operand
//   sKV  [1 or 2][all][2D + 8]  k | v of every row of the sequence (fp16, natural order)
// Per layer (barriers |, the k / v exchange ||): LN1 | qkv || attention | out_proj | LN2 | ffn_in |
// ffn_out | (next LN1).
constexpr int kWideWarps = 16;
constexpr int kWideThreads = 32 * kWideWarps;

struct WideLayout {
  uint32_t x, h, q, kv, kv_buf, bar, total;  // bar: two mbarriers (K / V buffers), C > 1
  int ldx, ldh, ldq, ldkv;  // elements per row
};
// st: 16-row tiles per sequence; C: CTAs per sequence.
__host__ __device__ inline WideLayout wide_layout(int D, int F, int st, int C) {
  WideLayout l;
  const int nl = 16 * ((st + C - 1) / C), all = 16 * st;
  l.ldx = D + 4;
  l.ldh = D + 8;
  l.ldq = (D > F ? D : F) + 8;
  l.ldkv = 2 * D + 8;
  l.x = 0;
  l.h = round_up(4u * uint32_t(nl * l.ldx), 128);
  l.q = l.h + round_up(2u * uint32_t(nl * l.ldh), 128);
  l.kv = l.q + round_up(2u * uint32_t(nl * l.ldq), 128);
  l.kv_buf = round_up(2u * uint32_t(all * l.ldkv), 128);
  l.bar = l.kv + (C > 1 ? 2u : 1u) * l.kv_buf;
  l.total = l.bar + (C > 1 ? 16u : 0u);
  return l;
}

// B fragments of this warp's n-tiles (tile warp + 16 j < ntiles) of W [N, K] (K contiguous, a
// multiple of 16) for an A operand stored in perm_col() order: per group of 32 k, the lane's row
// n = 8 tile + g, weights 8t .. 8t + 7 (one 16-byte load) are the fragments of both k16 steps;
// a last group of 16: weights 4t .. 4t + 3 (8 bytes). Steps at or past K / 16 are zero.
template <int NJ, int KS>
__device__ __forceinline__ void load_b(uint32_t (&b)[NJ][KS][2], const __half* W, int K, int ntiles, int warp,
                                       int lane) {
  static_assert(KS % 2 == 0, "k steps in pairs");
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const int tile = warp + kWideWarps * j;
    const __half* row = W + int64_t(8 * tile + g) * K;
#pragma unroll
    for (int kk = 0; kk < KS / 2; ++kk) {
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (tile < ntiles) {
        if (32 * kk + 32 <= K) {
          v = __ldg(reinterpret_cast<const uint4*>(row + 32 * kk + 8 * t));
        } else if (32 * kk + 16 <= K) {
          const uint2 u = __ldg(reinterpret_cast<const uint2*>(row + 32 * kk + 4 * t));
          v.x = u.x;
          v.y = u.y;
        }
      }
      b[j][2 * kk][0] = v.x;
      b[j][2 * kk][1] = v.y;
      b[j][2 * kk + 1][0] = v.z;
      b[j][2 * kk + 1][1] = v.w;
    }
  }
}

// c[m][j] = A (row tile m of the two at a0 / a1, the lane's ldmatrix addresses at k = 0) x B
// fragments, for the first nj (warp-uniform) of the warp's tiles and ksteps k16 steps; the second
// row tile only when `two` (warp-uniform). Two independent accumulator chains per n-tile.
template <int NJ, int KS>
__device__ __forceinline__ void mma_rows2(float (&c)[2][NJ][4], uint32_t a0, uint32_t a1, bool two,
                                          const uint32_t (&b)[NJ][KS][2], int ksteps, int nj) {
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int j = 0; j < NJ; ++j) c[m][j][0] = c[m][j][1] = c[m][j][2] = c[m][j][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    if (ks < ksteps) {
      uint32_t af[4], ag[4];
      ldsm_x4(af, a0 + uint32_t(ks) * 32u);
      if (two) ldsm_x4(ag, a1 + uint32_t(ks) * 32u);
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        if (j < nj) {
          mma_16816(c[0][j], af, b[j][ks][0], b[j][ks][1]);
          if (two) mma_16816(c[1][j], ag, b[j][ks][0], b[j][ks][1]);
        }
      }
    }
  }
}

// The lane's D / 32 consecutive values (columns V * lane ..) of a row, and the LayerNorm of a row
// by one warp: mean, then the centred sum of squares, from values held in registers.
template <int V>
struct RowVec {
  float v[V];
  __device__ __forceinline__ void load(const float* p) {
    if constexpr (V == 4) {
      const float4 q = *reinterpret_cast<const float4*>(p);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
      static_assert(V == 2, "D = 64 or 128");
      const float2 q = *reinterpret_cast<const float2*>(p);
      v[0] = q.x, v[1] = q.y;
    }
  }
  __device__ __forceinline__ void load_ldg(const float* p) {
    if constexpr (V == 4) {
      const float4 q = __ldg(reinterpret_cast<const float4*>(p));
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
      const float2 q = __ldg(reinterpret_cast<const float2*>(p));
      v[0] = q.x, v[1] = q.y;
    }
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = 0.f;
  }
  __device__ __forceinline__ void store(float* p) const {
    if constexpr (V == 4) *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    else *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
  }
  __device__ __forceinline__ void layer_norm(const RowVec& w, const RowVec& b, float eps) {
    constexpr int D = 32 * V;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < V; ++i) s += v[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float mean = s / float(D);
    float q = 0.f;
#pragma unroll
    for (int i = 0; i < V; ++i) q += (v[i] - mean) * (v[i] - mean);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
    const float rstd = rsqrtf(q / float(D) + eps);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = (v[i] - mean) * rstd * w.v[i] + b.v[i];
  }
  // fp16 into an A-operand row (perm_col order over K = D), columns V * lane ...
  __device__ __forceinline__ void store_a(uint32_t row, int lane) const {
#pragma unroll
    for (int i = 0; i < V; i += 2)
      st_shared_u32(row + uint32_t(perm_col(V * lane + i, 32 * V)) * 2u, pack_half2(v[i], v[i + 1]));
  }
};

// The LayerNorms of two rows by one warp, each row's arithmetic as RowVec::layer_norm's (the same
// bits), the two rows' butterflies interleaved: each of
// the 10 dependent shuffle rounds of a row's mean and variance covers both rows, so a warp's pair
// of rows costs about one row's latency.
template <int V>
__device__ __forceinline__ void layer_norm_pair(RowVec<V>& x, RowVec<V>& y, const RowVec<V>& w, const RowVec<V>& b,
                                                float eps) {
  constexpr int D = 32 * V;
  float sx = 0.f, sy = 0.f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    sx += x.v[i];
    sy += y.v[i];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    sx += __shfl_xor_sync(0xffffffffu, sx, o);
    sy += __shfl_xor_sync(0xffffffffu, sy, o);
  }
  const float mx = sx / float(D), my = sy / float(D);
  float qx = 0.f, qy = 0.f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    qx += (x.v[i] - mx) * (x.v[i] - mx);
    qy += (y.v[i] - my) * (y.v[i] - my);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    qx += __shfl_xor_sync(0xffffffffu, qx, o);
    qy += __shfl_xor_sync(0xffffffffu, qy, o);
  }
  const float rx = rsqrtf(qx / float(D) + eps), ry = rsqrtf(qy / float(D) + eps);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    x.v[i] = (x.v[i] - mx) * rx * w.v[i] + b.v[i];
    y.v[i] = (y.v[i] - my) * ry * w.v[i] + b.v[i];
  }
}

template <int D, int HD>
__global__ void __launch_bounds__(kWideThreads, 1) model_wide_kernel(const Args a) {
  constexpr int H = D / HD;
  constexpr int V = D / 32;                               // residual values per lane in a row
  constexpr int KSD = D / 16;                             // k16 steps of K = D
  constexpr int KSF = kMaxF / 16;                         // of K = F (<= kMaxF)
  constexpr int NQ = 3 * D / 8;                           // n8 tiles of q | k | v
  constexpr int NJQ = (NQ + kWideWarps - 1) / kWideWarps;  // per warp
  constexpr int NJD = (D / 8 + kWideWarps - 1) / kWideWarps;
  constexpr int NJF = (kMaxF / 8 + kWideWarps - 1) / kWideWarps;
  static_assert(D == 64 || D == 128, "row LayerNorm by one warp: D / 32 values per lane");
  static_assert(HD == 8 || (HD % 16 == 0 && HD <= D), "head_dim 8 or a multiple of 16");
  static_assert(NJD == 1 && NJF == 1, "one n-tile per warp for the D- and F-wide products");

  extern __shared__ __align__(128) unsigned char smem[];
  const int F = a.F, S = a.S, C = a.cl;
  const WideLayout Lo = wide_layout(D, F, a.st, C);
  const int LDX = Lo.ldx, LDH = Lo.ldh, LDQ = Lo.ldq, LDKV = Lo.ldkv;
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int crank = C > 1 ? int(cluster_rank()) : 0;
  const int cid = int(blockIdx.x) / C, nclusters = int(gridDim.x) / C;
  float* sX = reinterpret_cast<float*>(smem + Lo.x);
  const uint32_t s0 = smem_u32(smem);
  const uint32_t sH = s0 + Lo.h, sQ = s0 + Lo.q;
  // ldmatrix A lane addresses (row lane & 15, column (lane >> 4) * 8) of own row tile 0, in bytes.
  const uint32_t aH = sH + uint32_t((lane & 15) * LDH + (lane >> 4) * 8) * 2u;
  const uint32_t aQ = sQ + uint32_t((lane & 15) * LDQ + (lane >> 4) * 8) * 2u;
  const uint32_t tileH = uint32_t(16 * LDH) * 2u, tileQ = uint32_t(16 * LDQ) * 2u;
  const uint32_t row8H = uint32_t(8 * LDH) * 2u, row8Q = uint32_t(8 * LDQ) * 2u;
  const float sl2 = a.scale_log2;
  const int nj_q = (NQ - warp + kWideWarps - 1) / kWideWarps;  // this warp's q | k | v tiles
  const int colD = 8 * warp + 2 * t;                           // out_proj / ffn_out / ffn_in column
  // Phase trace (model_persistent_forward's `trace`): lane 0 of every warp of each CTA of the first
  // sequence's cluster stamps its SM clock at each event; rows of persistent_trace_events(L),
  // row (rank, warp) = kPersistentTraceWarps rank + warp.
  static_assert(kPersistentTraceWarps == kWideWarps, "a trace row per warp");
  auto stamp = [&](int b, int e) {
    if (a.trace != nullptr && b == 0 && lane == 0)
      a.trace[(crank * kWideWarps + warp) * persistent_trace_events(a.L) + e] = clock64();
  };

  // x += c + bias over this warp's columns of own row tiles i, i + 1 (`two`).
  auto add_residual = [&](const float (&c)[2][1][4], int i, bool two, float2 bv) {
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      if (m == 0 || two) {
        float2* x0 = reinterpret_cast<float2*>(sX + (16 * (i + m) + g) * LDX + colD);
        float2* x1 = reinterpret_cast<float2*>(sX + (16 * (i + m) + g + 8) * LDX + colD);
        float2 v0 = *x0, v1 = *x1;
        v0.x += c[m][0][0] + bv.x;
        v0.y += c[m][0][1] + bv.y;
        v1.x += c[m][0][2] + bv.x;
        v1.y += c[m][0][3] + bv.y;
        *x0 = v0;
        *x1 = v1;
      }
    }
  };
  // x += A W^T + b over this warp's n-tile of the first n_loc own row tiles (out_proj: A = o,
  // K = D; ffn_out: A = f, K = F), with W's fragments and b loaded before the barrier that
  // publishes A. ks: std::integral_constant of the k16 steps W's fragments hold.
  auto residual_product = [&](auto ks, const __half* W, int K, const float* bias, uint32_t a_lane, uint32_t tile,
                              int ksteps, int n_loc, int b, int event) {
    constexpr int KS = decltype(ks)::value;
    uint32_t bw[NJD][KS][2];
    load_b<NJD, KS>(bw, W, K, D / 8, warp, lane);
    const float2 bv = warp < D / 8 ? __ldg(reinterpret_cast<const float2*>(bias + colD)) : make_float2(0.f, 0.f);
    __syncthreads();  // A
    stamp(b, event);
    if (warp < D / 8) {
#pragma unroll 1
      for (int i = 0; i < n_loc; i += 2) {
        const bool two = i + 1 < n_loc;
        float c[2][NJD][4];
        mma_rows2<NJD, KS>(c, a_lane + uint32_t(i) * tile, a_lane + uint32_t(i + 1) * tile, two, bw, ksteps, 1);
        add_residual(c, i, two, bv);
      }
    }
  };
  // h = fp16(LN(x) w + b) of the first `rows` own rows, a warp per row (perm_col order in sH);
  // warp w's rows w, w + 16, ... two at a time (layer_norm_pair).
  auto layer_norm_rows = [&](const RowVec<V>& lw, const RowVec<V>& lb, int rows) {
#pragma unroll 1
    for (int r = warp; r < rows; r += 2 * kWideWarps) {
      const int r2 = r + kWideWarps;
      const bool two = r2 < rows;
      RowVec<V> v, u;
      v.load(sX + r * LDX + V * lane);
      if (two) u.load(sX + r2 * LDX + V * lane);
      else u.zero();
      layer_norm_pair(v, u, lw, lb, a.eps);
      v.store_a(sH + uint32_t(r * LDH) * 2u, lane);
      if (two) u.store_a(sH + uint32_t(r2 * LDH) * 2u, lane);
    }
  };
  // Global row of own row lr (own tile lr / 16 is the sequence's tile crank + C (lr / 16)).
  auto grow = [&](int lr) { return 16 * (crank + C * (lr >> 4)) + (lr & 15); };

  int kvpar = 0;           // K / V buffer of the current layer (C > 1: alternates layer by layer)
  uint32_t kvphase = 0u;   // bit p: the phase parity of buffer p's mbarrier
  if (C > 2 && tid == 0) {
    mbar_init(s0 + Lo.bar, 1);
    mbar_init(s0 + Lo.bar + 8u, 1);
    fence_mbar_init_cluster();
  }
  pdl_wait();  // x, lengths and y belong to the stream's earlier work (weights may be read before)
#pragma unroll 1
  for (int b = cid; b < a.B; b += nclusters) {
    // Every CTA of the cluster done with the previous sequence (a CTA without tiles there would
    // otherwise start sending this one's k / v into buffers still being read); the first time,
    // every CTA of the cluster started (distributed shared memory may only be written once its
    // CTA runs: racecheck flagged the 2-CTA stores without it) and the mbarriers initialised.
    if (C > 1) cluster_sync();
    stamp(b, 0);
    const int len = seq_len(a, b);
    const int mt_n = (len + 15) >> 4;                                 // row tiles with valid rows
    const int n_loc = mt_n > crank ? (mt_n - crank + C - 1) / C : 0;  // of them, this CTA's
    const int rows = 16 * n_loc;
    const float* xs = a.x + int64_t(b) * S * D;
    float* ys = a.y + int64_t(b) * S * D;

    // Layer 0's LN1: x -> sX (rows >= len: zeros, never read: y may alias x), h -> sH.
    {
      RowVec<V> w, bb;
      w.load_ldg(a.layers[0].ln1_w + V * lane);
      bb.load_ldg(a.layers[0].ln1_b + V * lane);
      if constexpr (V == 2) {
        // D = 64: rows two at a time as in layer_norm_rows (at D = 128 the pair spills here).
#pragma unroll 1
        for (int r = warp; r < rows; r += 2 * kWideWarps) {
          const int r2 = r + kWideWarps;
          const bool two = r2 < rows;
          const int gr = grow(r), gr2 = grow(r2);
          RowVec<V> v, u;
          if (gr < len) v.load(xs + int64_t(gr) * D + V * lane);
          else v.zero();
          if (two && gr2 < len) u.load(xs + int64_t(gr2) * D + V * lane);
          else u.zero();
          v.store(sX + r * LDX + V * lane);
          if (two) u.store(sX + r2 * LDX + V * lane);
          layer_norm_pair(v, u, w, bb, a.eps);
          v.store_a(sH + uint32_t(r * LDH) * 2u, lane);
          if (two) u.store_a(sH + uint32_t(r2 * LDH) * 2u, lane);
        }
      } else {
#pragma unroll 1
        for (int r = warp; r < rows; r += kWideWarps) {
          RowVec<V> v;
          const int gr = grow(r);
          if (gr < len) v.load(xs + int64_t(gr) * D + V * lane);
          else v.zero();
          v.store(sX + r * LDX + V * lane);
          v.layer_norm(w, bb, a.eps);
          v.store_a(sH + uint32_t(r * LDH) * 2u, lane);
        }
      }
    }

#pragma unroll 1
    for (int l = 0; l < a.L; ++l) {
      const PersistentLayer& w = a.layers[l];
      const uint32_t sK = s0 + Lo.kv + uint32_t(kvpar) * Lo.kv_buf, sV = sK + uint32_t(D) * 2u;
      // q (own rows, natural order) | k | v (every CTA of the cluster, global rows) = fp16(h Wqkv^T + b).
      // Each phase's weights and vectors are loaded just before the barrier that precedes it
      // (loading them a phase earlier, across the previous phase, measured slower at D = 128:
      // the registers are at the 128 of 16 warps).
      {
        uint32_t bq[NJQ][KSD][2];
        load_b<NJQ, KSD>(bq, w.w_qkv, D, NQ, warp, lane);
        float2 bias[NJQ];
#pragma unroll
        for (int j = 0; j < NJQ; ++j)
          bias[j] = j < nj_q ? __half22float2(*reinterpret_cast<const __half2*>(w.b_qkv + 8 * (warp + kWideWarps * j) + 2 * t))
                             : make_float2(0.f, 0.f);
        __syncthreads();  // h
        stamp(b, 1 + 9 * l);
#pragma unroll 1
        for (int i = 0; i < n_loc; i += 2) {
          const bool two = i + 1 < n_loc;
          float c[2][NJQ][4];
          mma_rows2<NJQ, KSD>(c, aH + uint32_t(i) * tileH, aH + uint32_t(i + 1) * tileH, two, bq, KSD, nj_q);
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            if (m == 0 || two) {
              const int gr = 16 * (crank + C * (i + m)) + g;  // global row of c[m][*][0..1]
#pragma unroll
              for (int j = 0; j < NJQ; ++j) {
                if (j < nj_q) {
                  const int col = 8 * (warp + kWideWarps * j) + 2 * t;
                  const uint32_t v0 = pack_half2(c[m][j][0] + bias[j].x, c[m][j][1] + bias[j].y);
                  const uint32_t v1 = pack_half2(c[m][j][2] + bias[j].x, c[m][j][3] + bias[j].y);
                  if (col < D) {
                    const uint32_t at = sQ + uint32_t((16 * (i + m) + g) * LDQ + col) * 2u;
                    st_shared_u32(at, v0);
                    st_shared_u32(at + row8Q, v1);
                  } else {
                    const uint32_t at = sK + uint32_t(gr * LDKV + col - D) * 2u;
                    const uint32_t r8 = uint32_t(8 * LDKV) * 2u;
                    if (C != 2) {
                      st_shared_u32(at, v0);
                      st_shared_u32(at + r8, v1);
                    } else {
#pragma unroll 1
                      for (int r = 0; r < 2; ++r) {
                        const uint32_t rat = cluster_map(at, uint32_t(r));
                        st_cluster_u32(rat, v0);
                        st_cluster_u32(rat + r8, v1);
                      }
                    }
                  }
                }
              }
            }
          }
        }
      }
      stamp(b, 2 + 9 * l);
      // q, k, v (and every read of h). C = 2: the k / v rows went to both CTAs with the
      // epilogue's stores, the cluster's barrier publishes them. C >= 4: the own k / v tiles go to
      // the cluster's other CTAs that hold tiles (ranks below mt_n) by bulk copies completing on
      // their mbarrier of this K / V buffer, and this CTA waits for the others' tiles on its own
      // (measured on the H200, case 2: 8-CTA clusters 12% faster than with per-element stores and
      // a cluster barrier, 4-CTA even; 2-CTA clusters 2-4% slower, so they keep the stores). A CTA
      // without tiles neither sends nor waits. No CTA can run a layer ahead into a buffer still
      // being read: its tiles of layer l + 1 leave after its wait for layer l, which needed every
      // holder's layer-l tiles, sent after that holder's attention of layer l - 1 (the buffers
      // alternate).
      if (C == 2) {
        cluster_sync();
      } else if (C > 2 && n_loc > 0) {
        fence_proxy_async_shared();  // this thread's k / v writes, before the bulk copies read them
        __syncthreads();
        const uint32_t bar = s0 + Lo.bar + 8u * uint32_t(kvpar);
        const uint32_t tile_bytes = uint32_t(16 * LDKV) * 2u;
        if (tid == 0) mbar_arrive_expect_tx(bar, uint32_t(mt_n - n_loc) * tile_bytes);
        if (warp == 0) {
#pragma unroll 1
          for (int k = lane; k < n_loc * (C - 1); k += 32) {
            const int i = k / (C - 1), r = (crank + 1 + k - i * (C - 1)) & (C - 1);
            if (r < mt_n) {
              const uint32_t src = sK + uint32_t(16 * (crank + C * i) * LDKV) * 2u;
              bulk_copy_to_cluster(cluster_map(src, uint32_t(r)), src, tile_bytes, cluster_map(bar, uint32_t(r)));
            }
          }
        }
        mbar_wait(bar, (kvphase >> kvpar) & 1u);
        kvphase ^= 1u << kvpar;
      } else {
        __syncthreads();
      }
      stamp(b, 3 + 9 * l);
      // Attention: task i -> (own tile n_loc - 1 - i / H, head i % H); o -> sH (perm_col order).
      {
        const int ntasks = H * n_loc;
#pragma unroll 1
        for (int k = 0; k * kWideWarps < ntasks; ++k) {
          const int i = k * kWideWarps + ((k & 1) ? kWideWarps - 1 - warp : warp);
          if (i < ntasks) {
            const int li = n_loc - 1 - i / H, hh = i - (i / H) * H;
            const int lt = crank + C * li;  // the tile in the sequence
            // q of own tile li sits at row 16 li; tile_attention addresses row 16 lt of its base.
            TileAttention att =
                tile_attention<HD>(sQ + uint32_t((16 * li - 16 * lt) * LDQ) * 2u, LDQ, sK, sV, LDKV, lt, lane);
            att.o = sH + uint32_t((li * 16 + g) * LDH) * 2u;
            att.o_row8 = row8H;
            att.o_perm = D;
            tile_attention_head<HD, (HD < 64), (HD < 128 ? 2 : 1)>(att, hh, lt, len, a.causal, sl2, lane);
          }
        }
      }
      stamp(b, 4 + 9 * l);
      // x += o Wo^T + bo.
      residual_product(std::integral_constant<int, KSD>(), w.w_o, D, w.b_o, aH, tileH, KSD, n_loc, b, 5 + 9 * l);
      // h = LN2(x).
      {
        RowVec<V> lw, lb;
        lw.load_ldg(w.ln2_w + V * lane);
        lb.load_ldg(w.ln2_b + V * lane);
        __syncthreads();  // x (and every read of o)
        stamp(b, 6 + 9 * l);
        layer_norm_rows(lw, lb, rows);
      }
      // f = fp16(GELU(fp16(h Wi^T + bi))) over q, perm_col order over K = F.
      {
        uint32_t bi[NJF][KSD][2];
        load_b<NJF, KSD>(bi, w.w_in, D, F / 8, warp, lane);
        const float2 bv = warp < F / 8 ? __half22float2(*reinterpret_cast<const __half2*>(w.b_in + colD))
                                       : make_float2(0.f, 0.f);
        __syncthreads();  // h (and every read of q)
        stamp(b, 7 + 9 * l);
        if (warp < F / 8) {
          const uint32_t fcol = uint32_t(perm_col(colD, F)) * 2u;
#pragma unroll 1
          for (int i = 0; i < n_loc; i += 2) {
            const bool two = i + 1 < n_loc;
            float c[2][NJF][4];
            mma_rows2<NJF, KSD>(c, aH + uint32_t(i) * tileH, aH + uint32_t(i + 1) * tileH, two, bi, KSD, 1);
#pragma unroll
            for (int m = 0; m < 2; ++m) {
              if (m == 0 || two) {
                const uint32_t at = sQ + uint32_t((16 * (i + m) + g) * LDQ) * 2u + fcol;
                st_shared_u32(at, pack_half2(gelu_of_f16(c[m][0][0] + bv.x), gelu_of_f16(c[m][0][1] + bv.y)));
                st_shared_u32(at + row8Q, pack_half2(gelu_of_f16(c[m][0][2] + bv.x), gelu_of_f16(c[m][0][3] + bv.y)));
              }
            }
          }
        }
      }
      // x += f Wf^T + bf.
      residual_product(std::integral_constant<int, KSF>(), w.w_out, F, w.b_out, aQ, tileQ, F / 16, n_loc, b, 8 + 9 * l);
      // The next layer's LN1, or the final LayerNorm into y (valid rows; zeros on the others).
      const bool last = l + 1 == a.L;
      RowVec<V> lw, lb;
      lw.load_ldg((last ? a.final_w : a.layers[l + 1].ln1_w) + V * lane);
      lb.load_ldg((last ? a.final_b : a.layers[l + 1].ln1_b) + V * lane);
      __syncthreads();  // x
      stamp(b, 9 + 9 * l);
      if (!last) {
        layer_norm_rows(lw, lb, rows);
      } else {
        // Every row of the CTA's tiles of the sequence (tiles crank, crank + C, ... below S). The
        // next sequence's first writes (its LN1: sX and sH rows r = warp + 16 i) touch only rows
        // this warp reads here, and sH's last readers (ffn_in) finished two barriers ago.
        if constexpr (V == 2) {
          // D = 64: two rows at a time (layer_norm_pair; rows past the length get zeros after it).
#pragma unroll 1
          for (int r = warp;; r += 2 * kWideWarps) {
            const int gr = grow(r), gr2 = grow(r + kWideWarps);
            if (gr >= S) break;
            const bool two = gr2 < S;
            RowVec<V> v, u;
            if (gr < len) v.load(sX + r * LDX + V * lane);
            else v.zero();
            if (two && gr2 < len) u.load(sX + (r + kWideWarps) * LDX + V * lane);
            else u.zero();
            layer_norm_pair(v, u, lw, lb, a.eps);
            if (gr >= len) v.zero();
            if (gr2 >= len) u.zero();
            v.store(ys + int64_t(gr) * D + V * lane);
            if (two) u.store(ys + int64_t(gr2) * D + V * lane);
          }
        } else {
#pragma unroll 1
          for (int r = warp;; r += kWideWarps) {
            const int gr = grow(r);
            if (gr >= S) break;
            RowVec<V> v;
            if (gr < len) {
              v.load(sX + r * LDX + V * lane);
              v.layer_norm(lw, lb, a.eps);
            } else {
              v.zero();
            }
            v.store(ys + int64_t(gr) * D + V * lane);
          }
        }
      }
      if (C > 1) kvpar ^= 1;
    }
    stamp(b, 1 + 9 * a.L);
  }
  if (C > 1) cluster_sync();  // no CTA leaves while others' copies still read or write its memory
}

// ---- launch layer -----------------------------------------------------------------------------------
using KernelFn = void (*)(Args);

// CTAs per sequence of a column kernel (0: the tile kernel).
int cluster_of(PersistentKernel kind) {
  return kind == PersistentKernel::tiles ? 0 : persistent_ctas_per_sequence(kind);
}

KernelFn kernel_of(int D, int hd, PersistentKernel kind = PersistentKernel::tiles) {
  const bool cols = cluster_of(kind) > 0;
  if (D == 128) {
    switch (hd) {
      case 8: return cols ? model_wide_kernel<128, 8> : model_persistent_kernel<128, 8>;
      case 16: return cols ? model_wide_kernel<128, 16> : model_persistent_kernel<128, 16>;
      case 32: return cols ? model_wide_kernel<128, 32> : model_persistent_kernel<128, 32>;
      case 64: return cols ? model_wide_kernel<128, 64> : model_persistent_kernel<128, 64>;
      case 128: return cols ? model_wide_kernel<128, 128> : model_persistent_kernel<128, 128>;
      default: return nullptr;
    }
  }
  if (D == 64) {
    switch (hd) {
      case 8: return cols ? model_wide_kernel<64, 8> : model_persistent_kernel<64, 8>;
      case 16: return cols ? model_wide_kernel<64, 16> : model_persistent_kernel<64, 16>;
      case 32: return cols ? model_wide_kernel<64, 32> : model_persistent_kernel<64, 32>;
      case 64: return cols ? model_wide_kernel<64, 64> : model_persistent_kernel<64, 64>;
      default: return nullptr;
    }
  }
  return nullptr;
}

struct DeviceInfo {
  int sms = 0;
  int cc_major = 0;
  size_t smem_optin = 0;
};
// The current device at first use (the backend runs on one device per process). Without a usable
// device everything stays 0, so supports() answers false instead of throwing.
const DeviceInfo& device_info() {
  static const DeviceInfo info = [] {
    DeviceInfo d;
    int dev = 0, sms = 0, optin = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      cudaGetLastError();  // clear the non-sticky error
      return d;
    }
    d.sms = sms;
    d.cc_major = major;
    d.smem_optin = size_t(optin);
    return d;
  }();
  return info;
}

// Raises every instantiation's dynamic shared-memory limit to the device's opt-in maximum, once.
void ensure_smem_limits() {
  static const bool done = [] {
    const int bytes = int(device_info().smem_optin);
    for (PersistentKernel kind : {PersistentKernel::tiles, PersistentKernel::columns})  // one per family
      for (int D : {64, 128})
        for (int hd : {8, 16, 32, 64, 128})
          if (KernelFn k = kernel_of(D, hd, kind))
            HK_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)done;
}

int tiles_of(int S) { return (S + 15) / 16; }

bool shape_supported(const ModelConfig& c, int S) {
  const int D = c.d_model, H = c.n_heads, F = c.ffn_dim;
  if (H < 1 || D % H != 0 || !kernel_of(D, D / H)) return false;
  if (F < 16 || F > kMaxF || F % 16 != 0) return false;
  if (c.n_layers < 1 || S < 1 || S > kMaxS) return false;
  return true;
}

size_t smem_for(const ModelConfig& c, int S, int pack, PersistentKernel kind = PersistentKernel::tiles) {
  if (const int C = cluster_of(kind)) return wide_layout(c.d_model, c.ffn_dim, tiles_of(S), C).total;
  return layout(c.d_model, c.ffn_dim, pack * tiles_of(S) * 16).total;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

std::vector<PersistentLayer> persistent_layer_table(const DeviceWeights& w, int layers) {
  if (w.gemm_type() != DType::f16)
    throw std::invalid_argument("hk::model[cuda.persistent]: needs fp16 weights (precision 'fast')");
  std::vector<PersistentLayer> t;
  for (int l = 0; l < layers; ++l) {
    const DeviceLayerWeights& d = w.layer(l);
    t.push_back({d.ln1_w, d.ln1_b, static_cast<const __half*>(d.w_qkv), static_cast<const __half*>(d.b_qkv),
                 static_cast<const __half*>(d.w_o), d.b_o, d.ln2_w, d.ln2_b, static_cast<const __half*>(d.w_in),
                 static_cast<const __half*>(d.b_in), static_cast<const __half*>(d.w_out), d.b_out});
  }
  return t;
}

bool model_persistent_supports(const ModelConfig& config, int S, PersistentKernel kind) {
  if (!shape_supported(config, S)) return false;
  if (device_info().sms == 0 || smem_for(config, S, 1, kind) > device_info().smem_optin) return false;
  if (cluster_of(kind) > 1 && device_info().cc_major < 9) return false;  // thread-block clusters
  ensure_smem_limits();
  return true;
}

PersistentModel::PersistentModel(const ModelConfig& config, const DeviceWeights& weights) : config_(config) {
  if (config.n_layers < 1) throw std::invalid_argument("hk::model[cuda.persistent]: n_layers < 1");
  std::vector<PersistentLayer> table;
  try {
    table = persistent_layer_table(weights, config.n_layers);
  } catch (const std::out_of_range&) {
    throw std::invalid_argument("hk::model[cuda.persistent]: the weights hold fewer layers than the config");
  }
  HK_CUDA_CHECK(cudaMalloc(&layers_, table.size() * sizeof(PersistentLayer)));
  try {
    HK_CUDA_CHECK(cudaMemcpy(layers_, table.data(), table.size() * sizeof(PersistentLayer), cudaMemcpyHostToDevice));
  } catch (...) {
    cudaFree(layers_);
    throw;
  }
  final_w_ = weights.final_w();
  final_b_ = weights.final_b();
}

PersistentModel::~PersistentModel() { cudaFree(layers_); }

void model_persistent_forward(const PersistentModel& model, int S, const float* x, const int32_t* lengths, int B,
                              float* y, cudaStream_t stream, PersistentKernel kind, unsigned long long* trace) {
  const ModelConfig& c = model.config();
  auto fail = [](const std::string& what) {
    throw std::invalid_argument("hk::model[cuda.persistent]: " + what);
  };
  if (!model_persistent_supports(c, S, kind)) fail("unsupported shape or device (see model_persistent.cuh)");
  if (B < 0) fail("B < 0");
  if (B == 0) return;
  if (!x || !y || !aligned16(x) || !aligned16(y)) fail("x and y must be 16-byte aligned device pointers");

  const DeviceInfo& dev = device_info();
  const int st = tiles_of(S);
  Args a;
  a.layers = model.device_layers();
  a.final_w = model.final_w();
  a.final_b = model.final_b();
  a.x = x;
  a.y = y;
  a.lengths = lengths;
  a.B = B;
  a.S = S;
  a.F = c.ffn_dim;
  a.L = c.n_layers;
  a.st = st;
  a.eps = float(c.eps);
  a.scale_log2 = float(1.0 / std::sqrt(double(c.head_dim()))) * kLog2e;
  a.causal = c.causal;
  a.trace = trace;
  if (const int C = cluster_of(kind)) {
    // One sequence per cluster of C CTAs, a grid of one wave of clusters looping over the batch.
    const KernelFn kernel = kernel_of(c.d_model, c.head_dim(), kind);
    const size_t smem = smem_for(c, S, 1, kind);
    int occ = 0;
    HK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kWideThreads, smem));
    if (occ < 1) fail("kernel does not fit on an SM");
    a.pack = 1;
    a.npasses = B;
    a.cl = C;
    const int64_t clusters = std::min<int64_t>(B, std::max<int64_t>(1, int64_t(occ) * dev.sms / C));
    const dim3 grid(unsigned(clusters * C));
    if (C == 1) launch_pdl(kernel, grid, dim3(kWideThreads), smem, stream, a);
    else launch_pdl_cluster(kernel, grid, dim3(kWideThreads), dim3(unsigned(C)), smem, stream, a);
    return;
  }
  // Sequences per pass: as many as fill one wave of CTAs first, then packed into the 8 tiles.
  int pack_max = kMaxTiles / st;
  while (pack_max > 1 && smem_for(c, S, pack_max) > dev.smem_optin) --pack_max;
  const KernelFn kernel = kernel_of(c.d_model, c.head_dim());
  int occ = 0;
  HK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kThreads, smem_for(c, S, 1)));
  if (occ < 1) fail("kernel does not fit on an SM");
  const int64_t wave = int64_t(occ) * dev.sms;
  const int pack = int(std::min<int64_t>(pack_max, std::max<int64_t>(1, (B + wave - 1) / wave)));
  const size_t smem = smem_for(c, S, pack);
  HK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kThreads, smem));
  if (occ < 1) fail("kernel does not fit on an SM");

  a.pack = pack;
  a.npasses = (B + pack - 1) / pack;
  const int grid = int(std::min<int64_t>(a.npasses, int64_t(occ) * dev.sms));
  kernel<<<unsigned(grid), kThreads, smem, stream>>>(a);
  HK_CUDA_CHECK_LAUNCH();
}

const char* model_persistent_name(const ModelConfig& config, PersistentKernel kind) {
  static const char* const names[2][5] = {
      {"hk::model[cuda.persistent.d64]", "hk::model[cuda.persistent.cols.d64]", "hk::model[cuda.persistent.cols.c2.d64]",
       "hk::model[cuda.persistent.cols.c4.d64]", "hk::model[cuda.persistent.cols.c8.d64]"},
      {"hk::model[cuda.persistent.d128]", "hk::model[cuda.persistent.cols.d128]",
       "hk::model[cuda.persistent.cols.c2.d128]", "hk::model[cuda.persistent.cols.c4.d128]",
       "hk::model[cuda.persistent.cols.c8.d128]"}};
  const int k = int(kind);
  if (k < 0 || k > 4) return "";
  switch (config.d_model) {
    case 64: return names[0][k];
    case 128: return names[1][k];
    default: return "";
  }
}

}  // namespace hk::cuda
