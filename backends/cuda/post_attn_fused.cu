// The fused post-attention chain (see post_attn_fused.cuh).
//
// Work split: a warp owns 16 token rows at a time for the whole chain. Its fp32 residual row
// block (16 x D) lives in the mma accumulators: thread (g = lane/4, t = lane%4) holds rows g and
// g+8, columns 8j + 2t, 8j + 2t + 1 of every n8 tile j (the m16n8 C layout), so each LayerNorm
// reduces over 4 lanes of a quad with two shuffles and never touches shared memory.
//   out_proj: acc = x, acc += o Wo^T, acc += bo (o tile in the warp's smem tile, ldmatrix A)
//   ln2:      h = LN(acc) -> fp16 into the same smem tile
//   ffn:      per chunk of NC ffn columns: c = h Wi[chunk]^T + bi (fp32 regs), GELU, repacked in
//             registers as the A fragments of acc += gelu(c) Wf[:, chunk]^T (no smem round trip)
//   tail:     acc += bf; store x; LN(acc) -> fp16 h_out via the smem tile (16-byte stores), or
//             y = LN(acc) in fp32 with padded rows zeroed.
// Weights ([out, in] = [N, K] row-major, exactly the K-contiguous B operand of mma .col) are
// either resident in shared memory for the CTA's lifetime (D, F <= 128: warps then run
// independently and the grid is persistent, so the weights are read once per CTA), or streamed
// as panels through a two-stage cp.async buffer shared by the CTA's warps (D or F = 256: 384 KB
// of weights cannot stay resident; a CTA then moves through 16 * warps rows per panel sequence).
//
// Numerics follow the split route: fp16 GEMM operands (o, h, GELU output), fp32 accumulation, the
// ffn_in pre-activation rounded to fp16 before the erf GELU (cuBLASLt's fp16 output of the bias
// epilogue), fp32 residual and LayerNorm statistics of the row shifted by its first element
// (row_stats: one pass in the exact row-per-warp / warpgroup kernels, two in the padded ones;
// the column-split kernels combine per-warp means and centred sums of squares), rsqrtf.
#include "post_attn_fused.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "common.cuh"
#include "launch.hpp"
#include "ptx.cuh"
#include "quad_stats.cuh"
#include "tile_attention.cuh"
#include "wgmma.cuh"

namespace hk::cuda {
namespace {

constexpr int kWarpRows = 16;  // the mma M dimension: one m16 tile per warp

constexpr size_t round_up(size_t v, size_t m) { return (v + m - 1) / m * m; }
constexpr size_t cmax(size_t a, size_t b) { return a > b ? a : b; }

// Tile table of one instantiation (DP, FP = the padded D, F it is compiled for).
template <int DP, int FP>
struct Tile {
  // 3 * 128 * 136 halves = 104 KB resident at D = F = 128 leaves room for 12 warps' tiles even on
  // the A100 (163 KB); at 256 the weights are 384 KB: streamed.
  static constexpr bool kResident = DP <= 128 && FP <= 128;
  // ffn columns per chunk: 64 keeps the chunk accumulator at 32 registers next to the D/2
  // residual registers; 32 at D = 256, where the residual alone is 128 registers.
  static constexpr int kNC = DP <= 128 ? 64 : 32;
  // Streamed out_proj panel width (k columns of Wo per stage): 256 x 64 halves = 36 KB per stage.
  static constexpr int kKC = 64;

  static constexpr int kNT = DP / 8;    // n8 tiles across a D-wide row
  static constexpr int kSA = DP + 8;    // halves per row of the warp tile (and of [*, D] weights):
                                        // +16 bytes puts ldmatrix's 8 rows in 8 distinct bank groups
  static constexpr int kSWf = FP + 8;   // halves per row of resident Wf [D, F]
  static constexpr size_t kVecBytes = round_up(size_t(6 * DP + FP) * 4, 128);
  static constexpr size_t kStageBytes =
      round_up(2 * cmax(cmax(size_t(DP) * (kKC + 8), size_t(kNC) * (DP + 8)), size_t(DP) * (kNC + 8)), 128);
  static constexpr size_t kWeightBytes =
      kResident ? round_up(2 * (size_t(DP) * kSA + size_t(FP) * kSA + size_t(DP) * kSWf), 128) : 2 * kStageBytes;
  static constexpr size_t kWarpTileBytes = size_t(2) * kWarpRows * kSA;
  // Stages per row block in the streamed kernel: out_proj panels, then (Wi chunk, Wf chunk) pairs.
  static constexpr int kStages = DP / kKC + 2 * (FP / kNC);

  static_assert(DP % 16 == 0 && FP % 16 == 0, "mma k16 steps");
  static_assert(FP % kNC == 0 && kNC % 16 == 0, "whole ffn chunks");
  static_assert(kResident || DP % kKC == 0, "whole out_proj panels");
  static_assert(DP <= 256, "the residual row block lives in registers");
  static_assert(kStages >= 2, "the streamed pipeline alternates two buffers");
};

// Warps per CTA, from registers (ptxas -v, CUDA 13.0, no spills; a sub-partition holds 16K
// registers, so 9-12 warps allow 168 per thread, 5-8 warps 255): d64 ~128 regs -> 16 warps;
// d128 ~165 -> 12; pad128 needs more than 168 (runtime D masks) -> 8; 256 ~250 -> 8.
template <int DP, int FP, bool kPad>
constexpr int max_warps() {
  return DP <= 64 ? 16 : (DP <= 128 && !kPad ? 12 : 8);
}

template <int DP, int FP>
constexpr size_t smem_bytes(int warps, int nbuf) {
  using T = Tile<DP, FP>;
  return T::kVecBytes + T::kWeightBytes + size_t(warps) * size_t(nbuf) * T::kWarpTileBytes;
}

// ---- PTX wrappers (the shared ones, including ldmatrix whose volatile matters here: the same
// address is read again after a __syncwarp with new contents, o then h, are in ptx.cuh) -------
using namespace ptx;
// 16-byte async copy; valid = false zero-fills the destination without reading global memory.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

// ---- tile loops ----------------------------------------------------------------------------------
// Copies rows [0, NR) x halves [0, NC) of a row-major fp16 matrix (row stride ld) into shared
// memory (row stride SS halves); rows >= vrows or columns >= vcols are zero-filled (padding).
template <int NR, int NCOL, int SS>
__device__ __forceinline__ void copy_panel(uint32_t dst, const __half* src, int64_t ld, int vrows, int vcols,
                                           int tid, int nthreads) {
  constexpr int kChunks = NCOL / 8;
  for (int i = tid; i < NR * kChunks; i += nthreads) {
    const int r = i / kChunks, c = (i - r * kChunks) * 8;
    const bool valid = r < vrows && c < vcols;
    cp_async_16(dst + uint32_t(r * SS + c) * 2u, valid ? src + int64_t(r) * ld + c : src, valid);
  }
}

// The same copy into wgmma.cuh's core-matrix layout ([NR / 8][NCOL / 8] blocks of 8 rows x 16
// bytes, 128 contiguous bytes each), for the warpgroup kernels' B operands. Threads are dealt in
// destination order (8 rows of one 16-byte column, then the next column): conflict-free shared
// stores, and 64 contiguous bytes per row per warp from global memory.
template <int NR, int NCOL>
__device__ __forceinline__ void copy_blocked(uint32_t dst, const __half* src, int64_t ld, int vrows, int vcols,
                                             int tid, int nthreads) {
  constexpr int kChunks = NCOL / 8;
  static_assert(NR % 8 == 0 && NCOL % 8 == 0, "whole core matrices");
  for (int i = tid; i < NR * kChunks; i += nthreads) {
    const int r = (i / (8 * kChunks)) * 8 + (i & 7), kc = (i >> 3) % kChunks, c = kc * 8;
    const bool valid = r < vrows && c < vcols;
    cp_async_16(dst + uint32_t(i) * 16u, valid ? src + int64_t(r) * ld + c : src, valid);
  }
}

// acc[NT][4] += A(16 x 16 KS, ldmatrix from a_addr: the lane's address for k step 0) *
//               B(16 KS x 8 NT; smem rows = n at stride SB halves; b_addr: the lane's address).
template <int NT, int KS, int SB>
__device__ __forceinline__ void mma_smem_a(float (&acc)[NT][4], uint32_t a_addr, uint32_t b_addr) {
  // k steps unrolled by two: one step at a time leaves each step's ldmatrix latency exposed;
  // fully unrolled, ptxas hoists B fragments of later steps and d128 spills at 12 warps (168
  // registers). Two steps fit (d128 tanh: 162 registers, no spills).
#pragma unroll 2
  for (int ks = 0; ks < KS; ++ks) {
    uint32_t a[4];
    ldsm_x4(a, a_addr + ks * 32);
#pragma unroll
    for (int pp = 0; pp < NT / 2; ++pp) {
      uint32_t b[4];
      ldsm_x4(b, b_addr + uint32_t(pp * 16 * SB * 2 + ks * 32));
      mma_16816(acc[2 * pp], a, b[0], b[1]);
      mma_16816(acc[2 * pp + 1], a, b[2], b[3]);
    }
  }
}

// Row of x_in holding chain row r's residual: r itself, or x_rows[r] when the residual is
// gathered; -1 (zeros) past `rows` or where x_rows says so. Both kernel families read it here.
__device__ __forceinline__ int64_t residual_row(const PostAttnParams& p, int64_t r) {
  if (r >= p.rows) return -1;
  return p.x_rows != nullptr ? int64_t(p.x_rows[uint32_t(r)]) : r;
}

// The split route's ffn_in: the GEMM writes fp16(acc + bias), the GELU pass reads that value.
__device__ __forceinline__ float gelu_of_f16(float z) {
  const float r = __half2float(__float2half_rn(z));
  return 0.5f * r * (1.f + erff(r * 0.70710678118654752f));
}

// The tanh form of GELU, 0.5 r (1 + tanh(sqrt(2/pi) (r + 0.044715 r^3))), of two pre-activations
// at once in f16x2 arithmetic: r = fp16(z) (as above), the polynomial, the hardware tanh
// (tanh.approx.f16x2) and the product in half precision, the result as the packed fp16 pair the
// next product reads: 6 f16x2 instructions and one conversion per pair against ~16 fp32 ones
// (with tanh.approx.f32). Each step rounds to fp16 (relative 2^-11), the order of the hardware
// tanh's own error; |r| > 255 overflows r^2 to inf, which tanh maps to +-1 (GELU = r or 0 there,
// as the exact function). Not the model's exact GELU: a fast-precision candidate only, which the
// tuner's numeric guard must accept against the erf form (as cuBLASLt's tanh epilogue).
__device__ __forceinline__ uint32_t gelu2_tanh_of_f16(float a, float b) {
  const __half2 z = __floats2half2_rn(a, b);
  const __half2 u = __hfma2(__hmul2(z, z), __float2half2_rn(0.0356774081f), __float2half2_rn(0.7978845608f));
  const __half2 arg = __hmul2(u, z);
  uint32_t th;
  asm("tanh.approx.f16x2 %0, %1;" : "=r"(th) : "r"(*reinterpret_cast<const uint32_t*>(&arg)));
  const __half2 hz = __hmul2(z, __float2half2_rn(0.5f));
  const __half2 y = __hfma2(hz, *reinterpret_cast<const __half2*>(&th), hz);
  return *reinterpret_cast<const uint32_t*>(&y);
}
// GELU of the pair (lo, hi) as packed fp16: the exact erf form per element, or the tanh form in
// f16x2 arithmetic.
template <bool kTanh>
__device__ __forceinline__ uint32_t gelu_pair(float lo, float hi) {
  if constexpr (kTanh) {
    return gelu2_tanh_of_f16(lo, hi);
  } else {
    return pack_half2(gelu_of_f16(lo), gelu_of_f16(hi));
  }
}

// acc[NT][4] += GELU(c) * B, with c = one ffn chunk's fp32 accumulators (16 x 8 CT). The GELU of
// n8 tiles 2s, 2s+1 (C layout) is the A fragment of k step s (A layout), so the activation never
// leaves registers; it is formed right before its k step to keep few fragments live.
template <int NT, int CT, int SB, bool kTanh = false>
__device__ __forceinline__ void gelu_mma(float (&acc)[NT][4], const float (&c)[CT][4], uint32_t b_addr) {
#pragma unroll
  for (int ks = 0; ks < CT / 2; ++ks) {
    uint32_t a[4];
    a[0] = gelu_pair<kTanh>(c[2 * ks][0], c[2 * ks][1]);
    a[1] = gelu_pair<kTanh>(c[2 * ks][2], c[2 * ks][3]);
    a[2] = gelu_pair<kTanh>(c[2 * ks + 1][0], c[2 * ks + 1][1]);
    a[3] = gelu_pair<kTanh>(c[2 * ks + 1][2], c[2 * ks + 1][3]);
#pragma unroll
    for (int pp = 0; pp < NT / 2; ++pp) {
      uint32_t b[4];
      ldsm_x4(b, b_addr + uint32_t(pp * 16 * SB * 2 + ks * 32));
      mma_16816(acc[2 * pp], a, b[0], b[1]);
      mma_16816(acc[2 * pp + 1], a, b[2], b[3]);
    }
  }
}

// Warpgroup forms of mma_smem_a and gelu_mma (wgmma.cuh; sm_90a): the four warps of a group
// each supply their own 16 rows' A fragments, B (16 k x N per step) comes from the core-matrix
// layout at b_addr (stride byte offset sbo = 16 x the matrix's K), and the group's 64 x N product
// accumulates into the same C layout as mma_16816's. All A fragments are formed before one
// wgmma.fence (a fragment written after the fence would need another), then the k steps issue
// back to back and the group waits for them.
// KB: k steps per batch of A fragments (KS, or fewer where registers are short: the registers of
// a batch stay reserved until its products complete, so each batch waits for its own).
template <int N, int KS, int KB = KS>
__device__ __forceinline__ void wg_smem_a(float (&acc)[N / 8][4], uint32_t a_addr, uint32_t b_addr, uint32_t sbo) {
  static_assert(KS % KB == 0, "whole batches");
#pragma unroll
  for (int k0 = 0; k0 < KS; k0 += KB) {
    uint32_t a[KB][4];
#pragma unroll
    for (int ks = 0; ks < KB; ++ks) ldsm_x4(a[ks], a_addr + (k0 + ks) * 32);
    wgmma::fence_operands(acc);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < KB; ++ks) {
      wgmma::mma_rs<N>(acc, a[ks], wgmma::desc_kmajor(b_addr + (k0 + ks) * 256, 128, sbo));
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(acc);
  }
}

// acc += GELU(c) B, issued and committed but not waited for: the caller waits (wgmma::wait) and
// then calls keep_fragments(a) and fence_operands(acc). `a` receives the GELU's A fragments.
template <int N, int CT, bool kTanh>
__device__ __forceinline__ void wg_gelu_issue(float (&acc)[N / 8][4], const float (&c)[CT][4],
                                              uint32_t (&a)[CT / 2][4], uint32_t b_addr, uint32_t sbo) {
#pragma unroll
  for (int ks = 0; ks < CT / 2; ++ks) {
    a[ks][0] = gelu_pair<kTanh>(c[2 * ks][0], c[2 * ks][1]);
    a[ks][1] = gelu_pair<kTanh>(c[2 * ks][2], c[2 * ks][3]);
    a[ks][2] = gelu_pair<kTanh>(c[2 * ks + 1][0], c[2 * ks + 1][1]);
    a[ks][3] = gelu_pair<kTanh>(c[2 * ks + 1][2], c[2 * ks + 1][3]);
  }
  wgmma::fence_operands(acc);
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < CT / 2; ++ks) {
    wgmma::mma_rs<N>(acc, a[ks], wgmma::desc_kmajor(b_addr + ks * 256, 128, sbo));
  }
  wgmma::commit();
}

// LayerNorm statistics of the thread's two rows (g, g+8) across the quad (quad_stats.cuh): one pass
// in the exact kernels; the padded kernels take two passes over the rows shifted by their first
// element and leave out the n8 tiles past D (D % 8 == 0: a tile is wholly in or out), so padding
// needs no correction. The normalised value is ln_value(acc, ...) in both.
using quad::RowStats;
using quad::ln_value;

template <int NT, bool kPad>
__device__ __forceinline__ RowStats row_stats(const float (&acc)[NT][4], int D, float eps) {
  if constexpr (!kPad) {
    return quad::row_stats<NT>(acc, eps);
  } else {
    const int leader = int(threadIdx.x & 31u) & ~3;
    const int nt = D / 8;
    RowStats st;
    float sh0 = __shfl_sync(0xffffffffu, acc[0][0], leader);
    float sh1 = __shfl_sync(0xffffffffu, acc[0][2], leader);
    float s0 = 0.f, s1 = 0.f, q0 = 0.f, q1 = 0.f;
    // Padded kernels: two passes (mean, then the centred sum of squares), tiles past D masked
    // with selects (branches there spilled pad256, and so did the one pass at 255 registers);
    // the variance loop gets its own copy of the tile count and a quad broadcast of the shift
    // (with the same registers, the compiler kept the sum loop's predicates and every shifted
    // value alive for the second loop).
    const int nt_v = __shfl_sync(0xffffffffu, nt, leader);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const bool in = j < nt;
      s0 += in ? (acc[j][0] - sh0) + (acc[j][1] - sh0) : 0.f;
      s1 += in ? (acc[j][2] - sh1) + (acc[j][3] - sh1) : 0.f;
    }
    quad_sum(s0, s1);
    const float m0 = s0 / float(D), m1 = s1 / float(D);
    sh0 = __shfl_sync(0xffffffffu, sh0, leader);
    sh1 = __shfl_sync(0xffffffffu, sh1, leader);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const bool in = j < nt_v;
      const float a = (acc[j][0] - sh0) - m0, b = (acc[j][1] - sh0) - m0;
      const float c = (acc[j][2] - sh1) - m1, d = (acc[j][3] - sh1) - m1;
      q0 += in ? a * a + b * b : 0.f;
      q1 += in ? c * c + d * d : 0.f;
    }
    quad_sum(q0, q1);
    st.rstd[0] = rsqrtf(q0 / float(D) + eps);
    st.rstd[1] = rsqrtf(q1 / float(D) + eps);
    st.nmr[0] = __shfl_sync(0xffffffffu, -m0 * st.rstd[0], leader);
    st.nmr[1] = __shfl_sync(0xffffffffu, -m1 * st.rstd[1], leader);
    // The shift through a quad broadcast, as in quad::row_stats.
    st.shift[0] = __shfl_sync(0xffffffffu, sh0, leader);
    st.shift[1] = __shfl_sync(0xffffffffu, sh1, leader);
    return st;
  }
}

// Where the tail writes the thread's two rows r0 (= row g of its block) and r1 (= g + 8): the rows
// themselves (padded layout: rows past their sequence's length get zeros), or row_dst (packed
// layout: rows with row_dst < 0 are not written). 32-bit division (rows < 2^31, checked at launch):
// the 64-bit one is a call, and a call with the residual row live spills it.
struct TailRows {
  int64_t dst[2];
  bool write[2];  // the row is written
  bool valid[2];  // ... with its LayerNorm (else zeros)
};
__device__ __forceinline__ TailRows tail_rows(const PostAttnParams& p, int64_t r0, int64_t r1) {
  const uint32_t u0 = uint32_t(r0), u1 = uint32_t(r1);
  TailRows d{{r0, r1}, {r0 < p.rows, r1 < p.rows}, {r0 < p.rows, r1 < p.rows}};
  if (p.row_dst != nullptr) {
    d.dst[0] = d.write[0] ? p.row_dst[u0] : -1;
    d.dst[1] = d.write[1] ? p.row_dst[u1] : -1;
    d.write[0] = d.valid[0] = d.dst[0] >= 0;
    d.write[1] = d.valid[1] = d.dst[1] >= 0;
  } else if (p.lengths != nullptr) {
    const uint32_t S = uint32_t(p.S);
    d.valid[0] = d.write[0] && int(u0 % S) < p.lengths[u0 / S];
    d.valid[1] = d.write[1] && int(u1 % S) < p.lengths[u1 / S];
  }
  return d;
}

// LN(acc; w, b) as fp16 into the warp tile (row stride SA halves); padded columns get w = b = 0.
template <int NT, int SA>
__device__ __forceinline__ void store_ln_f16(const float (&acc)[NT][4], const RowStats& st, const float* w,
                                             const float* b, uint32_t tile, int g, int t) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int col = 8 * j + 2 * t;
    const float2 w2 = *reinterpret_cast<const float2*>(w + col);
    const float2 b2 = *reinterpret_cast<const float2*>(b + col);
    st_shared_u32(tile + uint32_t(g * SA + col) * 2u,
                  pack_half2(ln_value(acc[j][0], st, 0, w2.x, b2.x), ln_value(acc[j][1], st, 0, w2.y, b2.y)));
    st_shared_u32(tile + uint32_t((g + 8) * SA + col) * 2u,
                  pack_half2(ln_value(acc[j][2], st, 1, w2.x, b2.x), ln_value(acc[j][3], st, 1, w2.y, b2.y)));
  }
}

// ---- the kernel ----------------------------------------------------------------------------------
// nbuf: warp tiles per warp (2: the next row block's o is loaded during this one; resident only).
// kTanh: the ffn's GELU in its tanh form (gelu2_tanh_of_f16); instantiated for the exact resident
// kernels (d64, d128) only.
// kWg (exact resident kernels, sm_90a): the three products as warpgroup MMAs (wgmma.cuh). The
// weights are staged in the core-matrix layout and read by the tensor cores once per group of 4
// warps instead of by every warp's ldmatrix (~70% of the row-per-warp kernel's shared-memory
// wavefronts at case 6); a group takes 4 consecutive row blocks (64 rows) at a time, its warps
// run the chain in step (every wgmma is a group-wide instruction) and rows past the end are
// computed as zeros and not stored. Everything else (LayerNorms, GELU, outputs) is the
// row-per-warp code: the accumulator layout is the same.
template <int DP, int FP, bool kPad, bool kTanh = false, bool kWg = false>
__global__ void __launch_bounds__(max_warps<DP, FP, kPad>() * 32, 1)
    post_attn_kernel(const PostAttnParams p, int nbuf) {
  using T = Tile<DP, FP>;
  static_assert(!kWg || (T::kResident && !kPad), "warpgroup kernels: exact resident shapes");
  constexpr int NT = T::kNT;
  constexpr int NC = T::kNC;
  constexpr int SA = T::kSA;
  extern __shared__ __align__(128) unsigned char smem[];

  const int D = kPad ? p.D : DP;
  const int F = kPad ? p.F : FP;
  const int64_t rows = p.rows;
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, nw = int(blockDim.x) >> 5;
  const int g = lane >> 2, t = lane & 3;

  // Small vectors in fp32, zero past D / F.
  float* v_bo = reinterpret_cast<float*>(smem);
  float* v_ln2w = v_bo + DP;
  float* v_ln2b = v_ln2w + DP;
  float* v_bout = v_ln2b + DP;
  float* v_lnw = v_bout + DP;
  float* v_lnb = v_lnw + DP;
  float* v_bin = v_lnb + DP;
  for (int i = tid; i < DP; i += int(blockDim.x)) {
    const bool in = i < D;
    v_bo[i] = in ? p.b_o[i] : 0.f;
    v_ln2w[i] = in ? p.ln2_w[i] : 0.f;
    v_ln2b[i] = in ? p.ln2_b[i] : 0.f;
    v_bout[i] = in ? p.b_out[i] : 0.f;
    v_lnw[i] = in ? p.ln_next_w[i] : 0.f;
    v_lnb[i] = in ? p.ln_next_b[i] : 0.f;
  }
  for (int i = tid; i < FP; i += int(blockDim.x)) v_bin[i] = i < F ? __half2float(p.b_in[i]) : 0.f;

  const uint32_t s_w = smem_u32(smem) + uint32_t(T::kVecBytes);
  const uint32_t s_tiles = s_w + uint32_t(T::kWeightBytes) + uint32_t(warp * nbuf) * uint32_t(T::kWarpTileBytes);
  // ldmatrix lane addresses: A (16 x 16 at k0): matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15);
  // B (two n8 tiles x k16): matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
  const uint32_t a_lane = uint32_t(((lane & 7) + ((lane >> 3) & 1) * 8) * SA + (lane >> 4) * 8) * 2u;
  const int b_row = (lane & 7) + (lane >> 4) * 8;
  const uint32_t b_col = uint32_t((lane >> 3) & 1) * 16u;

  // The o rows [row0, row0 + 16) of this warp into a tile (zeros past `rows` and past D).
  auto load_o = [&](uint32_t tile, int64_t row0) {
    constexpr int kChunks = DP / 8;
#pragma unroll
    for (int i = lane; i < kWarpRows * kChunks; i += 32) {
      const int r = i / kChunks, c = (i - r * kChunks) * 8;
      const bool valid = row0 + r < rows && (!kPad || c < D);
      cp_async_16(tile + uint32_t(r * SA + c) * 2u, valid ? p.o + (row0 + r) * D + c : p.o, valid);
    }
  };
  // The residual is accumulated relative to its row's first element c = x_in[r][0]: acc = x_in - c
  // for the thread's fragment positions (zeros past `rows` / D), and x_out = acc + c. Each k step
  // of the mma adds into acc and rounds to acc's ulp: relative to c that is the ulp of the row's
  // spread, not of its magnitude (|x| ~ 1e4 would otherwise lose ~1e-3 per k step). LayerNorm is
  // shift-invariant, so the chain's LayerNorms read acc as it is. The bias is added after
  // out_proj: loaded here, it would sit in registers next to the x loads in flight.
  auto x_src = [&](int64_t r) { return residual_row(p, r); };
  auto row_offsets = [&](int64_t s0, int64_t s1, float& c0, float& c1) {
    c0 = s0 >= 0 ? p.x_in[s0 * D] : 0.f;
    c1 = s1 >= 0 ? p.x_in[s1 * D] : 0.f;
  };
  auto load_x = [&](float (&acc)[NT][4], int64_t row0, float& c0, float& c1) {
    const int64_t s0 = x_src(row0 + g), s1 = x_src(row0 + g + 8);
    row_offsets(s0, s1, c0, c1);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int col = 8 * j + 2 * t;
      const bool cok = !kPad || col < D;
      float2 x0 = make_float2(0.f, 0.f), x1 = x0;
      if (cok && s0 >= 0) x0 = *reinterpret_cast<const float2*>(p.x_in + s0 * D + col);
      if (cok && s1 >= 0) x1 = *reinterpret_cast<const float2*>(p.x_in + s1 * D + col);
      // Columns past D (padded kernels) hold -c: finite, and never normalised, stored or
      // multiplied by anything but the zero padding of the weights and LayerNorm parameters.
      acc[j][0] = x0.x - c0;
      acc[j][1] = x0.y - c0;
      acc[j][2] = x1.x - c1;
      acc[j][3] = x1.y - c1;
    }
  };
  // acc += bias (a [DP] fp32 vector in smem).
  auto add_bias = [&](float (&acc)[NT][4], const float* bias) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const float2 b = *reinterpret_cast<const float2*>(bias + 8 * j + 2 * t);
      acc[j][0] += b.x;
      acc[j][1] += b.y;
      acc[j][2] += b.x;
      acc[j][3] += b.y;
    }
  };
  // The chunk accumulator starts at zero and gets the ffn bias of chunk c after its product:
  // started from the bias (the same value in the slots of rows g and g + 8), ptxas kept the
  // loop-carried accumulator outside the mma's register quads and copied it in and out on every
  // k step (2 MOVs per HMMA in the chain's hottest loop, ncu source counters).
  auto zero_ffn = [&](float (&fa)[NC / 8][4]) {
#pragma unroll
    for (int j = 0; j < NC / 8; ++j) fa[j][0] = fa[j][1] = fa[j][2] = fa[j][3] = 0.f;
  };
  auto bias_ffn = [&](float (&fa)[NC / 8][4], int c) {
#pragma unroll
    for (int j = 0; j < NC / 8; ++j) {
      const float2 b = *reinterpret_cast<const float2*>(v_bin + c * NC + 8 * j + 2 * t);
      fa[j][0] += b.x;
      fa[j][1] += b.y;
      fa[j][2] += b.x;
      fa[j][3] += b.y;
    }
  };
  // acc += bf, then the outputs of the row block. The tile is free (h was last read by ffn_in).
  // c0, c1: the rows' offsets from load_x, kept in two registers: read again here, they cost a
  // dependent global load (two with x_rows) at the end of every row block (ncu: 3% of the stall
  // samples at case 6). x_out may be x_in: every lane has read its x before any lane writes.
  auto epilogue = [&](float (&acc)[NT][4], uint32_t tile, int64_t row0, float c0, float c1) {
    const int64_t r0 = row0 + g, r1 = row0 + g + 8;
    add_bias(acc, v_bout);
    if (!p.tail) {
      __syncwarp();
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int col = 8 * j + 2 * t;
        if (kPad && col >= D) continue;
        if (r0 < rows)
          st_global_f32x2(p.x_out + r0 * D + col, acc[j][0] + c0, acc[j][1] + c0);
        if (r1 < rows)
          st_global_f32x2(p.x_out + r1 * D + col, acc[j][2] + c1, acc[j][3] + c1);
      }
      const RowStats st = row_stats<NT, kPad>(acc, D, p.eps);
      __syncwarp();
      store_ln_f16<NT, SA>(acc, st, v_lnw, v_lnb, tile, g, t);
      __syncwarp();
      constexpr int kChunks = DP / 8;
#pragma unroll
      for (int i = lane; i < kWarpRows * kChunks; i += 32) {
        const int r = i / kChunks, c = (i - r * kChunks) * 8;
        if (row0 + r < rows && (!kPad || c < D)) {
          st_global_b32x4(p.h_out + (row0 + r) * D + c, ld_shared_v4(tile + uint32_t(r * SA + c) * 2u));
        }
      }
    } else {
      const RowStats st = row_stats<NT, kPad>(acc, D, p.eps);
      const TailRows d = tail_rows(p, r0, r1);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int col = 8 * j + 2 * t;
        if (kPad && col >= D) continue;
        const float2 w = *reinterpret_cast<const float2*>(v_lnw + col);
        const float2 b = *reinterpret_cast<const float2*>(v_lnb + col);
        if (d.write[0]) {
          const float2 v = d.valid[0] ? make_float2(ln_value(acc[j][0], st, 0, w.x, b.x), ln_value(acc[j][1], st, 0, w.y, b.y))
                                      : make_float2(0.f, 0.f);
          st_global_f32x2(p.y + d.dst[0] * D + col, v.x, v.y);
        }
        if (d.write[1]) {
          const float2 v = d.valid[1] ? make_float2(ln_value(acc[j][2], st, 1, w.x, b.x), ln_value(acc[j][3], st, 1, w.y, b.y))
                                      : make_float2(0.f, 0.f);
          st_global_f32x2(p.y + d.dst[1] * D + col, v.x, v.y);
        }
      }
    }
  };

  if constexpr (T::kResident) {
    // Weights once per CTA, then every warp runs its own row blocks: blocks are dealt warp-major
    // (warp w of CTA b takes w * grid + b, then strides by grid * warps) so that a partly filled
    // last round spreads over CTAs instead of piling onto one.
    const uint32_t s_wo = s_w;
    const uint32_t s_wi = s_wo + uint32_t(DP * SA) * 2u;
    const uint32_t s_wf = s_wi + uint32_t(FP * SA) * 2u;
    if constexpr (kWg) {
      copy_blocked<DP, DP>(s_wo, p.w_o, D, D, D, tid, int(blockDim.x));
      copy_blocked<FP, DP>(s_wi, p.w_in, D, F, D, tid, int(blockDim.x));
      copy_blocked<DP, FP>(s_wf, p.w_out, F, D, F, tid, int(blockDim.x));
    } else {
      copy_panel<DP, DP, SA>(s_wo, p.w_o, D, D, D, tid, int(blockDim.x));
      copy_panel<FP, DP, SA>(s_wi, p.w_in, D, F, D, tid, int(blockDim.x));
      copy_panel<DP, FP, T::kSWf>(s_wf, p.w_out, F, D, F, tid, int(blockDim.x));
    }
    pdl_launch_dependents();
    pdl_wait();  // launch_pdl: vectors and weights are staged before the previous kernel ends
    const int64_t nblk = (rows + kWarpRows - 1) / kWarpRows;
    // Row blocks of 16: warp-major deal (row per warp), or whole groups of 4 consecutive blocks
    // per warpgroup (kWg: blk - wq = 4 x the group's block, the loop test is the same for the
    // group's 4 warps, and blocks past nblk run on zeros).
    const int wq = kWg ? (warp & 3) : 0;
    const int64_t stride = int64_t(gridDim.x) * nw;
    int64_t blk = kWg ? (int64_t(warp >> 2) * gridDim.x + blockIdx.x) * 4 + wq : int64_t(warp) * gridDim.x + blockIdx.x;
    const int64_t lim = kWg ? (nblk + 3) / 4 * 4 : nblk;
    auto live = [&](int64_t b) { return b - wq < lim; };
    if (live(blk)) load_o(s_tiles, blk * kWarpRows);
    cp_async_commit();
    cp_async_wait_all();
    if constexpr (kWg) wgmma::fence_proxy_async_shared();  // cp.async weights -> the tensor cores' reads
    __syncthreads();  // weights and vectors visible to every warp; no CTA barrier after this

    int cur = 0;
    bool first = true;
#pragma unroll 1
    for (; live(blk); blk += stride) {
      const int64_t row0 = blk * kWarpRows;
      const uint32_t tile = s_tiles + uint32_t(cur) * uint32_t(T::kWarpTileBytes);
      if (nbuf == 1 && !first) {
        load_o(tile, row0);
        cp_async_commit();
      }
      float acc[NT][4];
      float c0, c1;
      load_x(acc, row0, c0, c1);
      cp_async_wait_all();
      __syncwarp();
      if (nbuf == 2) {
        const int64_t next = blk + stride;
        if (live(next)) {
          load_o(s_tiles + uint32_t(cur ^ 1) * uint32_t(T::kWarpTileBytes), next * kWarpRows);
          // x of the next block toward L2 (its register load cannot start before this block ends).
          const int64_t left = rows - next * kWarpRows;
          const int64_t nrows = left < kWarpRows ? left : kWarpRows;
          if (p.x_rows == nullptr) {
            const char* xb = reinterpret_cast<const char*>(p.x_in + next * kWarpRows * D);
            const int lines = int((nrows * D * 4 + 127) / 128);
            for (int l = lane; l < lines; l += 32) prefetch_l2(xb + l * 128);
          } else {
            const int per_row = (D * 4 + 127) / 128;
            for (int l = lane; l < int(nrows) * per_row; l += 32) {
              const int64_t sr = x_src(next * kWarpRows + l / per_row);
              if (sr >= 0) prefetch_l2(reinterpret_cast<const char*>(p.x_in + sr * D) + (l % per_row) * 128);
            }
          }
        }
        cp_async_commit();
      }
      // out_proj + residual
      if constexpr (kWg) {
        wg_smem_a<DP, DP / 16>(acc, tile + a_lane, s_wo, uint32_t(DP) * 16u);
      } else {
        mma_smem_a<NT, DP / 16, SA>(acc, tile + a_lane, s_wo + uint32_t(b_row * SA) * 2u + b_col);
      }
      // ln2 -> h (fp16) over the o tile
      {
        add_bias(acc, v_bo);
        const RowStats st = row_stats<NT, kPad>(acc, D, p.eps);
        __syncwarp();
        store_ln_f16<NT, SA>(acc, st, v_ln2w, v_ln2b, tile, g, t);
        __syncwarp();
      }
      // ffn_in + GELU + ffn_out, chunk by chunk
      if constexpr (kWg) {
        // A fragments of ffn_in in batches at D = 128: the residual, the chunk, the GELU
        // fragments in flight and 8 k steps of A at once spill at 168 registers.
        constexpr int KB = DP >= 128 ? DP / 32 : DP / 16;
        auto ffn_in = [&](float (&fa)[NC / 8][4], int c) {
          zero_ffn(fa);
          wg_smem_a<NC, DP / 16, KB>(fa, tile + a_lane, s_wi + uint32_t(c * NC / 8) * uint32_t(DP / 8) * 128u,
                                     uint32_t(DP) * 16u);
          bias_ffn(fa, c);
        };
        auto ffn_out = [&](const float (&fa)[NC / 8][4], uint32_t (&ga)[NC / 16][4], int c) {
          wg_gelu_issue<DP, NC / 8, kTanh>(acc, fa, ga, s_wf + uint32_t(c * NC / 8) * 128u, uint32_t(FP) * 16u);
        };
        if constexpr (kTanh) {
          // ffn_out of chunk c runs while ffn_in of chunk c + 1 is issued (its first wait covers
          // both). Not with the erf GELU: the chunk carried across iterations spills it at 168.
          float fa[NC / 8][4];
          ffn_in(fa, 0);
#pragma unroll 1
          for (int c = 0; c < FP / NC; ++c) {
            uint32_t ga[NC / 16][4];
            ffn_out(fa, ga, c);
            if (c + 1 < FP / NC) {
              ffn_in(fa, c + 1);  // its waits also complete this chunk's ffn_out
            } else {
              wgmma::wait<0>();
            }
            wgmma::keep_fragments(ga);
            wgmma::fence_operands(acc);
          }
        } else {
#pragma unroll 1
          for (int c = 0; c < FP / NC; ++c) {
            float fa[NC / 8][4];
            uint32_t ga[NC / 16][4];
            ffn_in(fa, c);
            ffn_out(fa, ga, c);
            wgmma::wait<0>();
            wgmma::keep_fragments(ga);
            wgmma::fence_operands(acc);
          }
        }
      } else {
#pragma unroll 1
        for (int c = 0; c < FP / NC; ++c) {
          float fa[NC / 8][4];
          zero_ffn(fa);
          mma_smem_a<NC / 8, DP / 16, SA>(fa, tile + a_lane, s_wi + uint32_t((c * NC + b_row) * SA) * 2u + b_col);
          bias_ffn(fa, c);
          gelu_mma<NT, NC / 8, T::kSWf, kTanh>(acc, fa, s_wf + uint32_t(b_row * T::kSWf + c * NC) * 2u + b_col);
        }
      }
      epilogue(acc, tile, row0, c0, c1);
      __syncwarp();  // every lane done with the tile before it is refilled
      first = false;
      if (nbuf == 2) cur ^= 1;
    }
    cp_async_wait_all();
  } else {
    // Streamed weights: stage q of a row block's sequence is
    //   q <  DP/KC:  Wo[:, q KC : (q+1) KC]                 -> [DP][KC + 8]
    //   else, r = q - DP/KC, chunk c = r / 2:  even r: Wi[c NC : (c+1) NC, :] -> [NC][DP + 8]
    //                                          odd r:  Wf[:, c NC : (c+1) NC] -> [DP][NC + 8]
    // Two buffers; step j waits for stage j, a CTA barrier frees the other buffer (everyone has
    // finished stage j - 1), then stage j + 1 (wrapping into the next row block) is issued and
    // stage j computed while it loads.
    constexpr int KC = T::kKC;
    constexpr int kPanels = DP / KC;
    auto load_stage = [&](uint32_t buf, int q) {
      if (q < kPanels) {
        copy_panel<DP, KC, KC + 8>(buf, p.w_o + q * KC, D, D, D - q * KC, tid, int(blockDim.x));
      } else {
        const int r = q - kPanels, c = r >> 1;
        if ((r & 1) == 0) {
          copy_panel<NC, DP, DP + 8>(buf, p.w_in + int64_t(c) * NC * D, D, F - c * NC, D, tid, int(blockDim.x));
        } else {
          copy_panel<DP, NC, NC + 8>(buf, p.w_out + c * NC, F, D, F - c * NC, tid, int(blockDim.x));
        }
      }
    };
    int step = 0;
    auto next_stage = [&]() -> uint32_t {
      cp_async_wait_all();
      __syncthreads();
      load_stage(s_w + uint32_t((step + 1) & 1) * uint32_t(T::kStageBytes), (step + 1) % T::kStages);
      cp_async_commit();
      const uint32_t buf = s_w + uint32_t(step & 1) * uint32_t(T::kStageBytes);
      ++step;
      return buf;
    };

    __syncthreads();  // the vectors above are read by load_x before the first stage barrier
    const int64_t bm = int64_t(nw) * kWarpRows;
    const int64_t nblk = (rows + bm - 1) / bm;
    load_stage(s_w, 0);
    cp_async_commit();
    pdl_launch_dependents();
    pdl_wait();  // launch_pdl: vectors and the first weight panel are staged before the previous kernel ends
    const uint32_t tile = s_tiles;
#pragma unroll 1
    for (int64_t blk = blockIdx.x; blk < nblk; blk += gridDim.x) {
      // Every warp of the CTA runs every stage (barriers), also with rows past the end (zeros).
      const int64_t row0 = blk * bm + int64_t(warp) * kWarpRows;
      load_o(tile, row0);
      cp_async_commit();
      float acc[NT][4];
      float c0, c1;
      load_x(acc, row0, c0, c1);
#pragma unroll 1
      for (int q = 0; q < kPanels; ++q) {
        const uint32_t buf = next_stage();
        mma_smem_a<NT, KC / 16, KC + 8>(acc, tile + a_lane + uint32_t(q * KC * 2), buf + uint32_t(b_row * (KC + 8)) * 2u + b_col);
      }
      {
        add_bias(acc, v_bo);
        const RowStats st = row_stats<NT, kPad>(acc, D, p.eps);
        __syncwarp();
        store_ln_f16<NT, SA>(acc, st, v_ln2w, v_ln2b, tile, g, t);
        __syncwarp();
      }
#pragma unroll 1
      for (int c = 0; c < FP / NC; ++c) {
        float fa[NC / 8][4];
        zero_ffn(fa);
        const uint32_t wi = next_stage();
        mma_smem_a<NC / 8, DP / 16, DP + 8>(fa, tile + a_lane, wi + uint32_t(b_row * (DP + 8)) * 2u + b_col);
        bias_ffn(fa, c);
        const uint32_t wf = next_stage();
        gelu_mma<NT, NC / 8, NC + 8, kTanh>(acc, fa, wf + uint32_t(b_row * (NC + 8)) * 2u + b_col);
      }
      epilogue(acc, tile, row0, c0, c1);
      __syncwarp();
    }
    cp_async_wait_all();
  }
}

// ---- column-split kernel (few rows) --------------------------------------------------------------
// A group of W warps shares one 16-row block: warp w owns residual columns [w D/W, (w+1) D/W) of
// out_proj and ffn_out and ffn columns [w F/W, (w+1) F/W) of ffn_in, so one row block's chain is
// W times shorter than in the row-per-warp kernels, where a warp runs all D + F + D columns of its
// 16 rows alone. The products read their A operand from the group's shared tiles (o, then h
// over it; the GELU output f in its own tile), the LayerNorm statistics are combined across the
// group's warps through shared memory (Chan's pairwise update of per-warp means and centred sums
// of squares: no second pass over the row), and the residual of the warp's columns stays in its
// registers from out_proj to the output. G = blockDim / (32 W) groups per CTA work on different
// row blocks with their own named barriers (ids 1..G); the weights are resident in shared
// memory for the CTA's lifetime (exact D = F = 64 or 128) and the grid is persistent.
// kRegW: one group of W = 8 warps per CTA holds its warps' weight columns as mma B fragments in
// registers instead (3 * 2 * (D/8W) * (D/16) registers: 96 at D = 128), loaded straight from L2
// before pdl_wait: no shared-memory weights, so the CTA needs ~14 KB of shared memory and can
// start while the previous kernel still occupies the SM, its weight loads overlapping that
// kernel (launch_pdl), and no CTA waits for 96 KB of staging before its first product.
template <int DP, int FP, int W, bool kRegW = false, bool kQkv = false>
struct SplitTile {
  static constexpr int kNTW = DP / (8 * W);      // residual n8 tiles per warp
  static constexpr int kNTF = FP / (8 * W);      // ffn n8 tiles per warp
  static constexpr int kNTQ = 3 * DP / (8 * W);  // kQkv: qkv n8 tiles per warp
  static constexpr int kSA = DP + 8;             // o / h tile and [*, D] weight rows (halves)
  static constexpr int kSF = FP + 8;             // f tile and Wf rows (halves)
  static constexpr size_t kVecBytes = round_up(size_t(6 * DP + FP + (kQkv ? 3 * DP : 0)) * 4, 128);
  static constexpr size_t kWeightBytes =
      round_up((kRegW ? 0 : 2 * (size_t(DP) * kSA + size_t(FP) * kSA + size_t(DP) * kSF)) +
                   (kQkv ? 2 * size_t(3 * DP) * kSA : 0),
               128);
  static constexpr size_t kStatBytes = size_t(W) * kWarpRows * 8;  // float2 (mean, M2) per warp and row
  static constexpr size_t kGroupBytes = round_up(2 * kWarpRows * (size_t(kSA) + kSF) + 2 * kStatBytes, 128);
  static_assert(kNTW >= 1 && kNTF >= 1 && DP % (8 * W) == 0 && FP % (8 * W) == 0, "whole n8 tiles per warp");
  static_assert(DP % 16 == 0 && FP % 16 == 0, "mma k16 steps");
  static_assert(!kQkv || (DP == FP && 3 * DP % (8 * W) == 0), "kQkv: the next h in the f tile, whole qkv n8 tiles");
};
constexpr int kSplitMaxWarps = 16;  // launch bound: 512 threads, 128 registers

template <int DP, int FP, int W, bool kRegW, bool kQkv = false>
constexpr size_t split_smem_bytes(int groups) {
  using T = SplitTile<DP, FP, W, kRegW, kQkv>;
  return T::kVecBytes + T::kWeightBytes + size_t(groups) * T::kGroupBytes;
}

__device__ __forceinline__ void group_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// acc[NT][4] += A(16 x 16 KS from a_addr) * B(rows n of a [N, K] smem matrix, stride SB halves),
// NT n8 tiles (odd NT: the last through ldmatrix .x2). Unrolled: few tiles per warp.
template <int NT, int KS, int SB>
__device__ __forceinline__ void mma_cols(float (&acc)[NT][4], uint32_t a_addr, uint32_t b_addr) {
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    uint32_t a[4];
    ldsm_x4(a, a_addr + ks * 32);
#pragma unroll
    for (int pp = 0; pp < NT / 2; ++pp) {
      uint32_t b[4];
      ldsm_x4(b, b_addr + uint32_t(pp * 16 * SB * 2 + ks * 32));
      mma_16816(acc[2 * pp], a, b[0], b[1]);
      mma_16816(acc[2 * pp + 1], a, b[2], b[3]);
    }
    if constexpr (NT % 2 == 1) {
      uint32_t b0, b1;
      ldsm_x2(b0, b1, b_addr + uint32_t((NT - 1) * 8 * SB * 2 + ks * 32));
      mma_16816(acc[NT - 1], a, b0, b1);
    }
  }
}

// acc[NT][4] += A(16 x 16 KS from a_addr) * B from registers (b[j][ks] = the n8 tile j's fragment
// of k step ks, as load_b_frags reads it).
template <int NT, int KS>
__device__ __forceinline__ void mma_regs(float (&acc)[NT][4], uint32_t a_addr, const uint32_t (&b)[NT][KS][2]) {
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    uint32_t a[4];
    ldsm_x4(a, a_addr + ks * 32);
#pragma unroll
    for (int j = 0; j < NT; ++j) mma_16816(acc[j], a, b[j][ks][0], b[j][ks][1]);
  }
}

// The mma B fragments of rows [n0, n0 + 8 NT) of a row-major [N, K] fp16 matrix (K contiguous):
// thread (g, t) of n8 tile j at k step ks holds W[n0 + 8j + g][16 ks + 2t, +1] and [.. + 8 ..].
template <int NT, int KS>
__device__ __forceinline__ void load_b_frags(uint32_t (&b)[NT][KS][2], const __half* w, int n0, int K, int g, int t) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const uint32_t* row = reinterpret_cast<const uint32_t*>(w + int64_t(n0 + 8 * j + g) * K);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      b[j][ks][0] = __ldg(row + ks * 8 + t);
      b[j][ks][1] = __ldg(row + ks * 8 + 4 + t);
    }
  }
}

// load_b_frags from a [N, K] shared-memory matrix (stride SB halves) through ldmatrix: b_addr is
// the warp's first row with the lane's ldmatrix row / column offset, as mma_cols takes it (odd NT:
// the last tile through ldmatrix .x2, as there).
template <int NT, int KS, int SB>
__device__ __forceinline__ void ldsm_b_frags(uint32_t (&b)[NT][KS][2], uint32_t b_addr) {
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
    for (int pp = 0; pp < NT / 2; ++pp) {
      uint32_t r[4];
      ldsm_x4(r, b_addr + uint32_t(pp * 16 * SB * 2 + ks * 32));
      b[2 * pp][ks][0] = r[0];
      b[2 * pp][ks][1] = r[1];
      b[2 * pp + 1][ks][0] = r[2];
      b[2 * pp + 1][ks][1] = r[3];
    }
    if constexpr (NT % 2 == 1) ldsm_x2(b[NT - 1][ks][0], b[NT - 1][ks][1], b_addr + uint32_t((NT - 1) * 8 * SB * 2 + ks * 32));
  }
}

// The attention chains' key / value region in bytes (after the group tiles): [S][D + 8] keys and
// values; the whole-model kernel also stages the next layer's W_o | W_in there ([D][D + 8] and
// [F][D + 8]), and its W_out ([D][F + 8]) in a region of its own after it (model_stage_bytes).
__host__ __device__ constexpr size_t attn_kv_bytes(int DP, int FP, int S, bool model) {
  const size_t kv = 2 * size_t(S) * size_t(DP + 8) * 2, w = model ? (size_t(DP) + size_t(FP)) * size_t(DP + 8) * 2 : 0;
  return ((kv > w ? kv : w) + 127) / 128 * 128;
}
__host__ __device__ constexpr size_t model_stage_bytes(int DP, int FP) { return (size_t(DP) * size_t(FP + 8) * 2 + 127) / 128 * 128; }

// LayerNorm statistics of rows g and g+8 over the group's W warps: each warp's mean and centred
// sum of squares over its 8 NT columns (quad reductions), published in `stats` ([W][16] float2),
// one group barrier, then combined (mean = mean of the warp means, M2 = sum of the warp M2 +
// n_w sum of squared deviations of the warp means). The residual is held relative to the row's
// first input element, so the values are of the row's spread, not its magnitude.
template <int NT, int W>
__device__ __forceinline__ void split_stats(const float (&acc)[NT][4], float2* stats, int w, int g, int t, int bar,
                                            int bar_threads, int D, float eps, float (&mean)[2], float (&rstd)[2]) {
  constexpr float kN = float(8 * NT);
  float s0 = 0.f, s1 = 0.f;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    s0 += acc[j][0] + acc[j][1];
    s1 += acc[j][2] + acc[j][3];
  }
  quad_sum(s0, s1);
  const float m0 = s0 / kN, m1 = s1 / kN;
  float q0 = 0.f, q1 = 0.f;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const float a = acc[j][0] - m0, b = acc[j][1] - m0, c = acc[j][2] - m1, d = acc[j][3] - m1;
    q0 += a * a + b * b;
    q1 += c * c + d * d;
  }
  quad_sum(q0, q1);
  if (t == 0) {
    stats[w * kWarpRows + g] = make_float2(m0, q0);
    stats[w * kWarpRows + g + 8] = make_float2(m1, q1);
  }
  group_sync(bar, bar_threads);
  float2 part0[W], part1[W];
  float sm0 = 0.f, sm1 = 0.f;
#pragma unroll
  for (int k = 0; k < W; ++k) {
    part0[k] = stats[k * kWarpRows + g];
    part1[k] = stats[k * kWarpRows + g + 8];
    sm0 += part0[k].x;
    sm1 += part1[k].x;
  }
  mean[0] = sm0 / float(W);
  mean[1] = sm1 / float(W);
  float M0 = 0.f, M1 = 0.f;
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const float d0 = part0[k].x - mean[0], d1 = part1[k].x - mean[1];
    M0 += part0[k].y + kN * d0 * d0;
    M1 += part1[k].y + kN * d1 * d1;
  }
  rstd[0] = rsqrtf(M0 / float(D) + eps);
  rstd[1] = rsqrtf(M1 / float(D) + eps);
}

// kQkv (non-tail, DP == FP): the next layer's QKV projection as a fourth product: the next
// layer's h goes into the group's f tile (free once every warp's ffn_out has read it: the stats
// barrier), then warp w computes qkv columns [w 3D/W, (w+1) 3D/W) from it with Wqkv resident in
// shared memory; h_out is written only when given.
//
// kHD > 0 (weights in registers, W = 8): the layer's attention in front (PostAttnParams::qkv_in,
// head_dim kHD). The grid is made of clusters of S / 16 CTAs, one sequence per cluster at a time
// and one row block per CTA (its cluster rank = its query tile). Per block: the tile's q rows and
// the keys / values it sees (causal: up to its last row; never past the length, rows past it
// zero-filled) are staged in shared memory; warp w runs heads w, w + 8, .. with tile_attention_head
// (o written over q, so the tile then holds o as the other variants load it), rows past the
// length set to 0; then the chain as below. With kQkv the next layer's qkv may overwrite this
// layer's: each CTA arrives on the cluster barrier once its keys / values are staged and waits on
// it before its first qkv_out store.
// kFront (with kHD and kQkv): the layer's ln1 and QKV projection before the attention, from the
// block's residual rows already in registers: LayerNorm statistics across the group (as ln2's),
// h into the tile, q | k | v of the block's rows by Wqkv_front (staged where Wqkv is, before the
// predecessor ends) stored to qkv_front; one cluster barrier (every CTA's rows written and
// visible) before the attention's staging reads them. Wqkv (the next layer's) then replaces
// Wqkv_front in shared memory during the attention, and Wqkv_front returns at the end of a block
// that has a successor.
// kModel (with kFront; PostAttnModelParams): the whole forward, each block's L layers as L passes
// of the loop on the same CTAs: the front in layer 0 only, the residual kept in acc between passes
// (x_out not written), one cluster barrier after each pass's q | k | v stores, the last layer the
// tail. The weights a pass keeps in registers come from shared memory (cp.async, then ldmatrix):
// per-thread global loads of the fragments, hidden behind the predecessor by programmatic launch in
// the per-layer kernels, would take the load pipe for microseconds per layer here. The bias and
// LayerNorm vectors are reloaded at the start of every pass after the first.
template <int DP, int FP, int W, bool kRegW, bool kQkv, int kHD, bool kFront = false, bool kModel = false>
__device__ __forceinline__ void split_chain(const PostAttnParams& p0, const PostAttnModelParams* mp = nullptr) {
  constexpr bool kAttn = kHD > 0;
  static_assert(!kAttn || (kRegW && W == 8), "attention in front: weights in registers, width 8");
  static_assert(!kFront || (kAttn && kQkv), "ln1 + QKV in front: with the attention and the next QKV");
  static_assert(!kModel || kFront, "the whole model: layer 0 with its ln1 + QKV in front");
  const PostAttnParams& p = p0;  // layer 0 (kModel) until the loop
  using T = SplitTile<DP, FP, W, kRegW, kQkv>;
  constexpr int NTW = T::kNTW, NTF = T::kNTF, NTQ = T::kNTQ, SA = T::kSA, SF = T::kSF;
  constexpr int CW = DP / W, FW = FP / W, QW = 3 * DP / W;  // residual / ffn / qkv columns per warp
  constexpr int D = DP;
  constexpr int kGroupThreads = W * 32;
  extern __shared__ __align__(128) unsigned char smem[];

  const int64_t rows = p.rows;
  const int tid = int(threadIdx.x), lane = tid & 31;
  const int groups = int(blockDim.x) / kGroupThreads;
  const int grp = tid / kGroupThreads, gtid = tid - grp * kGroupThreads, w = gtid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int bar = 1 + grp;  // named barrier of the group (0 is __syncthreads)

  float* v_bo = reinterpret_cast<float*>(smem);
  float* v_ln2w = v_bo + DP;
  float* v_ln2b = v_ln2w + DP;
  float* v_bout = v_ln2b + DP;
  float* v_lnw = v_bout + DP;
  float* v_lnb = v_lnw + DP;
  float* v_bin = v_lnb + DP;
  float* v_bq = v_bin + FP;  // kQkv: [3D]
  // The layer's bias and LayerNorm vectors into shared memory (kModel: again for every layer).
  auto load_vectors = [&](const PostAttnParams& q) {
    if constexpr (kModel) {
      // Again for every pass: W * 32 threads, D <= W * 32, every load issued before the first
      // store (one round trip; in the other kernels this runs before the programmatic wait).
      constexpr int NT = W * 32, NQ = (3 * DP + NT - 1) / NT;
      static_assert(DP <= NT && FP <= NT, "one vector element per thread");
      float vb[6] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, vi = 0.f, vq[NQ];
      if (tid < DP) {
        vb[0] = q.b_o[tid];
        vb[1] = q.ln2_w[tid];
        vb[2] = q.ln2_b[tid];
        vb[3] = q.b_out[tid];
        vb[4] = q.ln_next_w[tid];
        vb[5] = q.ln_next_b[tid];
      }
      if (tid < FP) vi = __half2float(q.b_in[tid]);
#pragma unroll
      for (int k = 0; k < NQ; ++k) vq[k] = q.b_qkv && tid + k * NT < 3 * DP ? __half2float(q.b_qkv[tid + k * NT]) : 0.f;
      if (tid < DP) {
        v_bo[tid] = vb[0];
        v_ln2w[tid] = vb[1];
        v_ln2b[tid] = vb[2];
        v_bout[tid] = vb[3];
        v_lnw[tid] = vb[4];
        v_lnb[tid] = vb[5];
      }
      if (tid < FP) v_bin[tid] = vi;
#pragma unroll
      for (int k = 0; k < NQ; ++k)
        if (q.b_qkv && tid + k * NT < 3 * DP) v_bq[tid + k * NT] = vq[k];
    } else {
      for (int i = tid; i < DP; i += int(blockDim.x)) {
        v_bo[i] = q.b_o[i];
        v_ln2w[i] = q.ln2_w[i];
        v_ln2b[i] = q.ln2_b[i];
        v_bout[i] = q.b_out[i];
        v_lnw[i] = q.ln_next_w[i];
        v_lnb[i] = q.ln_next_b[i];
      }
      for (int i = tid; i < FP; i += int(blockDim.x)) v_bin[i] = __half2float(q.b_in[i]);
      if constexpr (kQkv) {
        if (q.b_qkv) {
          for (int i = tid; i < 3 * DP; i += int(blockDim.x)) v_bq[i] = __half2float(q.b_qkv[i]);
        }
      }
    }
  };
  load_vectors(p);

  const uint32_t s_wo = smem_u32(smem) + uint32_t(T::kVecBytes);
  const uint32_t s_wi = s_wo + uint32_t(DP * SA) * 2u;
  const uint32_t s_wf = s_wi + uint32_t(FP * SA) * 2u;
  const uint32_t s_wq = kRegW ? s_wo : s_wf + uint32_t(DP * SF) * 2u;  // kQkv: [3D][SA]
  const uint32_t s_grp = smem_u32(smem) + uint32_t(T::kVecBytes + T::kWeightBytes + size_t(grp) * T::kGroupBytes);
  const uint32_t tile = s_grp;                                      // o, then h: [16][SA]
  const uint32_t ftile = tile + uint32_t(kWarpRows * SA) * 2u;      // f: [16][SF]
  float2* stats = reinterpret_cast<float2*>(smem + T::kVecBytes + T::kWeightBytes + size_t(grp) * T::kGroupBytes +
                                            2 * kWarpRows * (size_t(SA) + SF));
  float2* stats2 = stats + W * kWarpRows;
  // kAttn: keys and values of the cluster's sequence, [S][SA] each, after the (one) group's tiles.
  const uint32_t s_k = smem_u32(smem) + uint32_t(T::kVecBytes + T::kWeightBytes + T::kGroupBytes);
  const uint32_t s_v = s_k + uint32_t(p.S * SA) * 2u;
  // kModel: the next pass's W_o | W_in over the key / value region (free from the attention's end to
  // the next staging), its W_out after that region; ldmatrix'ed into the register fragments.
  const uint32_t s_next_wo = s_k, s_next_wi = s_k + uint32_t(DP * SA) * 2u;
  const uint32_t s_next_wf = s_k + uint32_t(attn_kv_bytes(DP, FP, p.S, kModel));

  // kRegW: this warp's weight columns as B fragments (empty arrays otherwise).
  uint32_t rwo[kRegW ? NTW : 1][kRegW ? DP / 16 : 1][2];
  uint32_t rwi[kRegW ? NTF : 1][kRegW ? DP / 16 : 1][2];
  uint32_t rwf[kRegW ? NTW : 1][kRegW ? FP / 16 : 1][2];
  if constexpr (kRegW) {
    load_b_frags<NTW, DP / 16>(rwo, p.w_o, w * CW, DP, g, t);
    load_b_frags<NTF, DP / 16>(rwi, p.w_in, w * FW, DP, g, t);
    load_b_frags<NTW, FP / 16>(rwf, p.w_out, w * CW, FP, g, t);
  } else {
    copy_panel<DP, DP, SA>(s_wo, p.w_o, D, D, D, tid, int(blockDim.x));
    copy_panel<FP, DP, SA>(s_wi, p.w_in, D, FP, D, tid, int(blockDim.x));
    copy_panel<DP, FP, SF>(s_wf, p.w_out, FP, D, FP, tid, int(blockDim.x));
  }
  if constexpr (kQkv) copy_panel<3 * DP, DP, SA>(s_wq, kFront ? p.w_qkv_front : p.w_qkv, D, 3 * D, D, tid, int(blockDim.x));
  pdl_launch_dependents();
  pdl_wait();  // launch_pdl: vectors and weights are staged before the previous kernel ends

  auto load_o = [&](int64_t row0) {
    constexpr int kChunks = DP / 8;
    for (int i = gtid; i < kWarpRows * kChunks; i += kGroupThreads) {
      const int r = i / kChunks, c = (i - r * kChunks) * 8;
      const bool valid = row0 + r < rows;
      cp_async_16(tile + uint32_t(r * SA + c) * 2u, valid ? p.o + (row0 + r) * D + c : p.o, valid);
    }
  };
  // Row blocks dealt group-major (group k of CTA b takes k * grid + b, then strides by
  // grid * groups), as the resident kernel deals them to warps.
  const int64_t nblk = (rows + kWarpRows - 1) / kWarpRows;
  const int64_t stride = int64_t(gridDim.x) * groups;
  int64_t blk = int64_t(grp) * gridDim.x + blockIdx.x;
  if (!kAttn && blk < nblk) load_o(blk * kWarpRows);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();  // weights, vectors and the first o tiles visible
  // kAttn: row blocks per sequence (= the cluster size) and the softmax scale in exp2 units.
  const int tiles_per_seq = kAttn ? p.S / kWarpRows : 1;
  const float sl2 = p.attn_scale * 1.4426950408889634f;

  const uint32_t a_row = uint32_t((lane & 7) + ((lane >> 3) & 1) * 8);
  const uint32_t a_lane = (a_row * SA + uint32_t(lane >> 4) * 8) * 2u;
  const uint32_t af_lane = (a_row * SF + uint32_t(lane >> 4) * 8) * 2u;
  const int b_row = (lane & 7) + (lane >> 4) * 8;
  const uint32_t b_col = uint32_t((lane >> 3) & 1) * 16u;
  const uint32_t b_wo = s_wo + uint32_t((w * CW + b_row) * SA) * 2u + b_col;
  const uint32_t b_wi = s_wi + uint32_t((w * FW + b_row) * SA) * 2u + b_col;
  const uint32_t b_wf = s_wf + uint32_t((w * CW + b_row) * SF) * 2u + b_col;
  const uint32_t b_wq = s_wq + uint32_t((w * QW + b_row) * SA) * 2u + b_col;
  const uint32_t l_wo = s_next_wo + uint32_t((w * CW + b_row) * SA) * 2u + b_col;
  const uint32_t l_wi = s_next_wi + uint32_t((w * FW + b_row) * SA) * 2u + b_col;
  const uint32_t l_wf = s_next_wf + uint32_t((w * CW + b_row) * SF) * 2u + b_col;

  // acc[NT][4] += bias (a [DP] / [FP] fp32 smem vector) at the warp's columns from col0.
  auto add_bias = [&](auto& acc, const float* bias, int col0) {
    constexpr int NT = int(sizeof(acc) / sizeof(acc[0]));
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const float2 b = *reinterpret_cast<const float2*>(bias + col0 + 8 * j + 2 * t);
      acc[j][0] += b.x;
      acc[j][1] += b.y;
      acc[j][2] += b.x;
      acc[j][3] += b.y;
    }
  };
  // LayerNorm value of one accumulator element (h: 0 for row g, 1 for g + 8).
  auto ln = [](float a, const float (&mean)[2], const float (&rstd)[2], int h, float w, float b) {
    return (a - mean[h]) * rstd[h] * w + b;
  };

  // kModel: the residual (minus its first column's value at layer 0) stays in acc from layer to
  // layer; `layer` is the pass over the block, the block advancing after the last layer.
  float acc[NTW][4];
  float c0 = 0.f, c1 = 0.f;
  int layer = 0;
#pragma unroll 1
  for (bool first = true; blk < nblk; first = false) {
    const PostAttnParams& p = kModel ? mp->layer[layer] : p0;
    // kModel: the pass after this one (the same block's next layer, or the next block's layer 0)
    // and whether there is one. Its W_out is staged from the start of this pass and its W_o | W_in
    // from the end of the attention (cp.async groups: staging, Wqkv, W_out, then W_o | W_in, then
    // the chain's own (empty) group before ffn_out); W_out goes into the fragments after ffn_out,
    // W_o | W_in after the last group barrier (kQkv) or one of their own (the tail).
    const int next_layer = kModel && layer + 1 < (kModel ? mp->L : 1) ? layer + 1 : 0;
    const bool has_next = kModel && (next_layer > 0 || blk + stride < nblk);
    const PostAttnParams& pn = kModel ? mp->layer[next_layer] : p0;
    const int64_t row0 = blk * kWarpRows;
    const int64_t r0 = row0 + g, r1 = row0 + g + 8;
    if (!kModel || layer == 0) {
      // Every read of x_in happens here, before the group's first barrier of this block, and every
      // write of x_out after its later barriers: x_out may alias x_in (other warps' columns too).
      const int64_t s0 = residual_row(p, r0), s1 = residual_row(p, r1);
      c0 = s0 >= 0 ? p.x_in[s0 * D] : 0.f;
      c1 = s1 >= 0 ? p.x_in[s1 * D] : 0.f;
#pragma unroll
      for (int j = 0; j < NTW; ++j) {
        const int col = w * CW + 8 * j + 2 * t;
        float2 x0 = make_float2(c0, c0), x1 = make_float2(c1, c1);
        if (s0 >= 0) x0 = *reinterpret_cast<const float2*>(p.x_in + s0 * D + col);
        if (s1 >= 0) x1 = *reinterpret_cast<const float2*>(p.x_in + s1 * D + col);
        acc[j][0] = x0.x - c0;
        acc[j][1] = x0.y - c0;
        acc[j][2] = x1.x - c1;
        acc[j][3] = x1.y - c1;
      }
    }
    if (kFront && (!kModel || layer == 0)) {
      // ln1 and the QKV projection of this block's rows (Wqkv_front in s_wq, landed by the last
      // group barrier's cp.async wait: the one before the loop, or the one at the end of the
      // previous block).
      float mean[2], rstd[2];
      split_stats<NTW, W>(acc, stats, w, g, t, bar, kGroupThreads, D, p.eps, mean, rstd);
#pragma unroll
      for (int j = 0; j < NTW; ++j) {
        const int col = w * CW + 8 * j + 2 * t;
        const float2 lw = *reinterpret_cast<const float2*>(p.ln_front_w + col);
        const float2 lb = *reinterpret_cast<const float2*>(p.ln_front_b + col);
        st_shared_u32(tile + uint32_t(g * SA + col) * 2u,
                      pack_half2(ln(acc[j][0], mean, rstd, 0, lw.x, lb.x), ln(acc[j][1], mean, rstd, 0, lw.y, lb.y)));
        st_shared_u32(tile + uint32_t((g + 8) * SA + col) * 2u,
                      pack_half2(ln(acc[j][2], mean, rstd, 1, lw.x, lb.x), ln(acc[j][3], mean, rstd, 1, lw.y, lb.y)));
      }
      cp_async_wait_all();  // Wqkv_front (reloaded at the end of the previous block)
      group_sync(bar, kGroupThreads);  // h complete
      float qa[NTQ][4];
#pragma unroll
      for (int j = 0; j < NTQ; ++j) qa[j][0] = qa[j][1] = qa[j][2] = qa[j][3] = 0.f;
      mma_cols<NTQ, DP / 16, SA>(qa, tile + a_lane, b_wq);
#pragma unroll
      for (int j = 0; j < NTQ; ++j) {
        const int col = w * QW + 8 * j + 2 * t;
        const float2 b = __half22float2(*reinterpret_cast<const __half2*>(p.b_qkv_front + col));
        *reinterpret_cast<__half2*>(p.qkv_front + r0 * 3 * D + col) = __floats2half2_rn(qa[j][0] + b.x, qa[j][1] + b.y);
        *reinterpret_cast<__half2*>(p.qkv_front + r1 * 3 * D + col) = __floats2half2_rn(qa[j][2] + b.x, qa[j][3] + b.y);
      }
      // Every CTA of the sequence has written its rows (and every warp here is done with the tile
      // and Wqkv_front): the attention may read them, and the next layer's Wqkv may come in.
      cluster_sync();
    }
    if constexpr (kAttn) {
      // Attention of this block's 16 query rows, o over q in the tile. The tile and the key /
      // value region were last read before this block's predecessor's later barriers.
      const int64_t seq = blk / tiles_per_seq;
      const int lt = int(blk - seq * tiles_per_seq);
      const int len = p.lengths ? min(max(p.lengths[seq], 0), p.S) : p.S;
      const bool active = lt * kWarpRows < len;
      const int nkt = (len + kWarpRows - 1) / kWarpRows;
      const int key_rows = active ? kWarpRows * (p.causal ? min(lt + 1, nkt) : nkt) : 0;
      const int64_t D3 = 3 * int64_t(D);
      const __half* qkv_seq = p.qkv_in + seq * p.S * D3;  // qkv_front is qkv_in
      constexpr int kChunks = DP / 8;
      if (active) {
        for (int i = tid; i < kWarpRows * kChunks; i += int(blockDim.x)) {
          const int r = i / kChunks, c = (i - r * kChunks) * 8;
          cp_async_16(tile + uint32_t(r * SA + c) * 2u, qkv_seq + int64_t(lt * kWarpRows + r) * D3 + c, true);
        }
        for (int i = tid; i < key_rows * kChunks; i += int(blockDim.x)) {
          const int r = i / kChunks, c = (i - r * kChunks) * 8;
          const bool valid = r < len;  // rows past the length: zeros (P is 0 there, V must be finite)
          const __half* src = qkv_seq + int64_t(r) * D3 + D + c;
          cp_async_16(s_k + uint32_t(r * SA + c) * 2u, valid ? src : qkv_seq, valid);
          cp_async_16(s_v + uint32_t(r * SA + c) * 2u, valid ? src + D : qkv_seq, valid);
        }
      }
      cp_async_commit();
      if constexpr (kFront) {
        // The next layer's Wqkv over Wqkv_front (kModel: over this layer's, last read before the
        // previous pass's closing cluster barrier; in the last layer, layer 0's Wqkv_front for the
        // next block), awaited before the QKV product (its group barrier) or the next front.
        const __half* wq = !kModel || p.qkv_out ? p.w_qkv : (has_next ? mp->layer[0].w_qkv_front : nullptr);
        if (wq) copy_panel<3 * DP, DP, SA>(s_wq, wq, D, 3 * D, D, tid, int(blockDim.x));
        cp_async_commit();
        if constexpr (kModel) {
          if (has_next) copy_panel<DP, FP, SF>(s_next_wf, pn.w_out, FP, D, FP, tid, int(blockDim.x));
          cp_async_commit();
          if (!first) load_vectors(p);  // the previous pass's reads ended at a barrier since
          cp_async_wait<2>();
        } else {
          cp_async_wait<1>();
        }
      } else {
        cp_async_wait_all();
      }
      // Every read of this layer's qkv by this CTA is done (the data is in shared memory: nothing
      // for the arrive to order).
      if (kQkv && (!kModel || p.qkv_out)) cluster_arrive_relaxed();
      group_sync(bar, kGroupThreads);
      if (active) {
        // The tile holds rows lt * 16 .. of the sequence: q_base is shifted back by lt tiles so
        // that tile_attention's row lt * 16 + i is tile row i.
        const TileAttention ta = tile_attention<kHD>(tile - uint32_t(lt * kWarpRows * SA) * 2u, SA, s_k, s_v, SA, lt, lane);
        const int pad0 = max(0, len - lt * kWarpRows);  // first tile row past the length
        for (int hh = w; hh < p.H; hh += W) {
          tile_attention_head<kHD>(ta, hh, lt, len, p.causal, sl2, lane);
          __syncwarp();
          constexpr int kPairs = kHD / 2;
          for (int i = lane; i < (kWarpRows - pad0) * kPairs; i += 32) {
            const int r = pad0 + i / kPairs, c = hh * kHD + 2 * (i % kPairs);
            st_shared_u32(tile + uint32_t(r * SA + c) * 2u, 0u);
          }
        }
      } else {
        for (int i = tid; i < kWarpRows * (DP / 2); i += int(blockDim.x)) {
          const int r = i / (DP / 2), c = 2 * (i - r * (DP / 2));
          st_shared_u32(tile + uint32_t(r * SA + c) * 2u, 0u);
        }
      }
      group_sync(bar, kGroupThreads);  // o complete
      if constexpr (kModel) {  // the keys and values are read: the next W_o | W_in over them
        if (has_next) {
          copy_panel<DP, DP, SA>(s_next_wo, pn.w_o, D, D, D, tid, int(blockDim.x));
          copy_panel<FP, DP, SA>(s_next_wi, pn.w_in, D, FP, D, tid, int(blockDim.x));
        }
        cp_async_commit();
      }
    } else if (!first) {
      cp_async_wait_all();
      group_sync(bar, kGroupThreads);  // this block's o tile (issued during the last block) visible
    }
    // out_proj + residual + bo
    if constexpr (kRegW) {
      mma_regs<NTW, DP / 16>(acc, tile + a_lane, rwo);
    } else {
      mma_cols<NTW, DP / 16, SA>(acc, tile + a_lane, b_wo);
    }
    add_bias(acc, v_bo, w * CW);
    // ln2 -> h over the o tile (the stats barrier also ends every warp's reads of o)
    {
      float mean[2], rstd[2];
      split_stats<NTW, W>(acc, stats, w, g, t, bar, kGroupThreads, D, p.eps, mean, rstd);
#pragma unroll
      for (int j = 0; j < NTW; ++j) {
        const int col = w * CW + 8 * j + 2 * t;
        const float2 lw = *reinterpret_cast<const float2*>(v_ln2w + col);
        const float2 lb = *reinterpret_cast<const float2*>(v_ln2b + col);
        st_shared_u32(tile + uint32_t(g * SA + col) * 2u,
                      pack_half2(ln(acc[j][0], mean, rstd, 0, lw.x, lb.x), ln(acc[j][1], mean, rstd, 0, lw.y, lb.y)));
        st_shared_u32(tile + uint32_t((g + 8) * SA + col) * 2u,
                      pack_half2(ln(acc[j][2], mean, rstd, 1, lw.x, lb.x), ln(acc[j][3], mean, rstd, 1, lw.y, lb.y)));
      }
      group_sync(bar, kGroupThreads);  // h complete
    }
    // ffn_in + GELU -> f tile
    {
      // Zero start, bias after the product (as the row-per-warp kernel's zero_ffn / bias_ffn).
      float fa[NTF][4];
#pragma unroll
      for (int j = 0; j < NTF; ++j) fa[j][0] = fa[j][1] = fa[j][2] = fa[j][3] = 0.f;
      if constexpr (kRegW) {
        mma_regs<NTF, DP / 16>(fa, tile + a_lane, rwi);
      } else {
        mma_cols<NTF, DP / 16, SA>(fa, tile + a_lane, b_wi);
      }
      add_bias(fa, v_bin, w * FW);
#pragma unroll
      for (int j = 0; j < NTF; ++j) {
        const int col = w * FW + 8 * j + 2 * t;
        st_shared_u32(ftile + uint32_t(g * SF + col) * 2u, pack_half2(gelu_of_f16(fa[j][0]), gelu_of_f16(fa[j][1])));
        st_shared_u32(ftile + uint32_t((g + 8) * SF + col) * 2u,
                      pack_half2(gelu_of_f16(fa[j][2]), gelu_of_f16(fa[j][3])));
      }
      group_sync(bar, kGroupThreads);  // f complete; the h tile is free
    }
    // The next block's o into the tile while this one finishes.
    if (!kAttn && blk + stride < nblk) load_o((blk + stride) * kWarpRows);
    cp_async_commit();
    // ffn_out + residual + bf
    if constexpr (kRegW) {
      mma_regs<NTW, FP / 16>(acc, ftile + af_lane, rwf);
    } else {
      mma_cols<NTW, FP / 16, SF>(acc, ftile + af_lane, b_wf);
    }
    add_bias(acc, v_bout, w * CW);
    if constexpr (kModel) cp_async_wait<2>();  // the next W_out (W_o | W_in and the chain's group may pend)
    float mean[2], rstd[2];
    split_stats<NTW, W>(acc, stats2, w, g, t, bar, kGroupThreads, D, p.eps, mean, rstd);
    if constexpr (kModel) {  // every warp is past ffn_out and the next W_out landed: into the fragments
      if (has_next) ldsm_b_frags<NTW, FP / 16, SF>(rwf, l_wf);
    }
    if (kQkv && (!kModel || p.qkv_out)) {
      // x_out (kModel: not stored, the residual stays in acc), the next h into the f tile (and h_out
      // when given), then qkv = fp16(h Wqkv^T + bqkv).
#pragma unroll
      for (int j = 0; j < NTW; ++j) {
        const int col = w * CW + 8 * j + 2 * t;
        const float2 lw = *reinterpret_cast<const float2*>(v_lnw + col);
        const float2 lb = *reinterpret_cast<const float2*>(v_lnb + col);
        const uint32_t h0 =
            pack_half2(ln(acc[j][0], mean, rstd, 0, lw.x, lb.x), ln(acc[j][1], mean, rstd, 0, lw.y, lb.y));
        const uint32_t h1 =
            pack_half2(ln(acc[j][2], mean, rstd, 1, lw.x, lb.x), ln(acc[j][3], mean, rstd, 1, lw.y, lb.y));
        st_shared_u32(ftile + uint32_t(g * SF + col) * 2u, h0);
        st_shared_u32(ftile + uint32_t((g + 8) * SF + col) * 2u, h1);
        if (!kModel && r0 < rows) {
          st_global_f32x2(p.x_out + r0 * D + col, acc[j][0] + c0, acc[j][1] + c0);
          if (p.h_out) *reinterpret_cast<uint32_t*>(p.h_out + r0 * D + col) = h0;
        }
        if (!kModel && r1 < rows) {
          st_global_f32x2(p.x_out + r1 * D + col, acc[j][2] + c1, acc[j][3] + c1);
          if (p.h_out) *reinterpret_cast<uint32_t*>(p.h_out + r1 * D + col) = h1;
        }
      }
      if constexpr (kFront) cp_async_wait_all();  // the next layer's Wqkv, visible after the barrier
      group_sync(bar, kGroupThreads);  // the next h complete
      if constexpr (kAttn) cluster_wait();  // every CTA of the sequence has its keys / values
      float qa[NTQ][4];
#pragma unroll
      for (int j = 0; j < NTQ; ++j) qa[j][0] = qa[j][1] = qa[j][2] = qa[j][3] = 0.f;
      mma_cols<NTQ, DP / 16, SA>(qa, ftile + af_lane, b_wq);
      add_bias(qa, v_bq, w * QW);
#pragma unroll
      for (int j = 0; j < NTQ; ++j) {
        const int col = w * QW + 8 * j + 2 * t;
        if (r0 < rows) *reinterpret_cast<__half2*>(p.qkv_out + r0 * 3 * D + col) = __floats2half2_rn(qa[j][0], qa[j][1]);
        if (r1 < rows) *reinterpret_cast<__half2*>(p.qkv_out + r1 * 3 * D + col) = __floats2half2_rn(qa[j][2], qa[j][3]);
      }
      // The f tile is next written after this block's reads by every warp: the next block's
      // first group barrier comes first.
      if constexpr (kModel) {
        // The next W_o | W_in (landed before the last group barrier) into the fragments, then
        // every CTA's next q | k | v rows are written and visible before the next pass stages them
        // (and this CTA's reads of the key / value region are done before it is refilled).
        if (has_next) {
          ldsm_b_frags<NTW, DP / 16, SA>(rwo, l_wo);
          ldsm_b_frags<NTF, DP / 16, SA>(rwi, l_wi);
        }
        cluster_sync();
      } else if constexpr (kFront) {
        if (blk + stride < nblk) {  // Wqkv_front back for the next block's front
          group_sync(bar, kGroupThreads);  // every warp's reads of the next layer's Wqkv are done
          copy_panel<3 * DP, DP, SA>(s_wq, p.w_qkv_front, D, 3 * D, D, tid, int(blockDim.x));
          cp_async_commit();
        }
      }
    } else if (!p.tail) {
#pragma unroll
      for (int j = 0; j < NTW; ++j) {
        const int col = w * CW + 8 * j + 2 * t;
        const float2 lw = *reinterpret_cast<const float2*>(v_lnw + col);
        const float2 lb = *reinterpret_cast<const float2*>(v_lnb + col);
        if (r0 < rows) {
          st_global_f32x2(p.x_out + r0 * D + col, acc[j][0] + c0, acc[j][1] + c0);
          *reinterpret_cast<__half2*>(p.h_out + r0 * D + col) =
              __floats2half2_rn(ln(acc[j][0], mean, rstd, 0, lw.x, lb.x), ln(acc[j][1], mean, rstd, 0, lw.y, lb.y));
        }
        if (r1 < rows) {
          st_global_f32x2(p.x_out + r1 * D + col, acc[j][2] + c1, acc[j][3] + c1);
          *reinterpret_cast<__half2*>(p.h_out + r1 * D + col) =
              __floats2half2_rn(ln(acc[j][2], mean, rstd, 1, lw.x, lb.x), ln(acc[j][3], mean, rstd, 1, lw.y, lb.y));
        }
      }
    } else {
      const TailRows d = tail_rows(p, r0, r1);
#pragma unroll
      for (int j = 0; j < NTW; ++j) {
        const int col = w * CW + 8 * j + 2 * t;
        const float2 lw = *reinterpret_cast<const float2*>(v_lnw + col);
        const float2 lb = *reinterpret_cast<const float2*>(v_lnb + col);
        if (d.write[0]) {
          const float2 v = d.valid[0] ? make_float2(ln(acc[j][0], mean, rstd, 0, lw.x, lb.x), ln(acc[j][1], mean, rstd, 0, lw.y, lb.y))
                                      : make_float2(0.f, 0.f);
          st_global_f32x2(p.y + d.dst[0] * D + col, v.x, v.y);
        }
        if (d.write[1]) {
          const float2 v = d.valid[1] ? make_float2(ln(acc[j][2], mean, rstd, 1, lw.x, lb.x), ln(acc[j][3], mean, rstd, 1, lw.y, lb.y))
                                      : make_float2(0.f, 0.f);
          st_global_f32x2(p.y + d.dst[1] * D + col, v.x, v.y);
        }
      }
    }
    if constexpr (kModel) {
      if (p.tail && has_next) {  // the next block's layer-0 W_o | W_in
        cp_async_wait_all();
        group_sync(bar, kGroupThreads);
        ldsm_b_frags<NTW, DP / 16, SA>(rwo, l_wo);
        ldsm_b_frags<NTF, DP / 16, SA>(rwi, l_wi);
      }
      layer = next_layer;
      if (layer == 0) blk += stride;
    } else {
      blk += stride;
    }
  }
  cp_async_wait_all();
}

template <int DP, int FP, int W, bool kRegW, bool kQkv = false, int kHD = 0, bool kFront = false>
__global__ void __launch_bounds__(kRegW ? W * 32 : kSplitMaxWarps * 32, 1) post_attn_split_kernel(const PostAttnParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  // The attention variants run in clusters (compute capability 9.0+): no code before sm_90.
  if constexpr (kHD > 0) {
    __trap();
  } else {
    split_chain<DP, FP, W, kRegW, kQkv, kHD, kFront>(p);
  }
#else
  split_chain<DP, FP, W, kRegW, kQkv, kHD, kFront>(p);
#endif
}

// ---- launch layer --------------------------------------------------------------------------------
enum class Variant { d64, d128, d256, pad128, pad256, none };

Variant pick_variant(int D, int F) {
  if (D < 8 || F < 8 || D > 256 || F > 256 || D % 8 != 0 || F % 8 != 0) return Variant::none;
  if (D == 64 && F == 64) return Variant::d64;
  if (D == 128 && F == 128) return Variant::d128;
  if (D == 256 && F == 256) return Variant::d256;
  if (D <= 128 && F <= 128) return Variant::pad128;
  return Variant::pad256;
}


// The warpgroup kernels run here: built for sm_90a (HK_CUDA_HAVE_WGMMA) and a compute
// capability 9.0 device (the arch-specific code runs on that one only). Current device, once per
// process.
bool wgmma_available() {
#if defined(HK_CUDA_HAVE_WGMMA) && HK_CUDA_HAVE_WGMMA
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    HK_CUDA_CHECK(cudaGetDevice(&dev));
    HK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    HK_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major == 9 && minor == 0;
  }();
  return ok;
#else
  return false;
#endif
}

// Opts the kernel into the device's whole shared memory once per process (current device).
template <int DP, int FP, bool kPad, bool kTanh = false, bool kWg = false>
void raise_smem_limit() {
  static const bool done = [] {
    HK_CUDA_CHECK(cudaFuncSetAttribute(post_attn_kernel<DP, FP, kPad, kTanh, kWg>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, device_limits().smem_optin));
    return true;
  }();
  (void)done;
}

// Smallest configuration (1 warp, single buffer) fits the device's shared memory.
template <int DP, int FP>
bool fits_device() {
  return smem_bytes<DP, FP>(1, 1) <= size_t(device_limits().smem_optin);
}

// What a launch of `rows` rows with `cfg` runs: the single place that clamps a configuration.
struct Resolved {
  int warps = 0;
  int nbuf = 1;
  size_t smem = 0;
  int occ = 0;       // CTAs per SM
  int64_t grid = 0;
  bool exact = false;  // cfg's explicit fields are what runs (no clamping)
};

template <int DP, int FP, bool kPad, bool kTanh = false, bool kWg = false>
Resolved resolve(const PostAttnConfig& cfg, int64_t rows, const DeviceLimits& lim) {
  using T = Tile<DP, FP>;
  raise_smem_limit<DP, FP, kPad, kTanh, kWg>();
  constexpr int kMaxWarps = max_warps<DP, FP, kPad>();
  // Warpgroup kernels: whole groups of 4 warps.
  constexpr int kStep = kWg ? 4 : 1;
  Resolved r;
  r.warps = cfg.warps > 0 ? std::min(cfg.warps, kMaxWarps) : kMaxWarps;
  r.warps = std::max(kStep, r.warps / kStep * kStep);
  r.nbuf = (T::kResident && cfg.prefetch != 0) ? 2 : 1;
  // Too big for this device: drop the o double buffer first (unless asked for), then warps.
  while (smem_bytes<DP, FP>(r.warps, r.nbuf) > size_t(lim.smem_optin)) {
    if (r.nbuf == 2 && cfg.prefetch != 1) {
      r.nbuf = 1;
    } else if (r.warps > kStep) {
      r.warps -= kStep;
    } else if (r.nbuf == 2) {
      r.nbuf = 1;
    } else {
      throw std::invalid_argument("hk::post_attn[cuda.fused]: shared memory of this device too small");
    }
  }
  r.exact = (cfg.warps <= 0 || cfg.warps == r.warps) &&
            (cfg.prefetch < 0 || (cfg.prefetch == 1) == (r.nbuf == 2));
  r.smem = smem_bytes<DP, FP>(r.warps, r.nbuf);
  HK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.occ, post_attn_kernel<DP, FP, kPad, kTanh, kWg>,
                                                              r.warps * 32, r.smem));
  if (r.occ < 1) throw std::invalid_argument("hk::post_attn[cuda.fused]: kernel does not fit on an SM");
  // Persistent: at most one wave; fewer CTAs when there is not enough work to deal out (a unit:
  // a warp's row block, a warpgroup's 4, or a streamed CTA's warps blocks).
  const int64_t unit_rows = T::kResident ? int64_t(kStep) * kWarpRows : int64_t(r.warps) * kWarpRows;
  const int64_t units = (rows + unit_rows - 1) / unit_rows;
  r.grid = std::max<int64_t>(1, std::min<int64_t>(int64_t(r.occ) * lim.sms, units));
  return r;
}

// The tanh-GELU instantiation exists for the exact resident kernels only (d64, d128).
template <int DP, int FP, bool kPad>
constexpr bool has_tanh() {
  return !kPad && Tile<DP, FP>::kResident;
}

// The warpgroup instantiations: the exact resident kernels (the same set as the tanh GELU).
template <int DP, int FP, bool kPad>
constexpr bool has_wg() {
  return has_tanh<DP, FP, kPad>();
}

template <int DP, int FP, bool kPad, bool kTanh = false, bool kWg = false>
void launch(const PostAttnParams& p, cudaStream_t stream, const PostAttnConfig& cfg) {
  if constexpr (has_tanh<DP, FP, kPad>() && !kTanh && !kWg) {
    if (cfg.gelu_tanh) return launch<DP, FP, kPad, true>(p, stream, cfg);
  }
  if constexpr (has_wg<DP, FP, kPad>() && !kWg) {
    if (cfg.wgmma && wgmma_available()) return launch<DP, FP, kPad, kTanh, true>(p, stream, cfg);
  }
  const Resolved r = resolve<DP, FP, kPad, kTanh, kWg>(cfg, p.rows, device_limits());
  launch_pdl(post_attn_kernel<DP, FP, kPad, kTanh, kWg>, dim3(unsigned(r.grid)), dim3(unsigned(r.warps * 32)), r.smem,
             stream, p, r.nbuf);
  HK_CUDA_CHECK_LAUNCH();
}

// resolve() of the instantiation `cfg` runs on.
template <int DP, int FP, bool kPad>
Resolved resolve_cfg(const PostAttnConfig& cfg, int64_t rows, const DeviceLimits& lim) {
  if constexpr (has_tanh<DP, FP, kPad>()) {
    const bool tanh = cfg.gelu_tanh != 0, wg = cfg.wgmma != 0 && wgmma_available();
    if (tanh && wg) return resolve<DP, FP, kPad, true, true>(cfg, rows, lim);
    if (tanh) return resolve<DP, FP, kPad, true>(cfg, rows, lim);
    if (wg) return resolve<DP, FP, kPad, false, true>(cfg, rows, lim);
  }
  return resolve<DP, FP, kPad>(cfg, rows, lim);
}

template <int DP, int FP, bool kPad>
PostAttnConfig effective(int64_t rows, const PostAttnConfig& cfg) {
  const Resolved r = resolve_cfg<DP, FP, kPad>(cfg, rows, device_limits());
  PostAttnConfig e{r.warps, r.nbuf == 2 ? 1 : 0};
  e.gelu_tanh = has_tanh<DP, FP, kPad>() && cfg.gelu_tanh != 0 ? 1 : 0;
  e.wgmma = has_wg<DP, FP, kPad>() && cfg.wgmma != 0 && wgmma_available() ? 1 : 0;
  return e;
}

// See post_attn_fused_candidates in the header for the reasons of each group.
template <int DP, int FP, bool kPad>
std::vector<PostAttnConfig> candidates(int64_t rows, bool tanh_gelu) {
  using T = Tile<DP, FP>;
  const DeviceLimits lim = device_limits();
  std::vector<PostAttnConfig> out{PostAttnConfig{}};
  std::vector<PostAttnConfig> runs{effective<DP, FP, kPad>(rows, PostAttnConfig{})};
  auto add = [&](const PostAttnConfig& c) {
    if (c.warps < 1) return;
    const Resolved r = resolve<DP, FP, kPad>(c, rows, lim);
    if (!r.exact) return;
    const PostAttnConfig run{r.warps, r.nbuf == 2 ? 1 : 0};
    if (std::find(runs.begin(), runs.end(), run) != runs.end()) return;
    runs.push_back(run);
    out.push_back(c);
  };
  const Resolved d = resolve<DP, FP, kPad>(PostAttnConfig{}, rows, lim);
  if constexpr (T::kResident) {
    const int64_t blocks = (rows + kWarpRows - 1) / kWarpRows;
    if (blocks > d.grid * d.warps) {
      add(PostAttnConfig{d.warps, d.nbuf == 2 ? 0 : 1});
      for (const int w : {d.warps * 2 / 3, d.warps / 2}) {
        const size_t before = out.size();
        add(PostAttnConfig{w, 1});
        if (out.size() == before) add(PostAttnConfig{w, 0});
      }
    } else {
      add(PostAttnConfig{d.warps, 0});
      add(PostAttnConfig{4, 0});
      add(PostAttnConfig{1, 0});
    }
  } else {
    Resolved prev = d;
    for (int w = d.warps / 2; w >= 1 && prev.grid < int64_t(prev.occ) * lim.sms; w /= 2) {
      add(PostAttnConfig{w, -1});
      prev = resolve<DP, FP, kPad>(PostAttnConfig{w, -1}, rows, lim);
    }
  }
  if (tanh_gelu && has_tanh<DP, FP, kPad>()) {
    // The same launch shapes with the tanh-form GELU (its own instantiation: same warps, same
    // shared memory; resolve() of either gives the same shape).
    // Explicit warps and prefetch (what the erf entry runs), so that each runs exactly as given.
    const size_t n = out.size();
    for (size_t i = 0; i < n; ++i) {
      PostAttnConfig c = effective<DP, FP, kPad>(rows, out[i]);
      c.gelu_tanh = 1;
      out.push_back(c);
    }
  }
  if (has_wg<DP, FP, kPad>() && wgmma_available()) {
    // Each row-per-warp entry (erf and tanh) again as a warpgroup kernel, its warps rounded down
    // to whole groups of 4 (at least one group); shapes that then run the same are left out.
    const size_t n = out.size();
    for (size_t i = 0; i < n; ++i) {
      PostAttnConfig c = effective<DP, FP, kPad>(rows, out[i]);
      c.warps = std::max(4, c.warps / 4 * 4);
      c.wgmma = 1;
      const Resolved r = resolve_cfg<DP, FP, kPad>(c, rows, lim);
      if (!r.exact) continue;
      const PostAttnConfig run = effective<DP, FP, kPad>(rows, c);
      if (std::find(runs.begin(), runs.end(), run) != runs.end()) continue;
      runs.push_back(run);
      out.push_back(c);
    }
  }
  return out;
}

// ---- column-split kernel: launch layer ------------------------------------------------------------
bool split_supported(int D, int F) { return (D == 64 && F == 64) || (D == 128 && F == 128); }

template <int DP, int FP, int W, bool kRegW, bool kQkv = false>
void raise_split_smem_limit() {
  static const bool done = [] {
    HK_CUDA_CHECK(cudaFuncSetAttribute(post_attn_split_kernel<DP, FP, W, kRegW, kQkv>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, device_limits().smem_optin));
    return true;
  }();
  (void)done;
}

// Every column-split variant of (DP, FP): supports() raises them all, so that a capture of any
// candidate makes no attribute change.
template <int DP, int FP>
void raise_split_smem_limits() {
  raise_split_smem_limit<DP, FP, 4, false>();
  raise_split_smem_limit<DP, FP, 8, false>();
  raise_split_smem_limit<DP, FP, 8, true>();
  raise_split_smem_limit<DP, FP, 8, false, true>();
  raise_split_smem_limit<DP, FP, 8, true, true>();
}

template <int DP, int FP, int W, bool kRegW, bool kQkv = false>
Resolved resolve_split(const PostAttnConfig& cfg, int64_t rows, const DeviceLimits& lim) {
  raise_split_smem_limit<DP, FP, W, kRegW, kQkv>();
  constexpr int kMaxGroups = kRegW ? 1 : kSplitMaxWarps / W;  // kRegW: 8 warps, up to 255 registers
  int groups = cfg.warps > 0 ? std::clamp(cfg.warps / W, 1, kMaxGroups) : std::min(2, kMaxGroups);
  while (groups > 1 && split_smem_bytes<DP, FP, W, kRegW, kQkv>(groups) > size_t(lim.smem_optin)) --groups;
  if (split_smem_bytes<DP, FP, W, kRegW, kQkv>(groups) > size_t(lim.smem_optin)) {
    throw std::invalid_argument("hk::post_attn[cuda.fused.split]: shared memory of this device too small");
  }
  Resolved r;
  r.warps = groups * W;
  r.nbuf = 1;
  r.exact = cfg.split == W && (cfg.warps <= 0 || cfg.warps == r.warps) && cfg.prefetch <= 0 &&
            (cfg.reg_weights != 0) == kRegW;
  r.smem = split_smem_bytes<DP, FP, W, kRegW, kQkv>(groups);
  HK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.occ, post_attn_split_kernel<DP, FP, W, kRegW, kQkv>,
                                                              r.warps * 32, r.smem));
  if (r.occ < 1) throw std::invalid_argument("hk::post_attn[cuda.fused.split]: kernel does not fit on an SM");
  const int64_t blocks = (rows + kWarpRows - 1) / kWarpRows;
  r.grid = std::max<int64_t>(1, std::min<int64_t>(int64_t(r.occ) * lim.sms, (blocks + groups - 1) / groups));
  return r;
}

// `fn` called with the split width and the weight placement as compile-time constants: width 8
// for split >= 8, else 4; weights in registers only with width 8 (cfg.reg_weights). (Width 16 at
// D = 128, one n8 tile of each product per warp, was measured slower than 8 in every case, with and
// without the QKV projection: perf/RESULTS.md, seventeenth GPU run; not instantiated.)
template <class Fn>
auto with_split_variant(const PostAttnConfig& cfg, Fn&& fn) {
  if (cfg.split >= 8 && cfg.reg_weights != 0) return fn(std::integral_constant<int, 8>{}, std::true_type{});
  if (cfg.split >= 8) return fn(std::integral_constant<int, 8>{}, std::false_type{});
  return fn(std::integral_constant<int, 4>{}, std::false_type{});
}

// The QKV-fused kernel exists for width 8 only (post_attn_qkv_candidates; validate() checks).
template <int DP, int FP>
void launch_split(const PostAttnParams& p, cudaStream_t stream, const PostAttnConfig& cfg) {
  if (p.qkv_out) {
    auto run = [&](auto rc) {
      constexpr bool kRegW = decltype(rc)::value;
      const Resolved r = resolve_split<DP, FP, 8, kRegW, true>(cfg, p.rows, device_limits());
      launch_pdl(post_attn_split_kernel<DP, FP, 8, kRegW, true>, dim3(unsigned(r.grid)), dim3(unsigned(r.warps * 32)),
                 r.smem, stream, p);
      HK_CUDA_CHECK_LAUNCH();
    };
    return cfg.reg_weights != 0 ? run(std::true_type{}) : run(std::false_type{});
  }
  with_split_variant(cfg, [&](auto wc, auto rc) {
    constexpr int W = decltype(wc)::value;
    constexpr bool kRegW = decltype(rc)::value;
    const Resolved r = resolve_split<DP, FP, W, kRegW>(cfg, p.rows, device_limits());
    launch_pdl(post_attn_split_kernel<DP, FP, W, kRegW>, dim3(unsigned(r.grid)), dim3(unsigned(r.warps * 32)), r.smem,
               stream, p);
    HK_CUDA_CHECK_LAUNCH();
  });
}

template <int DP, int FP>
PostAttnConfig effective_split(int64_t rows, const PostAttnConfig& cfg) {
  return with_split_variant(cfg, [&](auto wc, auto rc) {
    constexpr int W = decltype(wc)::value;
    constexpr bool kRegW = decltype(rc)::value;
    const Resolved r = resolve_split<DP, FP, W, kRegW>(cfg, rows, device_limits());
    return PostAttnConfig{r.warps, 0, W, kRegW ? 1 : 0};
  });
}

// The QKV-fused configurations that run exactly as given: 8 warps per row block with the chain's
// weights in registers (Wqkv in shared memory), then all in shared memory with 1 and 2 row blocks
// per CTA (2 only where the shared memory holds them: D = 64).
template <int DP, int FP>
std::vector<PostAttnConfig> qkv_candidates(int64_t rows) {
  const DeviceLimits lim = device_limits();
  std::vector<PostAttnConfig> out;
  for (const PostAttnConfig& c : {PostAttnConfig{8, 0, 8, 1}, PostAttnConfig{8, 0, 8, 0}, PostAttnConfig{16, 0, 8, 0}}) {
    const size_t smem = c.reg_weights ? split_smem_bytes<DP, FP, 8, true, true>(c.warps / 8)
                                      : split_smem_bytes<DP, FP, 8, false, true>(c.warps / 8);
    if (smem > size_t(lim.smem_optin)) continue;
    const Resolved r = c.reg_weights ? resolve_split<DP, FP, 8, true, true>(c, rows, lim)
                                     : resolve_split<DP, FP, 8, false, true>(c, rows, lim);
    if (r.exact) out.push_back(c);
  }
  return out;
}

// The column-split candidates (post_attn_fused_candidates in the header): 8 warps per row block
// with the weights in registers (one row block per CTA), and with the weights in shared memory
// with 1 and 2 row blocks per CTA; 4 warps with 2 and 4, while there are at most 16 row blocks
// per SM; beyond that (many rows: the row-per-warp kernels keep every warp busy) only 8 x 2.
template <int DP, int FP>
void split_candidates(int64_t rows, std::vector<PostAttnConfig>& out) {
  const DeviceLimits lim = device_limits();
  const int64_t blocks = (rows + kWarpRows - 1) / kWarpRows;
  std::vector<PostAttnConfig> want{{16, 0, 8, 0}};
  if (blocks <= int64_t(16) * lim.sms) {
    want = {{8, 0, 8, 1}, {8, 0, 8, 0}, {16, 0, 8, 0}, {8, 0, 4, 0}, {16, 0, 4, 0}};
  }
  std::vector<PostAttnConfig> runs;
  for (const PostAttnConfig& c : want) {
    const Resolved r = with_split_variant(c, [&](auto wc, auto rc) {
      return resolve_split<DP, FP, decltype(wc)::value, decltype(rc)::value>(c, rows, lim);
    });
    const PostAttnConfig run{r.warps, 0, c.split, c.reg_weights};
    if (!r.exact || std::find(runs.begin(), runs.end(), run) != runs.end()) continue;
    runs.push_back(run);
    out.push_back(c);
  }
}

// ---- column-split kernel with the attention in front: launch layer -------------------------------
// One head_dim per D (the instantiations the engine's models use: D = 128 with 4 heads, D = 64
// with 4 heads).
template <int DP>
__host__ __device__ constexpr int attn_head_dim() {
  return DP == 128 ? 32 : 16;
}
constexpr int kAttnMaxS = 128;  // a sequence's row blocks = one cluster of at most 8 CTAs

// The whole forward (PostAttnModelParams): the attention chain with the front in layer 0, then
// layer after layer on the same CTAs. Trap before sm_90 (clusters), as the per-layer variants.
template <int DP>
__global__ void __launch_bounds__(8 * 32, 1) post_attn_model_kernel(const __grid_constant__ PostAttnModelParams mp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();
#else
  split_chain<DP, DP, 8, true, true, attn_head_dim<DP>(), true, true>(mp.layer[0], &mp);
#endif
}

template <int DP, bool kQkv>
size_t attn_smem_bytes(int S) {
  return split_smem_bytes<DP, DP, 8, true, kQkv>(1) + attn_kv_bytes(DP, DP, S, false);
}
template <int DP>
size_t model_smem_bytes(int S) {
  return split_smem_bytes<DP, DP, 8, true, true>(1) + attn_kv_bytes(DP, DP, S, true) + model_stage_bytes(DP, DP);
}

template <int DP, bool kQkv, bool kFront = false>
void raise_attn_smem_limit() {
  static const bool done = [] {
    HK_CUDA_CHECK(cudaFuncSetAttribute(post_attn_split_kernel<DP, DP, 8, true, kQkv, attn_head_dim<DP>(), kFront>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, device_limits().smem_optin));
    return true;
  }();
  (void)done;
}

template <int DP>
void raise_model_smem_limit() {
  static const bool done = [] {
    HK_CUDA_CHECK(cudaFuncSetAttribute(post_attn_model_kernel<DP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       device_limits().smem_optin));
    return true;
  }();
  (void)done;
}

template <int DP>
bool attn_fits(int S) {
  // Code for sm_90+ (pdl_compiled: the kernels' binary version; before it they trap) and room for
  // the keys and values next to Wqkv.
  if (!pdl_compiled(reinterpret_cast<const void*>(post_attn_split_kernel<DP, DP, 8, true, true, attn_head_dim<DP>()>)) ||
      !pdl_compiled(reinterpret_cast<const void*>(post_attn_split_kernel<DP, DP, 8, true, false, attn_head_dim<DP>()>))) {
    return false;
  }
  if (attn_smem_bytes<DP, true>(S) > size_t(device_limits().smem_optin)) return false;
  raise_attn_smem_limit<DP, true>();
  raise_attn_smem_limit<DP, false>();
  raise_attn_smem_limit<DP, true, true>();
  raise_model_smem_limit<DP>();
  return true;
}

// The attention chains' grid: one sequence per cluster at a time, about one wave of clusters
// looping over the batch.
template <class Kernel, class Args>
void launch_attn_clusters(Kernel kernel, const PostAttnParams& p, size_t smem, cudaStream_t stream, const Args& args) {
  int occ = 0;
  HK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, 8 * 32, smem));
  if (occ < 1) throw std::invalid_argument("hk::post_attn[cuda.fused.attn]: kernel does not fit on an SM");
  const int csize = p.S / kWarpRows;
  const int64_t B = p.rows / p.S;
  const int64_t clusters = std::min<int64_t>(B, std::max<int64_t>(1, int64_t(occ) * device_limits().sms / csize));
  launch_pdl_cluster(kernel, dim3(unsigned(clusters * csize)), dim3(8 * 32), dim3(unsigned(csize)), smem, stream, args);
  HK_CUDA_CHECK_LAUNCH();
}

template <int DP>
void launch_attn(const PostAttnParams& p, cudaStream_t stream) {
  auto run = [&](auto qc, auto fc) {
    constexpr bool kQkv = decltype(qc)::value;
    constexpr bool kFront = decltype(fc)::value;
    raise_attn_smem_limit<DP, kQkv, kFront>();
    launch_attn_clusters(post_attn_split_kernel<DP, DP, 8, true, kQkv, attn_head_dim<DP>(), kFront>, p,
                         attn_smem_bytes<DP, kQkv>(p.S), stream, p);
  };
  if (p.w_qkv_front) {
    run(std::true_type{}, std::true_type{});
  } else if (p.qkv_out) {
    run(std::true_type{}, std::false_type{});
  } else {
    run(std::false_type{}, std::false_type{});
  }
}

bool aligned(const void* ptr, uintptr_t a) { return (reinterpret_cast<uintptr_t>(ptr) & (a - 1)) == 0; }

void validate(const PostAttnParams& p) {
  auto fail = [](const char* what) {
    throw std::invalid_argument(std::string("hk::post_attn[cuda.fused]: ") + what);
  };
  if (!post_attn_fused_supports(p.D, p.F)) fail("unsupported D / F (multiples of 8 up to 256)");
  if (p.rows < 0 || p.rows > INT32_MAX) fail("row count outside [0, 2^31)");
  if ((!p.o && !p.qkv_in) || !p.x_in || !p.w_o || !p.b_o || !p.ln2_w || !p.ln2_b || !p.w_in || !p.b_in || !p.w_out || !p.b_out ||
      !p.ln_next_w || !p.ln_next_b) {
    fail("null input pointer");
  }
  if (p.tail ? !p.y : (!p.x_out || (!p.h_out && !p.qkv_out))) fail("null output pointer");
  if (p.tail && !p.row_dst && p.S < 1) fail("S < 1 in the tail variant");
  if (p.tail && p.row_dst && static_cast<const void*>(p.y) == static_cast<const void*>(p.x_in)) {
    fail("y must not alias x_in with row_dst (rows move)");
  }
  if (p.qkv_out) {
    if (p.tail || !p.w_qkv || !p.b_qkv) fail("qkv_out needs w_qkv, b_qkv and the non-tail chain");
    if (!aligned(p.w_qkv, 16) || !aligned(p.qkv_out, 4)) fail("w_qkv must be 16-byte and qkv_out 4-byte aligned");
  }
  if (p.x_rows && (p.tail || static_cast<const void*>(p.x_out) == static_cast<const void*>(p.x_in))) {
    fail("x_rows (gathered residual) only outside the tail, with x_out another buffer than x_in");
  }
  if (p.qkv_in) {
    if (!post_attn_attention_supports(p.D, p.F, p.H, p.S)) {
      fail("attention in the chain: unsupported D / F / H / S or device (post_attn_attention_supports)");
    }
    if (p.rows % p.S != 0) fail("attention in the chain: rows must be B * S (the dense layout)");
    if (p.row_dst || p.x_rows) fail("attention in the chain: the dense layout only (no row_dst / x_rows)");
    if (!aligned(p.qkv_in, 16)) fail("qkv_in must be 16-byte aligned");
    if (!(p.attn_scale > 0.f)) fail("attention in the chain: attn_scale must be > 0");
    if (p.w_qkv_front) {
      if (!p.qkv_out || p.qkv_front != p.qkv_in || !p.b_qkv_front || !p.ln_front_w || !p.ln_front_b) {
        fail("ln1 + QKV in front: needs qkv_out, qkv_front == qkv_in, b_qkv_front and ln_front");
      }
      if (!aligned(p.w_qkv_front, 16)) fail("w_qkv_front must be 16-byte aligned");
    }
  } else if (p.w_qkv_front) {
    fail("w_qkv_front needs qkv_in (the attention in the chain)");
  }
  if ((!p.qkv_in && !aligned(p.o, 16)) || !aligned(p.w_o, 16) || !aligned(p.w_in, 16) || !aligned(p.w_out, 16)) {
    fail("o and the weights must be 16-byte aligned");
  }
  if (!aligned(p.x_in, 8) || (p.tail ? !aligned(p.y, 8) : (!aligned(p.x_out, 8) || !aligned(p.h_out, 16)))) {
    fail("x / y must be 8-byte and h_out 16-byte aligned");
  }
}

}  // namespace

bool post_attn_fused_supports(int D, int F) {
  switch (pick_variant(D, F)) {
    case Variant::d64:
      if (!fits_device<64, 64>()) return false;
      raise_smem_limit<64, 64, false>();
      raise_smem_limit<64, 64, false, true>();
      if (wgmma_available()) {
        raise_smem_limit<64, 64, false, false, true>();
        raise_smem_limit<64, 64, false, true, true>();
      }
      raise_split_smem_limits<64, 64>();
      return true;
    case Variant::d128:
      if (!fits_device<128, 128>()) return false;
      raise_smem_limit<128, 128, false>();
      raise_smem_limit<128, 128, false, true>();
      if (wgmma_available()) {
        raise_smem_limit<128, 128, false, false, true>();
        raise_smem_limit<128, 128, false, true, true>();
      }
      raise_split_smem_limits<128, 128>();
      return true;
    case Variant::d256:
      if (!fits_device<256, 256>()) return false;
      raise_smem_limit<256, 256, false>();
      return true;
    case Variant::pad128:
      if (!fits_device<128, 128>()) return false;
      raise_smem_limit<128, 128, true>();
      return true;
    case Variant::pad256:
      if (!fits_device<256, 256>()) return false;
      raise_smem_limit<256, 256, true>();
      return true;
    default:
      return false;
  }
}

void post_attn_fused(const PostAttnParams& p, cudaStream_t stream, const PostAttnConfig& config) {
  validate(p);
  if (p.qkv_out && !p.qkv_in && !(config.split >= 8 && split_supported(p.D, p.F))) {
    throw std::invalid_argument(
        "hk::post_attn[cuda.fused]: qkv_out needs the column-split kernel of width 8 (D = F = 64 or 128)");
  }
  if (p.rows == 0) return;
  if (p.qkv_in) return p.D == 64 ? launch_attn<64>(p, stream) : launch_attn<128>(p, stream);
  if (config.split > 0 && split_supported(p.D, p.F)) {
    return p.D == 64 ? launch_split<64, 64>(p, stream, config) : launch_split<128, 128>(p, stream, config);
  }
  switch (pick_variant(p.D, p.F)) {
    case Variant::d64: return launch<64, 64, false>(p, stream, config);
    case Variant::d128: return launch<128, 128, false>(p, stream, config);
    case Variant::d256: return launch<256, 256, false>(p, stream, config);
    case Variant::pad128: return launch<128, 128, true>(p, stream, config);
    default: return launch<256, 256, true>(p, stream, config);
  }
}

void post_attn_fused(const PostAttnParams& p, cudaStream_t stream) { post_attn_fused(p, stream, PostAttnConfig{}); }

PostAttnConfig post_attn_fused_effective(int D, int F, int64_t rows, const PostAttnConfig& config) {
  if (!post_attn_fused_supports(D, F)) return PostAttnConfig{};
  if (config.split > 0 && split_supported(D, F)) {
    return D == 64 ? effective_split<64, 64>(rows, config) : effective_split<128, 128>(rows, config);
  }
  switch (pick_variant(D, F)) {
    case Variant::d64: return effective<64, 64, false>(rows, config);
    case Variant::d128: return effective<128, 128, false>(rows, config);
    case Variant::d256: return effective<256, 256, false>(rows, config);
    case Variant::pad128: return effective<128, 128, true>(rows, config);
    default: return effective<256, 256, true>(rows, config);
  }
}

std::vector<PostAttnConfig> post_attn_fused_candidates(int D, int F, int64_t rows, bool tanh_gelu) {
  if (!post_attn_fused_supports(D, F)) return {};
  rows = std::max<int64_t>(rows, 1);
  std::vector<PostAttnConfig> out;
  switch (pick_variant(D, F)) {
    case Variant::d64: out = candidates<64, 64, false>(rows, tanh_gelu); break;
    case Variant::d128: out = candidates<128, 128, false>(rows, tanh_gelu); break;
    case Variant::d256: out = candidates<256, 256, false>(rows, tanh_gelu); break;
    case Variant::pad128: out = candidates<128, 128, true>(rows, tanh_gelu); break;
    default: out = candidates<256, 256, true>(rows, tanh_gelu); break;
  }
  if (split_supported(D, F)) {
    if (D == 64) {
      split_candidates<64, 64>(rows, out);
    } else {
      split_candidates<128, 128>(rows, out);
    }
  }
  return out;
}

bool post_attn_qkv_supports(int D, int F) { return split_supported(D, F) && post_attn_fused_supports(D, F) &&
                                                   !post_attn_qkv_candidates(D, F, 1).empty(); }

std::vector<PostAttnConfig> post_attn_qkv_candidates(int D, int F, int64_t rows) {
  if (!split_supported(D, F) || !post_attn_fused_supports(D, F)) return {};
  rows = std::max<int64_t>(rows, 1);
  return D == 64 ? qkv_candidates<64, 64>(rows) : qkv_candidates<128, 128>(rows);
}

const char* post_attn_qkv_name(int D, int F) {
  if (!split_supported(D, F)) return "";
  return D == 64 ? "hk::post_attn[cuda.fused.d64.qkv]" : "hk::post_attn[cuda.fused.d128.qkv]";
}

namespace {
// (D, F, H) with an instantiation of the attention chain: D = F = 64 or 128 at attn_head_dim.
bool attn_instantiated(int D, int F, int H) {
  return split_supported(D, F) && H >= 1 && D % H == 0 &&
         D / H == (D == 64 ? attn_head_dim<64>() : attn_head_dim<128>());
}
}  // namespace

bool post_attn_attention_supports(int D, int F, int H, int S) {
  if (!attn_instantiated(D, F, H) || S < kWarpRows || S > kAttnMaxS || S % kWarpRows != 0) return false;
  if (!post_attn_fused_supports(D, F)) return false;
  return D == 64 ? attn_fits<64>(S) : attn_fits<128>(S);
}

const char* post_attn_attention_name(int D, int F, int H, bool qkv, bool front) {
  if (!attn_instantiated(D, F, H)) return "";
  if (front && qkv) return D == 64 ? "hk::post_attn[cuda.fused.d64.ln.qkv.attn.qkv]" : "hk::post_attn[cuda.fused.d128.ln.qkv.attn.qkv]";
  if (front) return "";
  if (D == 64) return qkv ? "hk::post_attn[cuda.fused.d64.attn.qkv]" : "hk::post_attn[cuda.fused.d64.attn]";
  return qkv ? "hk::post_attn[cuda.fused.d128.attn.qkv]" : "hk::post_attn[cuda.fused.d128.attn]";
}

bool post_attn_model_supports(int D, int F, int H, int S, int L) {
  if (L < 2 || L > kPostAttnModelMaxLayers || !post_attn_attention_supports(D, F, H, S)) return false;
  return (D == 64 ? model_smem_bytes<64>(S) : model_smem_bytes<128>(S)) <= size_t(device_limits().smem_optin);
}

const char* post_attn_model_name(int D, int F, int H) {
  if (!attn_instantiated(D, F, H)) return "";
  return D == 64 ? "hk::model[cuda.attn_chain.d64]" : "hk::model[cuda.attn_chain.d128]";
}

void post_attn_model(const PostAttnModelParams& m, cudaStream_t stream) {
  auto fail = [](const std::string& what) {
    throw std::invalid_argument("hk::model[cuda.attn_chain]: " + what);
  };
  if (m.L < 2 || m.L > kPostAttnModelMaxLayers) fail("L must be in [2, " + std::to_string(kPostAttnModelMaxLayers) + "]");
  const PostAttnParams& p0 = m.layer[0];
  for (int l = 0; l < m.L; ++l) {
    const PostAttnParams& p = m.layer[l];
    const std::string at = "layer " + std::to_string(l) + ": ";
    validate(p);
    if (!p.qkv_in) fail(at + "qkv_in is null (the attention in the chain)");
    if (!post_attn_model_supports(p.D, p.F, p.H, p.S, m.L)) fail(at + "unsupported D / F / H / S / L or device");
    if (p.rows != p0.rows || p.S != p0.S || p.D != p0.D || p.F != p0.F || p.H != p0.H || p.causal != p0.causal ||
        p.attn_scale != p0.attn_scale || p.lengths != p0.lengths || p.eps != p0.eps || p.qkv_in != p0.qkv_in) {
      fail(at + "rows, S, D, F, H, causal, attn_scale, lengths, eps and qkv_in must be those of layer 0");
    }
    if ((l == 0) != (p.w_qkv_front != nullptr)) fail(at + "layer 0 and only layer 0 has the front (w_qkv_front)");
    const bool last = l == m.L - 1;
    if (last ? (!p.tail || p.qkv_out) : (p.tail || p.qkv_out != p.qkv_in || p.h_out)) {
      fail(at + (last ? "the last layer is the tail, without qkv_out"
                      : "a layer before the last writes qkv_out over qkv_in (no tail, no h_out)"));
    }
  }
  if (p0.rows == 0) return;
  if (p0.D == 64) {
    raise_model_smem_limit<64>();
    launch_attn_clusters(post_attn_model_kernel<64>, p0, model_smem_bytes<64>(p0.S), stream, m);
  } else {
    raise_model_smem_limit<128>();
    launch_attn_clusters(post_attn_model_kernel<128>, p0, model_smem_bytes<128>(p0.S), stream, m);
  }
}

const char* post_attn_fused_name(int D, int F) {
  switch (pick_variant(D, F)) {
    case Variant::d64: return "hk::post_attn[cuda.fused.d64]";
    case Variant::d128: return "hk::post_attn[cuda.fused.d128]";
    case Variant::d256: return "hk::post_attn[cuda.fused.d256.stream]";
    case Variant::pad128: return "hk::post_attn[cuda.fused.pad128]";
    case Variant::pad256: return "hk::post_attn[cuda.fused.pad256.stream]";
    default: return "";
  }
}

}  // namespace hk::cuda
