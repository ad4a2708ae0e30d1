// Own flash-attention kernels of the CUDA backend (entry points in attention_flash.cuh).
//
// One thread block computes a tile of query rows of one (sequence, head) and streams the key
// tiles through shared memory with an online softmax, so the [S, S] score matrix never exists.
//   flash_f16_kernel<HD, NW>: NW warps x 16 query rows, mma.sync tensor cores, K/V tiles loaded
//                             with cp.async into a double buffer.
//   flash_f32_kernel<HDP>:    32 query rows x 32 keys per step, plain fp32 FMAs.
// Grid: x = b * H + h, y = query tile, heaviest (last, under causal) tiles first.
#include "attention_flash.cuh"

#include "common.cuh"
#include "launch.hpp"
#include "ptx.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <type_traits>

namespace hk::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// ---- tile tables --------------------------------------------------------------------------------
// f16: BK = keys per pipeline stage; q_in_regs = Q fragments held in registers for the whole key
// loop (else re-read from shared memory by ldmatrix for every key tile). Per-warp registers are
// about HD/2 (O accumulator) + BK/2 (scores) + HD/4 (Q, when in registers) fp32/b32 values.
template <int HD> struct F16Tile;
template <> struct F16Tile<8>   { static constexpr int kBK = 64; static constexpr bool kQInRegs = true;  };  // ex2-bound (16 MACs per score): 64 keys amortise the max/sum shuffles; QK^T by m16n8k8, no zero k half
template <> struct F16Tile<16>  { static constexpr int kBK = 64; static constexpr bool kQInRegs = true;  };  // ex2-bound as hd 8; K+V stage 6 KB, ~80 regs: 6 blocks/SM
template <> struct F16Tile<32>  { static constexpr int kBK = 64; static constexpr bool kQInRegs = true;  };  // 64 keys = half of S=128, so causal skips the upper tile whole; <= 80 regs (kMinWarps), 25 KB (q64)
template <> struct F16Tile<64>  { static constexpr int kBK = 64; static constexpr bool kQInRegs = true;  };  // ~130 regs (O 32 + S 32 + Q 16): 3 blocks/SM; 45 KB stays under the 48 KB default
template <> struct F16Tile<128> { static constexpr int kBK = 64; static constexpr bool kQInRegs = true;  };  // ~170 regs; 17 + 2x35 KB = 87 KB (q64): 2 blocks/SM, smem-limited
template <> struct F16Tile<256> { static constexpr int kBK = 32; static constexpr bool kQInRegs = false; };  // O alone is 128 regs, so Q is re-read from smem; 32-key stages keep 101 KB (q64): 2 blocks/SM

// Warps per SM the register allocation must leave room for (__launch_bounds__): the small head
// dims are issue-bound on short sequences and keep the occupancy their registers allowed before
// the key step had two copies (which made the compiler take 8-16 more): hd 8 64 registers (8 q64
// CTAs per SM), hd 16 80 (6: at 72 it spills), hd 32 80 (6), hd 64 128 (4). hd 128 / 256: shared
// memory limits them to 2 CTAs anyway. The key-split kernels (KS > 1) the same, but hd 32 at 96
// (5 CTAs: at 80 their combine step spills); sm_80 code of hd 16 / 32 also at 96 (it spills at 80).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr int kMinWarpsHd16To32 = 20;
#else
constexpr int kMinWarpsHd16To32 = 24;
#endif
template <int HD, int KS> constexpr int f16_min_warps() {
  return HD == 8    ? 32
         : HD == 16 ? kMinWarpsHd16To32
         : HD == 32 ? (KS == 1 ? kMinWarpsHd16To32 : 20)
         : HD == 64 ? 16
                    : 0;
}
// Head groups (G > 1 heads of one sequence per CTA; hd 8 x 4): a warp's state for the tile's G row
// units (O, running max, row sums, Q fragments) stays live across the key loop and the unrolled
// units overlap: unbounded 124 registers (4 CTAs per SM); bounded to 96 (5 CTAs per SM) with 16
// bytes of spills, measured faster on the H200 (case 11 per layer 0.0604 vs 0.0650 ms); at 80 it
// spills 112 bytes.
template <int HD, int KS, int G> constexpr int f16_min_warps_grouped() {
  return G == 1 ? f16_min_warps<HD, KS>() : 20;
}
template <int HD, int NW, int KS, int G = 1> constexpr int f16_min_blocks() {
  return f16_min_warps_grouped<HD, KS, G>() / NW > 1 ? f16_min_warps_grouped<HD, KS, G>() / NW : 1;
}

// Row stride (halves) of the shared tiles. 8 halves of padding put the 8 rows an ldmatrix reads
// into 8 different 16-byte bank groups; hd 8 rows (16 bytes) are conflict-free unpadded.
template <int HD> __host__ __device__ constexpr int f16_ld() { return HD == 8 ? 8 : HD + 8; }

template <int HD, int NW, int G = 1>
constexpr size_t f16_smem_bytes() {  // Q + 2 x (K, V) of G heads
  return sizeof(__half) * size_t(f16_ld<G * HD>()) * (16 * NW + 4 * F16Tile<HD>::kBK);
}

// f32: fixed 32 query rows x 32 keys per step and 128 threads (each thread: 2 rows x 4 keys of
// scores, 2 rows x HDP/8 columns of O). HDP is the head_dim bucket; smem = Q, K (padded by one
// float against bank conflicts), V and P tiles.
constexpr int kF32BQ = 32;
constexpr int kF32BK = 32;
constexpr int kF32Threads = 128;
template <int HDP>
constexpr size_t f32_smem_bytes() {
  return sizeof(float) * (size_t(kF32BQ + kF32BK) * (HDP + 1) + size_t(kF32BK) * HDP + kF32BQ * (kF32BK + 1));
}

// Kernel arguments: AttentionParams plus derived values, passed by value.
struct FlashArgs {
  const void* qkv;
  void* out;
  const int32_t* lengths;
  const int32_t* seq_start;
  int S, H, hd;
  int64_t qkv_stride, out_stride;
  float scale;       // f32 kernel: 1/sqrt(hd)-style score scale
  float scale_log2;  // f16 kernel: scale * log2(e), so exp(x*scale) = exp2(x*scale_log2)
  bool causal;
};

// Per-block view of one (sequence, head): where its rows are and how many are valid.
struct SeqHead {
  int b, h, len;
  int64_t row0;  // qkv/out row of position 0
};

// blockIdx.x = b * groups + h: h is the head (groups = H) or the head group of G heads (H / G).
__device__ __forceinline__ SeqHead seq_head(const FlashArgs& a, int groups) {
  SeqHead r;
  r.b = blockIdx.x / groups;
  r.h = blockIdx.x - r.b * groups;
  const int len = a.lengths ? a.lengths[r.b] : a.S;
  r.len = len < 0 ? 0 : (len > a.S ? a.S : len);
  r.row0 = a.seq_start ? int64_t(a.seq_start[r.b]) : int64_t(r.b) * a.S;
  return r;
}

// ---- PTX wrappers -------------------------------------------------------------------------------
// cp.async, ldmatrix, mma.sync and friends: ptx.cuh.
using namespace ptx;

// ---- f16 tensor-core kernel ---------------------------------------------------------------------
// Copies ROWS rows (positions pos0..) of one head's HD columns into a shared tile with cp.async.
// Rows at positions >= len and columns >= hd are zero-filled and never read from global memory.
template <int ROWS, int HD, int NT>
__device__ __forceinline__ void load_tile_f16(__half* dst, const __half* col0, int64_t row0, int64_t stride,
                                              int pos0, int len, int hd) {
  constexpr int kChunks = HD / 8;            // 16-byte chunks per row: a power of two <= 32
  constexpr int kRowStep = NT / kChunks;     // rows covered by one pass of the block
  constexpr int LD = f16_ld<HD>();
  static_assert(NT % kChunks == 0, "every thread keeps one chunk column");
  const int c = threadIdx.x % kChunks;
  const int r0 = threadIdx.x / kChunks;
  const bool col_ok = c * 8 < hd;
  const __half* src = col0 + (row0 + pos0 + r0) * stride + c * 8;
  uint32_t d = smem_u32(dst + r0 * LD + c * 8);
  // Not unrolled: unrolled copies get their addresses hoisted out of the key loop into registers.
#pragma unroll 1
  for (int r = r0; r < ROWS; r += kRowStep) {
    const bool ok = col_ok && pos0 + r < len;
    cp_async_16(d, ok ? src : col0, ok ? 16 : 0);
    src += kRowStep * stride;
    d += kRowStep * LD * 2;
  }
}

// Zeros for `rows` query rows of this head (G heads: head group) starting at position pos0 (dense
// layout padding).
template <int HD, int NT, int G = 1>
__device__ __forceinline__ void store_zero_rows_f16(__half* out, const FlashArgs& a, const SeqHead& sh, int pos0,
                                                    int rows, int tid) {
  constexpr int kChunks = G * HD / 8;
  for (int idx = tid; idx < rows * kChunks; idx += NT) {
    const int r = idx / kChunks, c = idx % kChunks;
    if (pos0 + r < a.S && c * 8 < G * a.hd) {
      *reinterpret_cast<uint4*>(out + (sh.row0 + pos0 + r) * a.out_stride + sh.h * G * a.hd + c * 8) =
          make_uint4(0, 0, 0, 0);
    }
  }
}

// The end of a key-split CTA (flash_f16_kernel, KS > 1): publishes its partial softmax state in
// its shared memory (O unnormalised [BQ][HD] fp32 over the K/V stages, which are free now; row
// max m in raw score units and row sum l [BQ] each), then combines rows [rank * BQ/KS, ...) of
// the tile from all KS CTAs: M = max m_r, w_r = 2^((m_r - M) scale log2e), O = sum w_r O_r /
// sum w_r l_r. Ranks without keys (or rows without any: m = -inf) have w = 0. The second cluster
// barrier keeps every CTA's shared memory alive until all have read it.
template <int HD, int NW, int KS>
__device__ __forceinline__ void flash_combine_split(const FlashArgs& a, const SeqHead& sh, int q0,
                                                    const float (&o)[HD / 8][4], const float (&m)[2],
                                                    const float (&l)[2], unsigned char* smem_raw, int warp,
                                                    int lane) {
  constexpr int BQ = 16 * NW;
  constexpr int NT = 32 * NW;
  constexpr int NDT = HD / 8;
  constexpr int LD = f16_ld<HD>();
  constexpr int BK = F16Tile<HD>::kBK;
  static_assert(BQ % KS == 0, "every rank combines whole rows");
  static_assert(sizeof(float) * (size_t(BQ) * HD + 2 * BQ) <= sizeof(__half) * 4 * size_t(BK) * LD,
                "the partial O, m and l fit where the K/V stages were");
  float* sO = reinterpret_cast<float*>(smem_raw + sizeof(__half) * size_t(BQ) * LD);  // the K/V stages
  float* sM = sO + BQ * HD;
  float* sL = sM + BQ;
  cp_async_wait<0>();  // a CTA without keys still has its Q tile in flight
  __syncthreads();
  const int g = lane / 4, t = lane % 4;
  const int r_lo = warp * 16 + g, r_hi = r_lo + 8;
#pragma unroll
  for (int dt = 0; dt < NDT; ++dt) {
    *reinterpret_cast<float2*>(sO + r_lo * HD + dt * 8 + 2 * t) = make_float2(o[dt][0], o[dt][1]);
    *reinterpret_cast<float2*>(sO + r_hi * HD + dt * 8 + 2 * t) = make_float2(o[dt][2], o[dt][3]);
  }
  if (t == 0) {
    sM[r_lo] = m[0];
    sM[r_hi] = m[1];
    sL[r_lo] = l[0];
    sL[r_hi] = l[1];
  }
  cluster_sync();

  constexpr int kRows = BQ / KS;
  const int rank = int(blockIdx.z);
  const uint32_t o_local = smem_u32(sO), m_local = smem_u32(sM), l_local = smem_u32(sL);
  uint32_t o_at[KS], m_at[KS], l_at[KS];
#pragma unroll
  for (int r = 0; r < KS; ++r) {
    o_at[r] = cluster_map(o_local, uint32_t(r));
    m_at[r] = cluster_map(m_local, uint32_t(r));
    l_at[r] = cluster_map(l_local, uint32_t(r));
  }
  __half* out = static_cast<__half*>(a.out);
  for (int idx = int(threadIdx.x); idx < kRows * NDT; idx += NT) {
    const int row = rank * kRows + idx / NDT, c = idx % NDT;
    const int pos = q0 + row;
    if (pos >= a.S || c * 8 >= a.hd || (pos >= sh.len && a.seq_start)) continue;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (pos < sh.len) {
      float mr[KS], mx = -INFINITY;
#pragma unroll
      for (int r = 0; r < KS; ++r) {
        mr[r] = ld_cluster_f32(m_at[r] + 4u * uint32_t(row));
        mx = fmaxf(mx, mr[r]);
      }
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, lsum = 0.f;
#pragma unroll
      for (int r = 0; r < KS; ++r) {
        if (mr[r] == -INFINITY) continue;  // no keys of this row in that rank's range
        const float w = ex2((mr[r] - mx) * a.scale_log2);
        lsum += w * ld_cluster_f32(l_at[r] + 4u * uint32_t(row));
        const uint32_t at = o_at[r] + 4u * uint32_t(row * HD + c * 8);
        const float4 lo = ld_cluster_f32x4(at), hi = ld_cluster_f32x4(at + 16u);
        acc[0] += w * lo.x; acc[1] += w * lo.y; acc[2] += w * lo.z; acc[3] += w * lo.w;
        acc[4] += w * hi.x; acc[5] += w * hi.y; acc[6] += w * hi.z; acc[7] += w * hi.w;
      }
      const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
      v = make_uint4(pack_half2(acc[0] * inv, acc[1] * inv), pack_half2(acc[2] * inv, acc[3] * inv),
                     pack_half2(acc[4] * inv, acc[5] * inv), pack_half2(acc[6] * inv, acc[7] * inv));
    }
    *reinterpret_cast<uint4*>(out + (sh.row0 + pos) * a.out_stride + sh.h * a.hd + c * 8) = v;
  }
  cluster_sync();
}

// KS > 1 (sm_90+, launched in clusters of KS CTAs along grid z): the KS CTAs of a cluster share
// one query tile and split its visible key tiles into KS contiguous ranges; each runs the online
// softmax over its range, leaves its unnormalised O (fp32), row max and row sum in shared
// memory, and after a cluster barrier each CTA combines the KS partial results of a 1/KS slice
// of the tile's rows over distributed shared memory and stores them. Same output layout and
// rules as KS = 1 (rows >= len: zeros when dense, untouched when packed).
// G > 1 (G = NW, KS = 1, head_dim exactly HD): the CTA takes G adjacent heads of its (sequence,
// query tile): grid x = b * (H / G) + head group. The tiles hold the G heads' columns side by side
// (one Q / K / V row of G * HD halves: G times fewer, longer copies); warp w computes head w for
// every 16-row unit of the tile that has valid rows (a short sequence keeps all warps busy instead
// of leaving those past its length idle), each unit with its own online softmax; the set-up, the
// length / offset loads, the K/V pipeline and the stores are shared by the G heads.
template <int HD, int NW, int KS = 1, int G = 1>
__global__ void __launch_bounds__(NW * 32, (f16_min_blocks<HD, NW, KS, G>())) flash_f16_kernel(const FlashArgs a) {
  constexpr int BK = F16Tile<HD>::kBK;
  constexpr bool kQRegs = F16Tile<HD>::kQInRegs;
  constexpr int BQ = 16 * NW;
  constexpr int NT = 32 * NW;
  constexpr int HDT = G * HD;  // columns of a tile row
  constexpr int LD = f16_ld<HDT>();
  constexpr int NKT = BK / 8;  // n-tiles of the per-warp score tile [16, BK]
  constexpr int NDT = HD / 8;  // n-tiles of the per-warp output tile [16, HD] of one head
  static_assert(HD % 16 == 0 || HD == 8, "head_dim instantiations are 8 or multiples of 16");
  static_assert(BK % 32 == 0, "hd 8 loads 32 keys per ldmatrix.x4; the others 16");
  static_assert(G == 1 || (KS == 1 && kQRegs && G == NW), "head groups: a head per warp, unsplit keys, Q in registers");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* sQ = reinterpret_cast<__half*>(smem_raw);  // [BQ][LD], reused to stage the output
  __half* sK = sQ + BQ * LD;                          // [2][BK][LD]
  __half* sV = sK + 2 * BK * LD;                      // [2][BK][LD]

  pdl_launch_dependents();
  pdl_wait();  // launch_pdl: lengths, offsets and qkv come from earlier kernels
  const SeqHead sh = seq_head(a, a.H / G);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * BQ;
  __half* out = static_cast<__half*>(a.out);
  if (q0 >= sh.len) {  // all rows of this tile are padding (the whole cluster returns here)
    if (!a.seq_start && (KS == 1 || blockIdx.z == 0)) store_zero_rows_f16<HD, NT, G>(out, a, sh, q0, BQ, threadIdx.x);
    return;
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates: row group, thread in quad
  const int qw0 = q0 + warp * 16;        // first query position of this warp
  const __half* qkv = static_cast<const __half*>(a.qkv);
  const int D = a.H * a.hd;
  const __half* q_col = qkv + sh.h * G * a.hd;
  const __half* k_col = q_col + D;
  const __half* v_col = q_col + 2 * D;

  // Keys this tile can see: under causal none past its last row; never past the length.
  const int kend = a.causal ? min(sh.len, q0 + BQ) : sh.len;
  const int nkb = (kend + BK - 1) / BK;
  // This CTA's key tiles [kb_lo, kb_hi): all of them, or its cluster rank's share.
  int kb_lo = 0, kb_hi = nkb;
  if constexpr (KS > 1) {
    const int per = (nkb + KS - 1) / KS;
    kb_lo = min(nkb, int(blockIdx.z) * per);
    kb_hi = min(nkb, kb_lo + per);
  }

  load_tile_f16<BQ, HDT, NT>(sQ, q_col, sh.row0, a.qkv_stride, q0, sh.len, G * a.hd);
  if (kb_lo < kb_hi) {
    load_tile_f16<BK, HDT, NT>(sK, k_col, sh.row0, a.qkv_stride, kb_lo * BK, sh.len, G * a.hd);
    load_tile_f16<BK, HDT, NT>(sV, v_col, sh.row0, a.qkv_stride, kb_lo * BK, sh.len, G * a.hd);
  }
  cp_async_commit();

  // Per-lane ldmatrix offsets (bytes) inside a tile; see the fragment layouts of mma.m16n8k16.
  const uint32_t q_base = smem_u32(sQ + (warp * 16 + (lane & 15)) * LD + (HD == 8 ? 0 : (lane >> 4) * 8));
  const uint32_t k_lane = HD == 8 ? lane * LD * 2 : (((lane & 7) + ((lane >> 4) << 3)) * LD + ((lane >> 3) & 1) * 8) * 2;
  const uint32_t v_lane = HD == 8 ? (lane & 15) * LD * 2 : (((lane & 7) + (((lane >> 3) & 1) << 3)) * LD + (lane >> 4) * 8) * 2;

  constexpr int kQFrags = HD == 8 ? 1 : (kQRegs ? HD / 16 : 1);
  // Per unit of this warp (G = 1: its 16 rows; G > 1: the tile's 16-row units of its head): Q
  // fragments, O, running row max (raw score units, rows g and g + 8) and running row sums as an
  // mma accumulator (ptx.cuh kHalf2Ones: [0] / [2] hold the whole sum of rows g / g + 8, [1] and [3]
  // are never read; instead of one add per probability on the issue-bound path).
  uint32_t qf[G][kQFrags][4];
  float o[G][NDT][4];
  float m[G][2];
  float lacc[G][4];
#pragma unroll
  for (int j = 0; j < G; ++j) {
#pragma unroll
    for (int i = 0; i < NDT; ++i) o[j][i][0] = o[j][i][1] = o[j][i][2] = o[j][i][3] = 0.f;
    m[j][0] = m[j][1] = -INFINITY;
    lacc[j][0] = lacc[j][1] = lacc[j][2] = lacc[j][3] = 0.f;
  }
  const float sl2 = a.scale_log2;

  for (int kb = kb_lo; kb < kb_hi; ++kb) {
    const int stage = (kb - kb_lo) & 1;
    if (kb + 1 < kb_hi) {
      const int nxt = stage ^ 1;
      load_tile_f16<BK, HDT, NT>(sK + nxt * BK * LD, k_col, sh.row0, a.qkv_stride, (kb + 1) * BK, sh.len, G * a.hd);
      load_tile_f16<BK, HDT, NT>(sV + nxt * BK * LD, v_col, sh.row0, a.qkv_stride, (kb + 1) * BK, sh.len, G * a.hd);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    if (kb == kb_lo) {
#pragma unroll
      for (int j = 0; j < G; ++j) {
        // G > 1: unit j = rows 16 j .. of the tile, this warp's head columns.
        const uint32_t qj = G == 1 ? q_base : q_base + ((j - warp) * 16 * LD + warp * HD) * 2;
        if constexpr (HD == 8) {
          ldsm_x2(qf[j][0][0], qf[j][0][1], qj);
        } else if constexpr (kQRegs) {
#pragma unroll
          for (int ks = 0; ks < HD / 16; ++ks)
            ldsm_x4(qf[j][ks][0], qf[j][ks][1], qf[j][ks][2], qf[j][ks][3], qj + ks * 32);
        }
      }
    }

    const int k0 = kb * BK;
#pragma unroll
    for (int u = 0; u < G; ++u) {  // this warp's units: G = 1 its rows; G > 1 the tile's 16-row units
      const int r0 = G == 1 ? qw0 : q0 + 16 * u;  // the unit's first query position
      // Warp-uniform skips: rows all padding, or the whole key tile above this unit's diagonal.
      const bool active = r0 < sh.len && !(a.causal && k0 > r0 + 15);
      if (active) {
        const uint32_t k_tile = smem_u32(sK + stage * BK * LD) + k_lane;
        const uint32_t v_tile = smem_u32(sV + stage * BK * LD) + v_lane;
        // Keys of this tile any row of the unit can see (>= 1 here): up to the length and, under
        // causal, up to the unit's last row. Where they fit in the first half of the tile (the
        // diagonal tiles of the first two units, the last tile of a short length) only that half is
        // computed (NP = BK / 32 16-key groups; the rest would be masked to zero weight), else all
        // of it (NP = BK / 16). Two straight-line copies of the step: a runtime bound inside the
        // unrolled loops splits them into branches and costs more than it saves.
        const int kneed = min(a.causal ? min(sh.len, r0 + 16) : sh.len, k0 + BK) - k0;
        const auto step = [&](auto np_c) {
          constexpr int NP = decltype(np_c)::value;
          static_assert(NP >= 1 && 16 * NP <= BK && (HD != 8 || NP % 2 == 0), "whole 16-key groups (hd 8: 32)");
          {
            const int j = u;
            float(&oj)[NDT][4] = o[j];
            float(&mj)[2] = m[j];
            float(&lj)[4] = lacc[j];
            const uint32_t head_col = G == 1 ? 0 : warp * HD * 2;  // bytes: this warp's head in the tiles
            const uint32_t k_head = k_tile + head_col, v_head = v_tile + head_col;

            // S = Q K^T for this warp's 16 rows and the tile's first 16 * NP keys.
            float s[NKT][4];
#pragma unroll
            for (int i = 0; i < 2 * NP; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
            if constexpr (HD == 8) {
#pragma unroll
              for (int np = 0; np < (NP + 1) / 2; ++np) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3, k_head + np * 32 * LD * 2);
                mma_1688(s[4 * np + 0], qf[j][0][0], qf[j][0][1], b0);
                mma_1688(s[4 * np + 1], qf[j][0][0], qf[j][0][1], b1);
                mma_1688(s[4 * np + 2], qf[j][0][0], qf[j][0][1], b2);
                mma_1688(s[4 * np + 3], qf[j][0][0], qf[j][0][1], b3);
              }
            } else {
#pragma unroll
              for (int ks = 0; ks < HD / 16; ++ks) {
                uint32_t af[4];
                if constexpr (kQRegs) {
                  af[0] = qf[j][ks][0]; af[1] = qf[j][ks][1]; af[2] = qf[j][ks][2]; af[3] = qf[j][ks][3];
                } else {
                  ldsm_x4(af[0], af[1], af[2], af[3], q_base + (j * HD + ks * 16) * 2);
                }
#pragma unroll
                for (int np = 0; np < NP; ++np) {
                  uint32_t b0, b1, b2, b3;
                  ldsm_x4(b0, b1, b2, b3, k_head + (np * 16 * LD + ks * 16) * 2);
                  mma_16816(s[2 * np], af, b0, b1);
                  mma_16816(s[2 * np + 1], af, b2, b3);
                }
              }
            }

            // Masks only where the tile crosses the length or this warp's diagonal. Key j of this
            // thread's element (nt, e) is k0 + 2t + nt*8 + (e & 1); row i may see keys up to
            // lim(i) = causal ? min(i, len - 1) : len - 1, so the element stays iff its compile-time
            // offset nt*8 + (e & 1) <= lim(i) - k0 - 2t (one compare per element).
            if (k0 + 16 * NP > sh.len || (a.causal && k0 + 16 * NP - 1 > r0)) {
              int lim[2];
#pragma unroll
              for (int r = 0; r < 2; ++r) {
                const int i = r0 + g + 8 * r;
                lim[r] = (a.causal ? min(i, sh.len - 1) : sh.len - 1) - (k0 + 2 * t);
              }
#pragma unroll
              for (int nt = 0; nt < 2 * NP; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e)
                  if (nt * 8 + (e & 1) > lim[e >> 1]) s[nt][e] = -INFINITY;
              }
            }

            // Online softmax: new row max over the quad, rescale the running sum and O.
            float mx[2] = {mj[0], mj[1]};
#pragma unroll
            for (int nt = 0; nt < 2 * NP; ++nt) {
              mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
              mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
            }
            float mb[2];  // max in exp2 units; 0 while a row has seen only masked keys (avoids inf - inf)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
              mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
              mb[r] = mx[r] == -INFINITY ? 0.f : mx[r] * sl2;
              const float alpha = ex2(mj[r] * sl2 - mb[r]);
              mj[r] = mx[r];
              lj[2 * r] *= alpha;
#pragma unroll
              for (int dt = 0; dt < NDT; ++dt) {
                oj[dt][2 * r] *= alpha;
                oj[dt][2 * r + 1] *= alpha;
              }
            }
#pragma unroll
            for (int nt = 0; nt < 2 * NP; ++nt) {
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                s[nt][e] = ex2(fmaf(s[nt][e], sl2, -mb[e >> 1]));
              }
            }

            // O += P V: the score accumulators of two adjacent key n-tiles form one A fragment.
#pragma unroll
            for (int ks = 0; ks < NP; ++ks) {
              const uint32_t pa[4] = {pack_half2(s[2 * ks][0], s[2 * ks][1]), pack_half2(s[2 * ks][2], s[2 * ks][3]),
                                      pack_half2(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                                      pack_half2(s[2 * ks + 1][2], s[2 * ks + 1][3])};
              mma_16816(lj, pa, kHalf2Ones, kHalf2Ones);
              if constexpr (HD == 8) {
                uint32_t b0, b1;
                ldsm_x2_t(b0, b1, v_head + ks * 16 * LD * 2);
                mma_16816(oj[0], pa, b0, b1);
              } else {
#pragma unroll
                for (int dp = 0; dp < HD / 16; ++dp) {
                  uint32_t b0, b1, b2, b3;
                  ldsm_x4_t(b0, b1, b2, b3, v_head + (ks * 16 * LD + dp * 16) * 2);
                  mma_16816(oj[2 * dp], pa, b0, b1);
                  mma_16816(oj[2 * dp + 1], pa, b2, b3);
                }
              }
            }
          }
        };
        if (kneed <= BK / 2) {
          step(std::integral_constant<int, BK / 32>{});
        } else {
          step(std::integral_constant<int, BK / 16>{});
        }
      }
    }  // units
    __syncthreads();  // the stage just read is refilled by the next iteration's prefetch
  }

  if constexpr (KS > 1) {
    const float l[2] = {lacc[0][0], lacc[0][2]};  // whole row sums already (the mma summed over the quad)
    flash_combine_split<HD, NW, KS>(a, sh, q0, o[0], m[0], l, smem_raw, warp, lane);
  } else if constexpr (G > 1) {
    // Normalise, stage every unit's 16 rows of this warp's head as fp16 in sQ (no warp reads Q
    // after the key loop's barriers), then the CTA stores whole rows in 16-byte chunks.
#pragma unroll
    for (int u = 0; u < G; ++u) {
      float inv[2];  // whole row sums already (the mma summed over the quad)
#pragma unroll
      for (int r = 0; r < 2; ++r) inv[r] = lacc[u][2 * r] > 0.f ? 1.f / lacc[u][2 * r] : 0.f;
#pragma unroll
      for (int dt = 0; dt < NDT; ++dt) {
        *reinterpret_cast<__half2*>(sQ + (16 * u + g) * LD + warp * HD + dt * 8 + 2 * t) =
            __floats2half2_rn(o[u][dt][0] * inv[0], o[u][dt][1] * inv[0]);
        *reinterpret_cast<__half2*>(sQ + (16 * u + g + 8) * LD + warp * HD + dt * 8 + 2 * t) =
            __floats2half2_rn(o[u][dt][2] * inv[1], o[u][dt][3] * inv[1]);
      }
    }
    __syncthreads();
    constexpr int kChunks = HDT / 8;  // 16-byte chunks of a row
    for (int idx = threadIdx.x; idx < BQ * kChunks; idx += NT) {
      const int r = idx / kChunks, c = idx % kChunks;
      const int pos = q0 + r;
      if (pos >= a.S || c * 8 >= G * a.hd || (pos >= sh.len && a.seq_start)) continue;
      const uint4 v = pos < sh.len ? *reinterpret_cast<const uint4*>(sQ + r * LD + c * 8) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(out + (sh.row0 + pos) * a.out_stride + sh.h * G * a.hd + c * 8) = v;
    }
  } else {
    // Normalise, stage this warp's 16 rows as fp16 in its own rows of sQ, store 16-byte chunks.
    const float l[2] = {lacc[0][0], lacc[0][2]};  // whole row sums already (the mma summed over the quad)
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) inv[r] = l[r] > 0.f ? 1.f / l[r] : 0.f;
    __half* stage_rows = sQ + warp * 16 * LD;
#pragma unroll
    for (int dt = 0; dt < NDT; ++dt) {
      *reinterpret_cast<__half2*>(stage_rows + g * LD + dt * 8 + 2 * t) =
          __floats2half2_rn(o[0][dt][0] * inv[0], o[0][dt][1] * inv[0]);
      *reinterpret_cast<__half2*>(stage_rows + (g + 8) * LD + dt * 8 + 2 * t) =
          __floats2half2_rn(o[0][dt][2] * inv[1], o[0][dt][3] * inv[1]);
    }
    __syncwarp();
    for (int idx = lane; idx < 16 * NDT; idx += 32) {
      const int r = idx / NDT, c = idx % NDT;
      const int pos = qw0 + r;
      if (pos >= a.S || c * 8 >= a.hd || (pos >= sh.len && a.seq_start)) continue;
      const uint4 v = pos < sh.len ? *reinterpret_cast<const uint4*>(stage_rows + r * LD + c * 8) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(out + (sh.row0 + pos) * a.out_stride + sh.h * a.hd + c * 8) = v;
    }
  }
}

// ---- f32 SIMT kernel ----------------------------------------------------------------------------
template <int HDP>
__global__ void __launch_bounds__(kF32Threads) flash_f32_kernel(const FlashArgs a) {
  constexpr int BQ = kF32BQ, BK = kF32BK, NT = kF32Threads;
  constexpr int LDK = HDP + 1, LDP = BK + 1;
  constexpr int NC = HDP / 8;  // output columns per thread
  static_assert(HDP % 8 == 0 && BQ == 2 * (NT / 8) && BK == 32, "thread layout: 16 row pairs x 8 column lanes");

  extern __shared__ float smem_f[];
  float* sQ = smem_f;             // [BQ][LDK]
  float* sK = sQ + BQ * LDK;      // [BK][LDK]
  float* sV = sK + BK * LDK;      // [BK][HDP]
  float* sP = sV + BK * HDP;      // [BQ][LDP]

  const SeqHead sh = seq_head(a, a.H);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * BQ;
  float* out = static_cast<float*>(a.out);
  const int tid = threadIdx.x;
  if (q0 >= sh.len) {
    if (!a.seq_start) {
      for (int idx = tid; idx < BQ * HDP; idx += NT) {
        const int r = idx / HDP, c = idx % HDP;
        if (q0 + r < a.S && c < a.hd) out[(sh.row0 + q0 + r) * a.out_stride + sh.h * a.hd + c] = 0.f;
      }
    }
    return;
  }

  const float* qkv = static_cast<const float*>(a.qkv);
  const int D = a.H * a.hd;
  const float* q_col = qkv + sh.h * a.hd;
  const float* k_col = q_col + D;
  const float* v_col = q_col + 2 * D;
  // Rows >= len and columns >= hd are zero in shared memory, never read from global memory.
  auto load = [&](float* dst, int ld, const float* col0, int pos0) {
    for (int idx = tid; idx < 32 * HDP; idx += NT) {
      const int r = idx / HDP, c = idx % HDP;
      const int pos = pos0 + r;
      dst[r * ld + c] = (pos < sh.len && c < a.hd) ? col0[(sh.row0 + pos) * a.qkv_stride + c] : 0.f;
    }
  };
  load(sQ, LDK, q_col, q0);

  const int ty = tid / 8, tx = tid % 8;  // rows 2ty, 2ty+1; score columns tx + 8jj; O columns tx + 8c
  const int warp = tid / 32;
  const int qw0 = q0 + warp * 8;         // a warp owns 8 consecutive rows
  const int kend = a.causal ? min(sh.len, q0 + BQ) : sh.len;
  const int nkb = (kend + BK - 1) / BK;

  float o[2][NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) o[0][c] = o[1][c] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};

  for (int kb = 0; kb < nkb; ++kb) {
    const int k0 = kb * BK;
    __syncthreads();  // previous tile fully consumed
    load(sK, LDK, k_col, k0);
    load(sV, HDP, v_col, k0);
    __syncthreads();
    if (qw0 >= sh.len || (a.causal && k0 > qw0 + 7)) continue;  // warp-uniform

    float s[2][4] = {};
    const float* qr = sQ + 2 * ty * LDK;
    const float* kr = sK + tx * LDK;
#pragma unroll 8
    for (int d = 0; d < HDP; ++d) {
      const float qa = qr[d], qb = qr[LDK + d];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const float kv = kr[8 * jj * LDK + d];
        s[0][jj] = fmaf(qa, kv, s[0][jj]);
        s[1][jj] = fmaf(qb, kv, s[1][jj]);
      }
    }
    const bool need_mask = k0 + BK > sh.len || (a.causal && k0 + BK - 1 > qw0);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = q0 + 2 * ty + r;
      float mx = m[r];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int j = k0 + tx + 8 * jj;
        s[r][jj] *= a.scale;
        if (need_mask && (j >= sh.len || (a.causal && j > i))) s[r][jj] = -INFINITY;
        mx = fmaxf(mx, s[r][jj]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      const float mu = mx == -INFINITY ? 0.f : mx;  // no inf - inf while a row has seen only masked keys
      const float alpha = expf(m[r] - mu);
      m[r] = mx;
      l[r] *= alpha;
#pragma unroll
      for (int c = 0; c < NC; ++c) o[r][c] *= alpha;
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const float p = expf(s[r][jj] - mu);
        l[r] += p;
        sP[(2 * ty + r) * LDP + tx + 8 * jj] = p;
      }
    }
    __syncwarp();  // P rows of this warp are written and read only by this warp
#pragma unroll 4
    for (int k = 0; k < BK; ++k) {
      const float pa = sP[2 * ty * LDP + k], pb = sP[(2 * ty + 1) * LDP + k];
      const float* vr = sV + k * HDP + tx;
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        o[0][c] = fmaf(pa, vr[8 * c], o[0][c]);
        o[1][c] = fmaf(pb, vr[8 * c], o[1][c]);
      }
    }
    __syncwarp();  // the next tile's P overwrites these rows
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 4);
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    const int pos = q0 + 2 * ty + r;
    if (pos >= a.S || (pos >= sh.len && a.seq_start)) continue;
    float* orow = out + (sh.row0 + pos) * a.out_stride + sh.h * a.hd;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = tx + 8 * c;
      if (col < a.hd) orow[col] = pos < sh.len ? o[r][c] * inv : 0.f;
    }
  }
}

// ---- launch layer: runtime shape -> compile-time instantiation ----------------------------------
constexpr int kMaxHeadDim = 256;
constexpr int kMaxGridY = 65535;

int head_dim_bucket(int hd) {
  return hd <= 8 ? 8 : hd <= 16 ? 16 : hd <= 32 ? 32 : hd <= 64 ? 64 : hd <= 128 ? 128 : 256;
}
int bucket_index(int bucket) {
  return bucket == 8 ? 0 : bucket == 16 ? 1 : bucket == 32 ? 2 : bucket == 64 ? 3 : bucket == 128 ? 4 : 5;
}

FlashArgs make_args(const AttentionParams& p) {
  FlashArgs a;
  a.qkv = p.qkv;
  a.out = p.out;
  a.lengths = p.lengths;
  a.seq_start = p.seq_start;
  a.S = p.S;
  a.H = p.H;
  a.hd = p.head_dim;
  a.qkv_stride = p.qkv_row_stride;
  a.out_stride = p.out_row_stride;
  a.scale = p.scale;
  a.scale_log2 = p.scale * kLog2e;
  a.causal = p.causal;
  return a;
}

template <typename Kernel>
void raise_smem_limit(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    HK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  }
}

template <int HD>
void raise_limits_hd() {
  raise_smem_limit(flash_f16_kernel<HD, 4>, f16_smem_bytes<HD, 4>());
  raise_smem_limit(flash_f16_kernel<HD, 1>, f16_smem_bytes<HD, 1>());
  raise_smem_limit(flash_f32_kernel<HD>, f32_smem_bytes<HD>());
}
// The key-split instantiations: q64 tiles, head_dim buckets 16..64 (where one (sequence, head)
// has few query tiles but many key tiles: long sequences with few heads), 2 or 4 CTAs per
// cluster. Their shared memory stays under the 48 KB default.
constexpr int kSplitHeadDims[] = {16, 32, 64};
static_assert(f16_smem_bytes<64, 4>() <= 48 * 1024, "split instantiations need no opt-in");

// The head-group instantiation (G heads per q64 CTA): head_dim exactly 8 with 4 heads, where one
// head's rows are 16 bytes and a CTA's fixed work (set-up, the length / offset loads and their
// latency, the pipeline, the stores) is large against its few key tiles. Measured on the H200
// (thirty-fifth GPU run, tuner times per layer): 0.0604 vs 0.0776 ms for the hd 8 kernel (case 11);
// 2 heads per CTA (the earlier row-loop form) lost at hd 8 (0.082), 16 (case 5 0.039 vs 0.036) and
// 32 (case 6 0.352 vs 0.313), so they are not built. Shared memory 25 KB.
constexpr int kGroupHeadDim = 8, kGroupHeads = 4;

// Raises the dynamic shared-memory limit of every instantiation once per process (the current
// device at first use). Called from supports() too, so it normally runs before any capture.
void ensure_smem_limits() {
  static const bool done = [] {
    raise_limits_hd<8>();
    raise_limits_hd<16>();
    raise_limits_hd<32>();
    raise_limits_hd<64>();
    raise_limits_hd<128>();
    raise_limits_hd<256>();
    return true;
  }();
  (void)done;
}

template <int HD, int NW>
void launch_f16(const AttentionParams& p, cudaStream_t stream) {
  const dim3 grid(p.B * p.H, (p.S + 16 * NW - 1) / (16 * NW));
  launch_pdl(flash_f16_kernel<HD, NW>, grid, dim3(NW * 32), f16_smem_bytes<HD, NW>(), stream, make_args(p));
  HK_CUDA_CHECK_LAUNCH();
}

template <int HD, int KS>
void launch_f16_split(const AttentionParams& p, cudaStream_t stream) {
  const dim3 grid(p.B * p.H, (p.S + 63) / 64, KS);
  launch_pdl_cluster(flash_f16_kernel<HD, 4, KS>, grid, dim3(128), dim3(1, 1, KS), f16_smem_bytes<HD, 4>(), stream,
                     make_args(p));
  HK_CUDA_CHECK_LAUNCH();
}

template <int HD, int G>
void launch_f16_grouped(const AttentionParams& p, cudaStream_t stream) {
  const dim3 grid(p.B * (p.H / G), (p.S + 63) / 64);
  launch_pdl(flash_f16_kernel<HD, 4, 1, G>, grid, dim3(128), f16_smem_bytes<HD, 4, G>(), stream, make_args(p));
  HK_CUDA_CHECK_LAUNCH();
}

template <int KS>
void dispatch_f16_split(const AttentionParams& p, cudaStream_t stream) {
  switch (head_dim_bucket(p.head_dim)) {
    case 16: return launch_f16_split<16, KS>(p, stream);
    case 32: return launch_f16_split<32, KS>(p, stream);
    default: return launch_f16_split<64, KS>(p, stream);
  }
}

template <int HDP>
void launch_f32(const AttentionParams& p, cudaStream_t stream) {
  const dim3 grid(p.B * p.H, (p.S + kF32BQ - 1) / kF32BQ);
  flash_f32_kernel<HDP><<<grid, kF32Threads, f32_smem_bytes<HDP>(), stream>>>(make_args(p));
  HK_CUDA_CHECK_LAUNCH();
}

template <int NW>
void dispatch_f16(const AttentionParams& p, cudaStream_t stream) {
  switch (head_dim_bucket(p.head_dim)) {
    case 8: return launch_f16<8, NW>(p, stream);
    case 16: return launch_f16<16, NW>(p, stream);
    case 32: return launch_f16<32, NW>(p, stream);
    case 64: return launch_f16<64, NW>(p, stream);
    case 128: return launch_f16<128, NW>(p, stream);
    default: return launch_f16<256, NW>(p, stream);
  }
}

void dispatch_f32(const AttentionParams& p, cudaStream_t stream) {
  switch (head_dim_bucket(p.head_dim)) {
    case 8: return launch_f32<8>(p, stream);
    case 16: return launch_f32<16>(p, stream);
    case 32: return launch_f32<32>(p, stream);
    case 64: return launch_f32<64>(p, stream);
    case 128: return launch_f32<128>(p, stream);
    default: return launch_f32<256>(p, stream);
  }
}

int current_sm_count() {
  int dev = 0, sms = 0;
  HK_CUDA_CHECK(cudaGetDevice(&dev));
  HK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

// q64 lets 4 warps (one per SM sub-partition) share each K/V tile. Only when even the q16 grid
// leaves SMs idle (e.g. B=1, H=4, S=128: 8 q64 blocks, 32 q16 blocks) does q16 win: each warp then
// has an SM's load and shared-memory bandwidth to itself. In between, the per-warp work is the same
// and q64 loads each K/V tile once instead of 4 times.
FlashQueryTile resolve_tile(const AttentionParams& p, FlashQueryTile tile) {
  if (tile != FlashQueryTile::automatic) return tile;
  const int64_t blocks16 = int64_t(p.B) * p.H * ((p.S + 15) / 16);
  return blocks16 <= current_sm_count() ? FlashQueryTile::q16 : FlashQueryTile::q64;
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

// Thread-block clusters: compute capability 9.0 or newer on the current device (asked each time).
bool current_device_has_clusters() {
  int dev = 0, major = 0;
  HK_CUDA_CHECK(cudaGetDevice(&dev));
  HK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major >= 9;
}

}  // namespace

bool attention_flash_supports(const AttentionParams& p) {
  if (p.B < 0 || p.S < 0 || p.H < 1 || p.head_dim < 1 || p.head_dim > kMaxHeadDim) return false;
  const int64_t D = int64_t(p.H) * p.head_dim;
  if (p.qkv_row_stride < 3 * D || p.out_row_stride < D) return false;
  if (int64_t(p.B) * p.H > INT32_MAX || (p.S + 15) / 16 > kMaxGridY) return false;
  if (int64_t(p.B) * p.S > 0 && (p.qkv == nullptr || p.out == nullptr)) return false;
  if (p.dtype == DType::f16) {
    if (p.head_dim % 8 != 0) return false;  // 16-byte chunks of one head
    if (p.qkv_row_stride % 8 != 0 || p.out_row_stride % 8 != 0) return false;
    if (!aligned16(p.qkv) || !aligned16(p.out)) return false;
  } else if (p.dtype != DType::f32) {
    return false;
  }
  ensure_smem_limits();
  return true;
}

void attention_flash(const AttentionParams& p, cudaStream_t stream, FlashQueryTile tile) {
  if (!attention_flash_supports(p)) throw std::invalid_argument("hk::attention[cuda.flash]: unsupported parameters");
  if (p.B == 0 || p.S == 0) return;
  if (p.dtype == DType::f32) return dispatch_f32(p, stream);
  if (resolve_tile(p, tile) == FlashQueryTile::q64) return dispatch_f16<4>(p, stream);
  return dispatch_f16<1>(p, stream);
}

void attention_flash(const AttentionParams& p, cudaStream_t stream) {
  attention_flash(p, stream, FlashQueryTile::automatic);
}

const char* attention_flash_name(const AttentionParams& p, FlashQueryTile tile) {
  static const char* const kF16Q64[] = {
      "hk::attention[cuda.flash.hd8.q64.f16]",  "hk::attention[cuda.flash.hd16.q64.f16]",
      "hk::attention[cuda.flash.hd32.q64.f16]", "hk::attention[cuda.flash.hd64.q64.f16]",
      "hk::attention[cuda.flash.hd128.q64.f16]", "hk::attention[cuda.flash.hd256.q64.f16]"};
  static const char* const kF16Q16[] = {
      "hk::attention[cuda.flash.hd8.q16.f16]",  "hk::attention[cuda.flash.hd16.q16.f16]",
      "hk::attention[cuda.flash.hd32.q16.f16]", "hk::attention[cuda.flash.hd64.q16.f16]",
      "hk::attention[cuda.flash.hd128.q16.f16]", "hk::attention[cuda.flash.hd256.q16.f16]"};
  static const char* const kF32[] = {
      "hk::attention[cuda.flash.hd8.f32]",  "hk::attention[cuda.flash.hd16.f32]",
      "hk::attention[cuda.flash.hd32.f32]", "hk::attention[cuda.flash.hd64.f32]",
      "hk::attention[cuda.flash.hd128.f32]", "hk::attention[cuda.flash.hd256.f32]"};
  if (p.head_dim < 1 || p.head_dim > kMaxHeadDim) return "hk::attention[cuda.flash.unsupported]";
  const int i = bucket_index(head_dim_bucket(p.head_dim));
  if (p.dtype == DType::f32) return kF32[i];
  return resolve_tile(p, tile) == FlashQueryTile::q64 ? kF16Q64[i] : kF16Q16[i];
}

const char* attention_flash_name(const AttentionParams& p) {
  return attention_flash_name(p, FlashQueryTile::automatic);
}

bool attention_flash_split_supports(const AttentionParams& p, int splits) {
  if (splits != 2 && splits != 4) return false;
  if (p.dtype != DType::f16 || !attention_flash_supports(p)) return false;
  const int bucket = head_dim_bucket(p.head_dim);
  if (std::find(std::begin(kSplitHeadDims), std::end(kSplitHeadDims), bucket) == std::end(kSplitHeadDims)) return false;
  return current_device_has_clusters();
}

void attention_flash_split(const AttentionParams& p, cudaStream_t stream, int splits) {
  if (!attention_flash_split_supports(p, splits))
    throw std::invalid_argument("hk::attention[cuda.flash split keys]: unsupported parameters");
  if (p.B == 0 || p.S == 0) return;
  if (splits == 2) return dispatch_f16_split<2>(p, stream);
  return dispatch_f16_split<4>(p, stream);
}

const char* attention_flash_split_name(const AttentionParams& p, int splits) {
  static const char* const kK2[] = {"hk::attention[cuda.flash.hd16.q64k2.f16]", "hk::attention[cuda.flash.hd32.q64k2.f16]",
                                     "hk::attention[cuda.flash.hd64.q64k2.f16]"};
  static const char* const kK4[] = {"hk::attention[cuda.flash.hd16.q64k4.f16]", "hk::attention[cuda.flash.hd32.q64k4.f16]",
                                     "hk::attention[cuda.flash.hd64.q64k4.f16]"};
  if (p.head_dim < 1 || p.head_dim > kMaxHeadDim || (splits != 2 && splits != 4))
    return "hk::attention[cuda.flash.split.unsupported]";
  const int bucket = head_dim_bucket(p.head_dim);
  const int i = bucket == 16 ? 0 : bucket == 32 ? 1 : bucket == 64 ? 2 : -1;
  if (i < 0) return "hk::attention[cuda.flash.split.unsupported]";
  return splits == 2 ? kK2[i] : kK4[i];
}

bool attention_flash_grouped_supports(const AttentionParams& p, int heads) {
  return p.dtype == DType::f16 && heads == kGroupHeads && p.head_dim == kGroupHeadDim && p.H % heads == 0 &&
         attention_flash_supports(p);
}

void attention_flash_grouped(const AttentionParams& p, cudaStream_t stream, int heads) {
  if (!attention_flash_grouped_supports(p, heads))
    throw std::invalid_argument("hk::attention[cuda.flash head groups]: unsupported parameters");
  if (p.B == 0 || p.S == 0) return;
  launch_f16_grouped<kGroupHeadDim, kGroupHeads>(p, stream);
}

const char* attention_flash_grouped_name(const AttentionParams& p, int heads) {
  if (!attention_flash_grouped_supports(p, heads)) return "hk::attention[cuda.flash.groups.unsupported]";
  return "hk::attention[cuda.flash.hd8.q64g4.f16]";
}

}  // namespace hk::cuda
