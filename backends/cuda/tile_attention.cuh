// Attention of one 16-query tile for one head, by one warp, with the tile's q and every key and
// value of its sequence in shared memory (fp16, row-major, any row stride): the inner step of the
// whole-model kernels (model_persistent.cu). Online softmax over blocks of key tiles (running row
// max, exp2, P rounded to fp16 for P V, row sums by mma with kHalf2Ones), o = fp16(O / l) written
// over the tile's q columns of the head (only this warp reads them). Device-only; include from .cu
// files.
#pragma once

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "perm_col.hpp"
#include "ptx.cuh"

namespace hk::cuda {

// Lane addresses (shared, bytes) of one (query tile, sequence) pair at head 0, key tile 0.
struct TileAttention {
  uint32_t q;        // head_dim 8: row (lane & 15) of the tile at column 0; else the ldmatrix A
                     // address: row (lane & 15), column (lane >> 4) * 8
  uint32_t k, v;     // the lane's ldmatrix addresses of key tile 0 (see tile_attention())
  uint32_t kv_tile;  // bytes between key tiles (16 rows of K / V)
  uint32_t o;        // row g = lane / 4 of the tile's o at column 0
  uint32_t o_row8;   // bytes from row g to row g + 8 of o
  int o_perm;        // 0: o column c at c; else o is an A operand of K = o_perm in the k order of
                     // perm_col() (perm_col.hpp; model_persistent.cu's column kernel)
};

// Addresses of query tile `lt` (rows 16 lt .. of q_base) against the keys / values starting at
// k_base / v_base (row 0 = the sequence's first key); strides in halves. o over q (the caller may
// point o elsewhere afterwards).
template <int HD>
__device__ __forceinline__ TileAttention tile_attention(uint32_t q_base, int q_stride, uint32_t k_base,
                                                        uint32_t v_base, int kv_stride, int lt, int lane) {
  TileAttention p;
  const int g = lane >> 2;
  const int qrow = lt * 16 + (lane & 15);
  if constexpr (HD == 8) {
    p.q = q_base + uint32_t(qrow * q_stride) * 2u;
    p.k = k_base + uint32_t((lane & 15) * kv_stride) * 2u;
    p.v = v_base + uint32_t((lane & 15) * kv_stride) * 2u;
  } else {
    p.q = q_base + uint32_t(qrow * q_stride + (lane >> 4) * 8) * 2u;
    // K as the B operand of q k^T (matrices: keys 0-7 / d 0-7, keys 0-7 / d 8-15, keys 8-15 / d 0-7,
    // keys 8-15 / d 8-15); V transposed for P V (keys 0-7 / d 0-7, keys 8-15 / d 0-7, keys 0-7 /
    // d 8-15, keys 8-15 / d 8-15).
    p.k = k_base + uint32_t(((lane & 7) + ((lane >> 4) << 3)) * kv_stride + ((lane >> 3) & 1) * 8) * 2u;
    p.v = v_base + uint32_t(((lane & 7) + (((lane >> 3) & 1) << 3)) * kv_stride + (lane >> 4) * 8) * 2u;
  }
  p.kv_tile = uint32_t(16 * kv_stride) * 2u;
  p.o = q_base + uint32_t((lt * 16 + g) * q_stride) * 2u;
  p.o_row8 = uint32_t(8 * q_stride) * 2u;
  p.o_perm = 0;
  return p;
}

// Key tiles per softmax block: 64 keys keep the score block at 32 registers; head_dim 128: 32 keys
// (O alone is 64 registers).
template <int HD>
__host__ __device__ constexpr int tile_attention_key_block() {
  return HD >= 128 ? 2 : 4;
}

// o of head hh for query tile lt of a sequence of `len` valid keys (causal: key <= query).
// kHoldQ: q's A fragments held across the key loop (false: reloaded per key tile, for register
// pressure at head_dim 128); kKeyBlock: key tiles per softmax block (registers again). sl2 = softmax scale * log2(e).
template <int HD, bool kHoldQ = (HD < 128), int kKeyBlock = tile_attention_key_block<HD>()>
__device__ __forceinline__ void tile_attention_head(const TileAttention& p, int hh, int lt, int len, bool causal,
                                                    float sl2, int lane) {
  using namespace ptx;
  constexpr int ND = HD == 8 ? 1 : HD / 8;   // o n-tiles per head
  constexpr int QF = HD == 8 ? 1 : HD / 16;  // q A fragments per head
  const int g = lane >> 2, t = lane & 3;
  const int r0 = lt * 16 + g, r1 = r0 + 8;
  const int nkt = (len + 15) >> 4;
  const int nk = causal ? min(lt + 1, nkt) : nkt;  // key tiles this tile sees
  // Key j = kt*16 + n*8 + 2t + (e&1) of row r is allowed iff kt*16 + n*8 + (e&1) < lim[r].
  const int lim[2] = {(causal ? min(len, r0 + 1) : len) - 2 * t, (causal ? min(len, r1 + 1) : len) - 2 * t};
  uint32_t qf[kHoldQ ? QF : 1][4];
  if constexpr (HD == 8) {
    ldsm_x2(qf[0][0], qf[0][1], p.q + uint32_t(hh) * 16u);
  } else if constexpr (kHoldQ) {
#pragma unroll
    for (int ks = 0; ks < QF; ++ks) ldsm_x4(qf[ks], p.q + uint32_t(hh * HD + ks * 16) * 2u);
  }
  float o[ND][4];
#pragma unroll
  for (int j = 0; j < ND; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};   // running row max (raw score units)
  float lacc[4] = {0.f, 0.f, 0.f, 0.f};  // row sums by mma: [0] row g, [2] row g + 8
#pragma unroll 1
  for (int kb = 0; kb * kKeyBlock < nk; ++kb) {
    float s[2 * kKeyBlock][4];
#pragma unroll
    for (int kk = 0; kk < kKeyBlock; ++kk) {
      const int kt = kb * kKeyBlock + kk;
      if (kt < nk) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[2 * kk][e] = s[2 * kk + 1][e] = 0.f;
        if constexpr (HD == 8) {
          uint32_t b0, b1;
          ldsm_x2(b0, b1, p.k + uint32_t(kt) * p.kv_tile + uint32_t(hh) * 16u);
          mma_1688(s[2 * kk], qf[0][0], qf[0][1], b0);
          mma_1688(s[2 * kk + 1], qf[0][0], qf[0][1], b1);
        } else {
#pragma unroll
          for (int ks = 0; ks < QF; ++ks) {
            if constexpr (!kHoldQ) ldsm_x4(qf[0], p.q + uint32_t(hh * HD + ks * 16) * 2u);
            const uint32_t(&qa)[4] = qf[kHoldQ ? ks : 0];
            uint32_t b0, b1, b2, b3;
            ldsm_x4(b0, b1, b2, b3, p.k + uint32_t(kt) * p.kv_tile + uint32_t(hh * HD + ks * 16) * 2u);
            mma_16816(s[2 * kk], qa, b0, b1);
            mma_16816(s[2 * kk + 1], qa, b2, b3);
          }
        }
        // Masks only where the tile crosses the length or the diagonal (warp-uniform).
        if (kt * 16 + 16 > len || (causal && kt == lt)) {
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (kt * 16 + n * 8 + (e & 1) >= lim[e >> 1]) s[2 * kk + n][e] = -INFINITY;
        }
      }
    }
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int kk = 0; kk < kKeyBlock; ++kk) {
      if (kb * kKeyBlock + kk < nk) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          mx[0] = fmaxf(mx[0], fmaxf(s[2 * kk + n][0], s[2 * kk + n][1]));
          mx[1] = fmaxf(mx[1], fmaxf(s[2 * kk + n][2], s[2 * kk + n][3]));
        }
      }
    }
    float mb[2];  // max in exp2 units; 0 while a row has seen only masked keys
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      mb[r] = mx[r] == -INFINITY ? 0.f : mx[r] * sl2;
      const float alpha = ex2(m[r] * sl2 - mb[r]);
      m[r] = mx[r];
      lacc[2 * r] *= alpha;
#pragma unroll
      for (int dt = 0; dt < ND; ++dt) {
        o[dt][2 * r] *= alpha;
        o[dt][2 * r + 1] *= alpha;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kKeyBlock; ++kk) {
      const int kt = kb * kKeyBlock + kk;
      if (kt < nk) {
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[2 * kk + n][e] = ex2(fmaf(s[2 * kk + n][e], sl2, -mb[e >> 1]));
        // O += P V: the score accumulators of the tile's two key n-tiles form one A fragment.
        const uint32_t pa[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]), pack_half2(s[2 * kk][2], s[2 * kk][3]),
                                pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        mma_16816(lacc, pa, kHalf2Ones, kHalf2Ones);
        if constexpr (HD == 8) {
          uint32_t b0, b1;
          ldsm_x2_t(b0, b1, p.v + uint32_t(kt) * p.kv_tile + uint32_t(hh) * 16u);
          mma_16816(o[0], pa, b0, b1);
        } else {
#pragma unroll
          for (int dp = 0; dp < HD / 16; ++dp) {
            uint32_t b0, b1, b2, b3;
            ldsm_x4_t(b0, b1, b2, b3, p.v + uint32_t(kt) * p.kv_tile + uint32_t(hh * HD + dp * 16) * 2u);
            mma_16816(o[2 * dp], pa, b0, b1);
            mma_16816(o[2 * dp + 1], pa, b2, b3);
          }
        }
      }
    }
  }
  // o = fp16(O / l) over this head's q columns (every lane has read its q fragments).
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) inv[r] = lacc[2 * r] > 0.f ? 1.f / lacc[2 * r] : 0.f;
  __syncwarp();
#pragma unroll
  for (int dt = 0; dt < ND; ++dt) {
    const int col = hh * HD + dt * 8 + 2 * t;
    const uint32_t at = p.o + uint32_t(p.o_perm ? perm_col(col, p.o_perm) : col) * 2u;
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(pack_half2(o[dt][0] * inv[0], o[dt][1] * inv[0])) : "memory");
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at + p.o_row8), "r"(pack_half2(o[dt][2] * inv[1], o[dt][3] * inv[1]))
                 : "memory");
  }
}

}  // namespace hk::cuda
