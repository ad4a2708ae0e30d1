// QKV projection + attention in one kernel for S <= 128 (entry points: qkv_attention_fused.cuh).
//
// CTA = (block of sequences, query chunk, group of heads); 8 warps; grid x enumerates
//   ((sequence block * q_split) + query chunk) * groups + head group
// so CTAs that share a sequence's h tile run next to each other.
// Shared memory: sW [units][q|k|v][UC][D+8] fp16 (staged once), sH [rows][D+8] fp16 (the h rows of
// one pass: `pack` sequences of 16*ceil(S/16) rows each, <= 128 rows), sK, sV [rows][UC+8] fp16
// (one unit's keys and values), sBias [units][3][UC] fp32.
// A unit is the 16-column-or-wider slice the mma works on: one head (hd >= 16) or 16/hd heads
// (hd 8), so the projection never multiplies padding columns.
// Per pass (pack sequences) and unit, warp w owning tile w of the pass:
//   1. projects its 16 rows: k, v -> sK/sV (fp16), q -> registers (fp16 A fragments);
//   2. __syncthreads; the last unit's projection is also when the next pass's h is prefetched
//      into sH (cp.async), overlapping the attention below;
//   3. for each head of the unit: scores [16, 64 keys] in registers, masked, softmax (a second
//      key block, S > 64, rescales the first), P V, o stored.
#include "qkv_attention_fused.cuh"

#include "common.cuh"
#include "launch.hpp"
#include "ptx.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace hk::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kWarps = 8;                // one 16-row tile each: 128 rows = the largest S
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxTiles = kWarps;        // 16-row tiles per pass
constexpr int kMaxS = 16 * kMaxTiles;
// Key tiles per softmax block: 64 keys keep the score block at 32 registers; S = 128 takes two
// blocks with one running-max rescale between them (holding all 128 keys' scores spilled).
constexpr int kBlockTiles = 4;

// ---- per-head_dim table ------------------------------------------------------------------------
// kCols: columns of a unit (16/hd heads packed for hd 8). kChunk: projection columns per pass
// over D (accumulator registers = kChunk/2): 48 (hd <= 32) or 64 (hd 64, 128); 96 at hd 32 saves
// one reload of the h fragments but spills at the 128-register cap. kMinBlocks: 2 CTAs/SM
// (<= 128 registers: scores 32 + O hd/2 + Q hd/4) up to hd 32; hd 64 / 128 need more (~150 / ~220).
template <int HD> struct Unit {
  static constexpr int kCols = HD < 16 ? 16 : HD;
  static constexpr int kHeads = kCols / HD;
  static constexpr int kChunk = HD <= 32 ? 48 : 64;
  static constexpr int kMinBlocks = HD >= 64 ? 1 : 2;
  static_assert(HD == 8 || HD % 16 == 0, "head_dim instantiations are 8 or multiples of 16");
  static_assert((3 * kCols) % kChunk == 0 && kChunk % 16 == 0, "chunks of whole n-tile pairs");
};

int unit_cols(int hd) { return hd < 16 ? 16 : hd; }
int unit_heads(int hd) { return unit_cols(hd) / hd; }
int tiles_of(int S) { return (S + 15) / 16; }
// Sequences packed into one pass: as many whole sequences as fit in the 8 tiles, at most the
// CTA's sequence count.
int pack_of(int S, int seqs_per_cta) {
  const int fit = kMaxTiles / tiles_of(S);
  return fit < seqs_per_cta ? (fit < 1 ? 1 : fit) : seqs_per_cta;
}

struct FusedArgs {
  const __half* h;
  const __half* w;
  const __half* bias;
  __half* o;
  const int32_t* lengths;
  const int32_t* seq_start;  // null: dense rows b*S + s
  int B, S, D;
  float scale_log2;
  bool causal;
  int q_split, heads_per_cta, seqs_per_cta;
  int st;      // 16-row tiles per sequence
  int pack;    // sequences per pass
  int groups;  // H / heads_per_cta
};

// Shared-memory carve-up, in bytes (host and device agree on it).
struct Layout {
  size_t h, k, v, bias, total;  // offsets of sH, sK, sV, sBias (sW at 0) and the total
};
__host__ __device__ inline Layout layout(int uc, int D, int rows, int units) {
  Layout l;
  const size_t w_bytes = size_t(2) * units * 3 * uc * (D + 8);
  l.h = w_bytes;
  l.k = l.h + size_t(2) * rows * (D + 8);
  l.v = l.k + size_t(2) * rows * (uc + 8);
  l.bias = l.v + size_t(2) * rows * (uc + 8);
  l.total = l.bias + size_t(4) * units * 3 * uc;
  return l;
}

// ---- PTX wrappers -------------------------------------------------------------------------------
// cp.async, ldmatrix, mma.sync and friends: ptx.cuh.
using namespace ptx;

// f(std::integral_constant<int, 0>{}), ..., f(std::integral_constant<int, N - 1>{}): compile-time
// chunk indices for the projection's register arrays.
template <class F, int... I>
__device__ __forceinline__ void static_for_impl(F& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class F>
__device__ __forceinline__ void static_for(F&& f) {
  static_for_impl(f, std::make_integer_sequence<int, N>{});
}

__device__ __forceinline__ int seq_len(const FusedArgs& a, int b) {
  const int len = a.lengths ? a.lengths[b] : a.S;
  return len < 0 ? 0 : (len > a.S ? a.S : len);
}

// Row of position 0 of sequence b in h and o (layout contract: attention.hpp). 32 bits: token
// counts are int32 like seq_start (supports() checks B*S).
__device__ __forceinline__ int seq_row0(const FusedArgs& a, int b) {
  return a.seq_start ? a.seq_start[b] : b * a.S;
}

// ---- the kernel ---------------------------------------------------------------------------------
template <int HD>
__global__ void __launch_bounds__(kThreads, Unit<HD>::kMinBlocks) qkv_attention_kernel(const FusedArgs a) {
  constexpr int UC = Unit<HD>::kCols;
  constexpr int G = Unit<HD>::kHeads;
  constexpr int CH = Unit<HD>::kChunk;
  constexpr int NCH = 3 * UC / CH;
  constexpr int NP = (UC + CH - 1) / CH;  // chunks with q columns (the tile's own warp keeps them)
  constexpr int NF = NCH - NP;            // pure k / v chunks (any warp)
  constexpr int LDKV = UC + 8;            // 8 halves of padding: ldmatrix rows in distinct bank groups
  constexpr int ND = HD == 8 ? 1 : HD / 8;  // O n-tiles per head
  const int D = a.D;
  const int LDH = D + 8;
  const int units = a.heads_per_cta / G;
  const int seq_rows = a.st * 16;
  const int rows = a.pack * seq_rows;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const Layout L = layout(UC, D, rows, units);
  __half* sW = reinterpret_cast<__half*>(smem_raw);
  __half* sH = reinterpret_cast<__half*>(smem_raw + L.h);
  __half* sK = reinterpret_cast<__half*>(smem_raw + L.k);
  __half* sV = reinterpret_cast<__half*>(smem_raw + L.v);
  float* sB = reinterpret_cast<float*>(smem_raw + L.bias);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates: row group, thread in quad

  int bid = blockIdx.x;
  const int hg = bid % a.groups;
  bid /= a.groups;
  const int qc = bid % a.q_split;
  const int seq0 = (bid / a.q_split) * a.seqs_per_cta;
  const int seq_end = seq0 + min(a.B - seq0, a.seqs_per_cta);  // no int overflow for huge seqs_per_cta
  const int qtiles = (a.st + a.q_split - 1) / a.q_split;
  const int qt0 = qc * qtiles, qt1 = min(a.st, qt0 + qtiles);  // this CTA's query tiles
  const int head0 = hg * a.heads_per_cta;
  const int kchunks = D / 8;  // 16-byte chunks per row
  // Copies of row-major [rows][D] tiles: thread tid moves chunk cc_t of rows rr_t, rr_t + rpi, ...
  // (rpi rows per sweep; threads past rpi * kchunks idle when kchunks does not divide kThreads).
  // The row loops then need no division per chunk, which the copies' address arithmetic otherwise
  // spends most of its instructions on.
  const int rpi = kThreads / kchunks;
  const int rr_t = tid / kchunks, cc_t = tid - rr_t * kchunks;
  const bool copier = rr_t < rpi;

  // Weights and biases of this CTA's heads, unit by unit, q | k | v rows of each.
  if (copier) {
    for (int r = rr_t; r < units * 3 * UC; r += rpi) {
      const int u = r / (3 * UC), part = (r % (3 * UC)) / UC, cc = r % UC;  // UC is a compile-time constant
      const int64_t grow = int64_t(part) * D + int64_t(head0) * HD + u * UC + cc;
      cp_async_16(smem_u32(sW + r * LDH + cc_t * 8), a.w + grow * D + cc_t * 8, 16);
    }
  }
  for (int r = tid; r < units * 3 * UC; r += kThreads) {
    const int u = r / (3 * UC), part = (r % (3 * UC)) / UC, cc = r % UC;
    sB[r] = __half2float(a.bias[int64_t(part) * D + int64_t(head0) * HD + u * UC + cc]);
  }

  // h rows of the pass starting at sequence `first`: rows the pass needs as keys (and hence as
  // queries) are copied, every other row of the pass is zero-filled so all projected values stay
  // finite (a NaN v row would survive P = 0). Only positions s < len are ever read, which is what
  // the packed layout requires (the next sequence starts at position len).
  // The sequence slot and position of this thread's first row; later rows step by rpi.
  const int i_t = rr_t / seq_rows, s_t = rr_t - i_t * seq_rows;
  auto load_h = [&](int first) {
    if (copier) {
      int i = i_t, s = s_t, lim = 0;
      int64_t row0 = 0;
      for (int r = rr_t, cur = -1; r < rows; r += rpi) {
        if (i != cur) {  // a new sequence: its row limit and first row, read once
          cur = i;
          const int b = first + i;
          lim = 0;
          if (b < seq_end) {
            const int len = seq_len(a, b);
            lim = a.causal ? min(len, qt1 * 16) : len;
            row0 = seq_row0(a, b);
          }
        }
        const bool ok = s < lim;
        cp_async_16(smem_u32(sH + r * LDH + cc_t * 8), ok ? a.h + (row0 + s) * D + cc_t * 8 : a.h, ok ? 16 : 0);
        for (s += rpi; s >= seq_rows; s -= seq_rows) ++i;
      }
    }
    cp_async_commit();
  };
  pdl_launch_dependents();
  pdl_wait();  // launch_pdl: the weights above are staged before the previous kernel ends
  load_h(seq0);

  const float sl2 = a.scale_log2;
  const int i_seq = warp / a.st, lt = warp - (warp / a.st) * a.st;  // this warp's sequence slot and tile
  // Per-lane ldmatrix byte offsets (fragment layouts of mma.m16n8k16): A rows of this warp's
  // tile, B rows of W / K (non-transposed), V (transposed) relative to the sequence's first key.
  const uint32_t a_base = smem_u32(sH + (lane & 15) * LDH + (lane >> 4) * 8);  // + 16 rows per pass tile
  const uint32_t w_lane = (((lane & 7) + ((lane >> 4) << 3)) * LDH + ((lane >> 3) & 1) * 8) * 2;
  const int kv_row0 = i_seq * seq_rows;
  const uint32_t k_addr = smem_u32(sK + (kv_row0 + (lane & 7) + ((lane >> 4) << 3)) * LDKV + ((lane >> 3) & 1) * 8);
  const uint32_t v_addr = smem_u32(sV + (kv_row0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * LDKV + (lane >> 4) * 8);
  const uint32_t k8_addr = smem_u32(sK + (kv_row0 + (lane & 15)) * LDKV);  // hd 8: 16 keys x 8 columns
  const uint32_t v8_addr = smem_u32(sV + (kv_row0 + (lane & 15)) * LDKV);

  for (int first = seq0; first < seq_end; first += a.pack) {
    cp_async_wait_all();
    __syncthreads();

    const int b = first + i_seq;
    const bool has_tile = warp < a.pack * a.st && b < seq_end;
    const int len = has_tile ? seq_len(a, b) : 0;
    const int kend = a.causal ? min(len, qt1 * 16) : len;
    const bool in_chunk = has_tile && lt >= qt0 && lt < qt1;
    const bool need_q = in_chunk && lt * 16 < len;
    const bool need_kv = has_tile && lt * 16 < kend;

    // Query tiles of this chunk that are all padding: zeros for every head of the CTA (dense
    // layout only: packed, these positions belong to the next sequence).
    if (in_chunk && !need_q && !a.seq_start) {
      const int row0 = seq_row0(a, b);
      const int r_end = min(a.S - lt * 16, 16);
      const int cpr = a.heads_per_cta * HD / 8;  // 16-byte chunks per row
      for (int idx = lane; idx < r_end * cpr; idx += 32) {
        const int r = idx / cpr, c = idx - (idx / cpr) * cpr;
        *reinterpret_cast<uint4*>(a.o + (int64_t(row0) + lt * 16 + r) * D + head0 * HD + c * 8) =
            make_uint4(0, 0, 0, 0);
      }
    }

    // Projection work of the pass. Chunks 0..NP-1 hold q columns and stay with the tile's own warp
    // (q lives in its registers); the pure k / v chunks NP..NCH-1 of every tile that is needed as
    // keys are dealt round-robin, first to warps with no tile work of their own (padding tiles,
    // short sequences), then to the others, so that the barrier after the projection waits for
    // about the mean warp's work instead of the longest (every warp computes the same masks).
    uint32_t kv_tiles = 0, own_tiles = 0;  // bit = pass tile: needs k / v; its own warp projects
    int free_pos = 0, free_items = 0;
    if constexpr (NF > 0) {
      for (int i = 0, tile = 0; i < a.pack && first + i < seq_end; ++i) {
        const int li = seq_len(a, first + i);
        const int ke = a.causal ? min(li, qt1 * 16) : li;
        for (int l = 0; l < a.st; ++l, ++tile) {
          const bool kv = l * 16 < ke;
          const bool q = l >= qt0 && l < qt1 && l * 16 < li;
          kv_tiles |= uint32_t(kv) << tile;
          own_tiles |= uint32_t(kv || q) << tile;
        }
      }
      const uint32_t idle = ~own_tiles & ((1u << kWarps) - 1);
      const uint32_t below = (1u << warp) - 1;
      free_pos = (idle >> warp & 1u) ? __popc(idle & below) : __popc(idle) + __popc(own_tiles & below);
      free_items = __popc(kv_tiles) * NF;
    }

    for (int u = 0; u < units; ++u) {
      uint32_t qf[UC / 16][4];  // q of this tile and unit: A fragments, k16 slice by slice
      const uint32_t w_addr = smem_u32(sW + u * 3 * UC * LDH) + w_lane;
      const float* bias = sB + u * 3 * UC;

      // Chunk CHC (compile time) of pass tile `tile`: its 16 rows onto the chunk's CH unit columns,
      // + bias, rounded to fp16: q into A fragments (own tile only), k and v into the tile's rows of
      // sK/sV.
      auto project = [&](int tile, auto chc) {
        constexpr int ch = decltype(chc)::value;
        const uint32_t at = a_base + uint32_t(tile * 16 * LDH * 2);
        float acc[CH / 8][4];
#pragma unroll
        for (int i = 0; i < CH / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll 1  // unrolling spills at the 128-register cap (hd 32)
        for (int ks = 0; ks < D / 16; ++ks) {
          uint32_t af[4];
          ldsm_x4(af[0], af[1], af[2], af[3], at + ks * 32);
#pragma unroll
          for (int np = 0; np < CH / 16; ++np) {
            uint32_t b0, b1, b2, b3;
            ldsm_x4(b0, b1, b2, b3, w_addr + ((ch * CH + np * 16) * LDH + ks * 16) * 2);
            mma_16816(acc[2 * np], af, b0, b1);
            mma_16816(acc[2 * np + 1], af, b2, b3);
          }
        }
#pragma unroll
        for (int nt = 0; nt < CH / 8; ++nt) {
          const int col = ch * CH + nt * 8;  // unit column of this n-tile (compile-time after unrolling)
          const float bl = bias[col + 2 * t], bh = bias[col + 2 * t + 1];
          const uint32_t lo = pack_half2(acc[nt][0] + bl, acc[nt][1] + bh);
          const uint32_t hi = pack_half2(acc[nt][2] + bl, acc[nt][3] + bh);
          if (col < UC) {
            qf[col / 16][2 * ((col % 16) / 8)] = lo;
            qf[col / 16][2 * ((col % 16) / 8) + 1] = hi;
          } else {
            __half* dst = (col < 2 * UC ? sK : sV) + (tile * 16 + g) * LDKV + (col % UC) + 2 * t;
            *reinterpret_cast<uint32_t*>(dst) = lo;
            *reinterpret_cast<uint32_t*>(dst + 8 * LDKV) = hi;
          }
        }
      };

      // 1. Projection: this warp's own chunks, then its share of the k / v chunks.
      if (need_q || need_kv) {
        static_for<NP>([&](auto chc) {
          constexpr int ch = decltype(chc)::value;
          constexpr bool has_q = ch * CH < UC, has_kv = ch * CH + CH > UC;
          if ((has_q && need_q) || (has_kv && need_kv)) project(warp, chc);
        });
      }
      if constexpr (NF > 0) {
        for (int k = free_pos; k < free_items; k += kWarps) {
          const int nth = k / NF, f = k - (k / NF) * NF;  // NF is a compile-time constant
          uint32_t m = kv_tiles;
          for (int n = 0; n < nth; ++n) m &= m - 1;
          const int tile = __ffs(int(m)) - 1;
          static_for<NF>([&](auto fc) {
            if (decltype(fc)::value == f) project(tile, std::integral_constant<int, NP + decltype(fc)::value>{});
          });
        }
      }
      __syncthreads();  // every tile's k and v of this unit are in sK/sV; sH is no longer read
      if (u == units - 1 && first + a.pack < seq_end) load_h(first + a.pack);

      // 2. Attention of this warp's 16 query rows, head by head of the unit. Keys go in blocks of
      //    kBlockTiles 16-key tiles; a second block (S > 64) rescales the first one's O and sum.
      if (need_q) {
        const int nk = a.causal ? min(lt + 1, (len + 15) / 16) : (len + 15) / 16;  // key tiles
        const int qi0 = lt * 16 + g;                                               // rows qi0, qi0 + 8
        // Key j = kt*16 + n*8 + 2t + (e&1) of row r is allowed iff kt*16 + n*8 + (e&1) < lim[r].
        const int lim[2] = {(a.causal ? min(len, qi0 + 1) : len) - 2 * t,
                            (a.causal ? min(len, qi0 + 9) : len) - 2 * t};
#pragma unroll
        for (int j = 0; j < G; ++j) {
          float o[ND][4];
#pragma unroll
          for (int dt = 0; dt < ND; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
          float m[2] = {-INFINITY, -INFINITY};  // running row max (raw score units), rows g and g+8
          float lacc[4] = {0.f, 0.f, 0.f, 0.f};  // row sums by mma (ptx.cuh kHalf2Ones): [0] row g, [2] row g + 8
#pragma unroll 1
          for (int kb = 0; kb * kBlockTiles < nk; ++kb) {
            float s[2 * kBlockTiles][4];
#pragma unroll
            for (int kk = 0; kk < kBlockTiles; ++kk) {
              const int kt = kb * kBlockTiles + kk;
              if (kt < nk) {
#pragma unroll
                for (int e = 0; e < 4; ++e) s[2 * kk][e] = s[2 * kk + 1][e] = 0.f;
                if constexpr (HD == 8) {
                  uint32_t b0, b1;
                  ldsm_x2(b0, b1, k8_addr + (kt * 16 * LDKV + j * 8) * 2);
                  mma_1688(s[2 * kk], qf[0][2 * j], qf[0][2 * j + 1], b0);
                  mma_1688(s[2 * kk + 1], qf[0][2 * j], qf[0][2 * j + 1], b1);
                } else {
#pragma unroll
                  for (int ks = 0; ks < HD / 16; ++ks) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4(b0, b1, b2, b3, k_addr + (kt * 16 * LDKV + ks * 16) * 2);
                    mma_16816(s[2 * kk], qf[ks], b0, b1);
                    mma_16816(s[2 * kk + 1], qf[ks], b2, b3);
                  }
                }
                // Masks only where the tile crosses the length or the diagonal (warp-uniform test).
                if (kt * 16 + 16 > len || (a.causal && kt == lt)) {
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
            for (int kk = 0; kk < kBlockTiles; ++kk) {
              if (kb * kBlockTiles + kk < nk) {
#pragma unroll
                for (int n = 0; n < 2; ++n) {
                  mx[0] = fmaxf(mx[0], fmaxf(s[2 * kk + n][0], s[2 * kk + n][1]));
                  mx[1] = fmaxf(mx[1], fmaxf(s[2 * kk + n][2], s[2 * kk + n][3]));
                }
              }
            }
            float mb[2];  // max in exp2 units; 0 while a row has seen only masked keys (no inf - inf)
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
            for (int kk = 0; kk < kBlockTiles; ++kk) {
              const int kt = kb * kBlockTiles + kk;
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
                  ldsm_x2_t(b0, b1, v8_addr + (kt * 16 * LDKV + j * 8) * 2);
                  mma_16816(o[0], pa, b0, b1);
                } else {
#pragma unroll
                  for (int dp = 0; dp < HD / 16; ++dp) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4_t(b0, b1, b2, b3, v_addr + (kt * 16 * LDKV + dp * 16) * 2);
                    mma_16816(o[2 * dp], pa, b0, b1);
                    mma_16816(o[2 * dp + 1], pa, b2, b3);
                  }
                }
              }
            }
          }
          // Normalise and store; query rows >= len get zeros (dense) or are not part of o (packed),
          // rows >= S do not exist.
          // Row 0 is looked up here rather than kept live through the loop: one register less
          // keeps hd 32 within the 128-register cap of 2 CTAs/SM.
          __half* ob = a.o + int64_t(seq_row0(a, b)) * D + (head0 + u * G + j) * HD + 2 * t;
          const int row_end = a.seq_start ? len : a.S;  // positions of this sequence that exist in o
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int qi = qi0 + 8 * r;
            if (qi >= row_end) continue;
            const bool valid = qi < len;
            const float inv = lacc[2 * r] > 0.f ? 1.f / lacc[2 * r] : 0.f;
            __half* row = ob + int64_t(qi) * D;
#pragma unroll
            for (int dt = 0; dt < ND; ++dt)
              *reinterpret_cast<__half2*>(row + dt * 8) =
                  valid ? __floats2half2_rn(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv) : __floats2half2_rn(0.f, 0.f);
          }
        }
      }
      __syncthreads();  // sK/sV are rewritten by the next unit or pass
    }
  }
  cp_async_wait_all();
}

// ---- launch layer -------------------------------------------------------------------------------
struct DeviceInfo {
  int sms = 0;
  size_t smem_optin = 0;   // per-block limit with the opt-in attribute
  size_t smem_per_sm = 0;
};

// The current device at first use (the backend runs on one device per process). Without a usable
// device everything stays 0, so supports() answers false instead of throwing.
const DeviceInfo& device_info() {
  static const DeviceInfo info = [] {
    DeviceInfo d;
    int dev = 0, sms = 0, optin = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess) {
      cudaGetLastError();  // clear the non-sticky error
      return d;
    }
    d.sms = sms;
    d.smem_optin = size_t(optin);
    d.smem_per_sm = size_t(per_sm);
    return d;
  }();
  return info;
}

// Raises every instantiation's dynamic shared-memory limit to the device's opt-in maximum, once.
void ensure_smem_limits() {
  static const bool done = [] {
    const int bytes = static_cast<int>(device_info().smem_optin);
    HK_CUDA_CHECK(cudaFuncSetAttribute(qkv_attention_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    HK_CUDA_CHECK(cudaFuncSetAttribute(qkv_attention_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    HK_CUDA_CHECK(cudaFuncSetAttribute(qkv_attention_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    HK_CUDA_CHECK(cudaFuncSetAttribute(qkv_attention_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    HK_CUDA_CHECK(cudaFuncSetAttribute(qkv_attention_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)done;
}

bool head_dim_supported(int hd) { return hd == 8 || hd == 16 || hd == 32 || hd == 64 || hd == 128; }
bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

size_t smem_bytes(const QkvAttentionParams& p, const QkvAttentionMap& m) {
  const int rows = pack_of(p.S, m.seqs_per_cta) * tiles_of(p.S) * 16;
  return layout(unit_cols(p.head_dim), p.D, rows, m.heads_per_cta / unit_heads(p.head_dim)).total;
}

int64_t grid_of(const QkvAttentionParams& p, const QkvAttentionMap& m) {
  return (int64_t(p.B) + m.seqs_per_cta - 1) / m.seqs_per_cta * m.q_split * (p.H / m.heads_per_cta);
}

bool shape_supported(const QkvAttentionParams& p) {
  if (p.B < 0 || p.S < 1 || p.S > kMaxS || p.H < 1 || !head_dim_supported(p.head_dim)) return false;
  if (int64_t(p.B) * p.S > INT_MAX) return false;  // row indices are int32 (seq_row0)
  if (int64_t(p.H) * p.head_dim != p.D || p.D % 16 != 0) return false;
  if (p.B > 0) {
    if (!p.h || !p.w_qkv || !p.b_qkv || !p.o) return false;
    if (!aligned16(p.h) || !aligned16(p.w_qkv) || !aligned16(p.o)) return false;
  }
  return true;
}

bool map_supported(const QkvAttentionParams& p, const QkvAttentionMap& m) {
  const int uh = unit_heads(p.head_dim);
  if (m.q_split < 1 || m.q_split > tiles_of(p.S)) return false;
  if (m.heads_per_cta < uh || p.H % m.heads_per_cta != 0 || m.heads_per_cta % uh != 0) return false;
  if (m.seqs_per_cta < 1) return false;
  if (grid_of(p, m) > INT_MAX) return false;
  return smem_bytes(p, m) <= device_info().smem_optin;
}

FusedArgs make_args(const QkvAttentionParams& p, const QkvAttentionMap& m) {
  FusedArgs a;
  a.h = p.h;
  a.w = p.w_qkv;
  a.bias = p.b_qkv;
  a.o = p.o;
  a.lengths = p.lengths;
  a.seq_start = p.seq_start;
  a.B = p.B;
  a.S = p.S;
  a.D = p.D;
  a.scale_log2 = p.scale * kLog2e;
  a.causal = p.causal;
  a.q_split = m.q_split;
  a.heads_per_cta = m.heads_per_cta;
  a.seqs_per_cta = m.seqs_per_cta;
  a.st = tiles_of(p.S);
  a.pack = pack_of(p.S, m.seqs_per_cta);
  a.groups = p.H / m.heads_per_cta;
  return a;
}

template <int HD>
void launch(const QkvAttentionParams& p, const QkvAttentionMap& m, cudaStream_t stream) {
  launch_pdl(qkv_attention_kernel<HD>, dim3(unsigned(grid_of(p, m))), dim3(kThreads), smem_bytes(p, m), stream,
             make_args(p, m));
  HK_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool qkv_attention_fused_supports(const QkvAttentionParams& p, const QkvAttentionMap& m) {
  if (!shape_supported(p) || !map_supported(p, m)) return false;
  ensure_smem_limits();
  return true;
}

// Candidates, default first:
//   default      one unit of heads, short sequences packed into one CTA (the seed's (S, 1, 1))
//   heads        more heads per CTA: h loaded once for several heads (many heads, hd 8)
//   sequences    2x..16x more sequences per CTA, and a persistent map of about one wave: Wqkv
//                staged once for many sequences (large B)
//   query split  2, 4, 8 CTAs per sequence when the default grid leaves SMs idle (small B)
std::vector<QkvAttentionMap> qkv_attention_fused_candidates(const QkvAttentionParams& p) {
  std::vector<QkvAttentionMap> out;
  if (!shape_supported(p)) return out;
  auto add = [&](int q, int hpc, int spc) {
    const QkvAttentionMap m{q, hpc, spc};
    if (!map_supported(p, m)) return;
    for (const QkvAttentionMap& x : out)
      if (x.q_split == q && x.heads_per_cta == hpc && x.seqs_per_cta == spc) return;
    out.push_back(m);
  };
  const int uh = unit_heads(p.head_dim);
  const int pack = pack_of(p.S, INT_MAX);
  const int B = p.B > 0 ? p.B : 1;
  const int sms = device_info().sms;
  add(1, uh, pack);

  std::vector<int> hpcs;  // multiples of the unit that divide H, ascending
  for (int h = uh; h <= p.H; h += uh)
    if (p.H % h == 0) hpcs.push_back(h);
  for (int h : hpcs) add(1, h, pack);

  for (int h : {hpcs.front(), hpcs.back()}) {
    for (int f : {2, 4, 8, 16})
      if (int64_t(pack) * f < B) add(1, h, pack * f);
    // Persistent: about one wave of CTAs (two per SM where shared memory allows).
    const QkvAttentionMap one{1, h, pack};
    const size_t per_cta = smem_bytes(p, one) + 1024;
    const int resident = per_cta * 2 <= device_info().smem_per_sm ? 2 : 1;
    const int64_t groups = p.H / h;
    const int64_t blocks = std::max<int64_t>(1, int64_t(sms) * resident / groups);
    int64_t spc = (B + blocks - 1) / blocks;
    spc = (spc + pack - 1) / pack * pack;
    if (spc > pack) add(1, h, int(spc));
  }

  const int64_t default_ctas = grid_of(p, QkvAttentionMap{1, uh, pack});
  if (default_ctas < sms)
    for (int q : {2, 4, 8}) add(q, uh, 1);
  return out;
}

void qkv_attention_fused(const QkvAttentionParams& p, const QkvAttentionMap& m, cudaStream_t stream) {
  if (!qkv_attention_fused_supports(p, m))
    throw std::invalid_argument("hk::qkv_attention[cuda.fused]: unsupported parameters or map");
  if (p.B == 0) return;
  switch (p.head_dim) {
    case 8: return launch<8>(p, m, stream);
    case 16: return launch<16>(p, m, stream);
    case 32: return launch<32>(p, m, stream);
    case 64: return launch<64>(p, m, stream);
    default: return launch<128>(p, m, stream);
  }
}

std::string qkv_attention_fused_name(const QkvAttentionParams& p, const QkvAttentionMap& m) {
  return "hk::qkv_attention[cuda.fused.hd" + std::to_string(p.head_dim) + ".q" + std::to_string(m.q_split) + "h" +
         std::to_string(m.heads_per_cta) + "b" + std::to_string(m.seqs_per_cta) + "]";
}

}  // namespace hk::cuda
