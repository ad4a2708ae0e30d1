// The post-attention chain of one layer in one CUDA kernel (fast precision, fp16 GEMM operands):
//   x   = x_in + o Wo^T + bo                      (fp32 residual)
//   h   = LN(x; ln2)                              (fp16)
//   f   = GELU(h Wi^T + bi)                       (exact erf; fp16, rounded as the split route:
//                                                  fp16(acc + bi), then fp16(GELU(.)))
//   x   = x + f Wf^T + bf                         (fp32 residual)
// then either (non-tail)  x_out = x, h_out = LN(x; ln_next) in fp16 (the next layer's norm1),
// or (tail, last layer)   y = LN(x; final_norm) in fp32, zero on padded rows (x is not stored).
// Host-compilable header: declarations only; kernels and launchers are static in
// post_attn_fused.cu.
//
// A CTA owns token rows in blocks of 16 per warp for the whole chain: the row's residual stays
// in fp32 registers, o / h are staged in shared memory, the FFN activation never leaves
// registers (ffn_in output fragments become ffn_out A fragments), LayerNorm statistics are fp32.
// HBM traffic: o and x read once, x and h (or y) written once: 12 B per element (tail 10).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace hk::cuda {

struct PostAttnParams {
  const __half* o = nullptr;       // [rows, D] attention output, row stride D, 16-byte aligned
  const float* x_in = nullptr;     // [rows, D] residual before out_proj (never written unless == x_out)
  float* x_out = nullptr;          // [rows, D] residual after the layer (may alias x_in; unused in tail)
  const __half* w_o = nullptr;     // [D, D] (nn.Linear [out, in])
  const float* b_o = nullptr;      // [D]
  const float* ln2_w = nullptr;    // [D]
  const float* ln2_b = nullptr;    // [D]
  const __half* w_in = nullptr;    // [F, D]
  const __half* b_in = nullptr;    // [F] (fp16, as weights.hpp stores it)
  const __half* w_out = nullptr;   // [D, F]
  const float* b_out = nullptr;    // [D]
  const float* ln_next_w = nullptr;  // next layer's norm1, or final_norm in the tail variant
  const float* ln_next_b = nullptr;
  __half* h_out = nullptr;         // [rows, D] non-tail: LN(x_out; ln_next), 16-byte aligned
  float* y = nullptr;              // [rows, D] tail: LN(x; final_norm), zeros on padded rows (may alias x_in
                                   // when row_dst is null)
  const int32_t* lengths = nullptr;  // tail: row r is valid iff r % S < lengths[r / S]; null = all valid
  int S = 1;
  // Tail, packed layout (rownorm.cuh: pack_layer_norm): row r's y goes to row row_dst[r] of y
  // (not written when row_dst[r] < 0; lengths and S are then ignored, and y must not alias
  // x_in). Null: y rows are the rows themselves. Ignored outside the tail.
  const int32_t* row_dst = nullptr;
  // Non-tail, gathered residual: chain row r reads its residual from row x_rows[r] of x_in (a row
  // < 0 reads zeros); x_in is then another buffer than x_out (the packed route's first layer
  // reads the caller's padded input through rownorm.cuh's row_dst instead of a packed copy).
  // Null: row r of x_in. Not allowed in the tail.
  const int32_t* x_rows = nullptr;
  // Non-tail, column-split kernel of width 8 only (post_attn_qkv_candidates): the next layer's
  // QKV projection as well, qkv_out = fp16(h Wqkv^T + bqkv) with h = LN(x_out; ln_next) rounded to
  // fp16 as h_out holds it (fp32 accumulation, one rounding: cuBLASLt's fp16 bias epilogue).
  // h_out is then optional (null: not written). Null qkv_out: the chain ends at h_out.
  const __half* w_qkv = nullptr;  // [3D, D] (nn.Linear [out, in]), 16-byte aligned
  const __half* b_qkv = nullptr;  // [3D]
  __half* qkv_out = nullptr;      // [rows, 3D], 4-byte aligned
  // The layer's attention in the chain (post_attn_attention_supports): o is not read; each 16-row
  // block's o = softmax(q k^T * attn_scale, padding mask [, causal]) v is computed on chip from
  // qkv_in ([rows, 3D], q | k | v, head h at columns h * D / H of each; 16-byte aligned), in the
  // dense layout only: rows = B * S, sequence b's rows b S .. b S + S - 1, S a multiple of 16 and at
  // most 128, lengths (null = all S) as the attention step reads them; rows at or past a sequence's
  // length get o = 0. qkv_out may be qkv_in (the next layer's q | k | v over this layer's): the
  // CTAs of one sequence form a thread-block cluster and none writes qkv_out before every one of
  // them has read the keys and values it needs. Null: o is read as given.
  const __half* qkv_in = nullptr;
  // With qkv_in and qkv_out (post_attn_attention_supports): the layer's own ln1 and QKV projection
  // in front as well, from x_in: qkv_front = fp16(fp16(LN(x_in; ln_front)) Wqkv_front^T + bqkv_front)
  // (the ln1 kernel's h, cuBLASLt's bias epilogue), written to qkv_front, which must be qkv_in (the
  // attention then reads it; qkv_out may be the same buffer). Null w_qkv_front: qkv_in is read
  // as given.
  __half* qkv_front = nullptr;
  const __half* w_qkv_front = nullptr;  // [3D, D]
  const __half* b_qkv_front = nullptr;  // [3D]
  const float* ln_front_w = nullptr;    // [D]
  const float* ln_front_b = nullptr;    // [D]
  int H = 0;
  bool causal = false;
  float attn_scale = 0.f;
  bool tail = false;
  int64_t rows = 0;
  int D = 0;
  int F = 0;
  float eps = 1e-5f;
};

// The whole forward in one kernel (post_attn_model_supports): the attention chain above, layer after
// layer, the residual rows kept in registers between layers (x_in read once, x_out never written).
// layer[0] has the front (w_qkv_front, ...; qkv_front == qkv_in) and layer[l] for l < L - 1 writes
// the next layer's q | k | v over its own (qkv_out == qkv_in, one buffer for every layer); layer[L - 1]
// is the tail (y = LN(x; final_norm), zero on padded rows; y may be layer[0].x_in: every CTA reads its
// rows' residual in layer 0 and writes their y in the last layer). Every layer: the same rows, S, D,
// F, H, causal, attn_scale, lengths and eps; x_out and h_out are neither read nor written (x_out must
// still be given as validate() expects). layer[l].w_qkv is layer l + 1's projection.
constexpr int kPostAttnModelMaxLayers = 8;
struct PostAttnModelParams {
  PostAttnParams layer[kPostAttnModelMaxLayers];
  int L = 0;
};

// Tuning overrides (tests and tuners): 0 / -1 keep the automatic choice.
//   warps:     warps per CTA (each owns 16 rows at a time); clamped to what the kernel allows
//   prefetch:  1 = double-buffer the o tile (the next row block's o loads during this block's
//              FFN; resident-weight kernels only), 0 = single buffer
//   split:     > 0 selects the column-split kernel (exact D = F = 64 or 128 only): `split` warps
//              (4 or 8; 1..7 run as 4, more as 8: post_attn_fused_effective says which) share
//              one 16-row block, each computing D / split residual columns and
//              F / split ffn columns of every product, with the LayerNorm statistics combined
//              across them through shared memory; `warps` (a multiple of split, at most 16) then
//              gives warps / split row blocks in flight per CTA. Shortens the chain of one row
//              block `split` times: for few rows, where the row-per-warp kernels leave most warps
//              idle and each row block's latency is the kernel's time.
//   reg_weights: 1 (with split >= 8 only; ignored otherwise) = each warp holds its weight columns as mma fragments
//              in registers, loaded from L2 before the kernel waits for its predecessor
//              (programmatic dependent launch), one row block per CTA of 8 warps; 0 = the CTA's
//              weights staged in shared memory.
//   gelu_tanh: 1 (exact resident kernels d64 / d128 only, row per warp; ignored elsewhere) = the
//              ffn's GELU in its tanh form 0.5 r (1 + tanh(sqrt(2/pi) (r + 0.044715 r^3))) in
//              f16x2 arithmetic with the hardware tanh approximation (tanh.approx.f16x2), ~1/6 of
//              the erf form's instructions. Not the model's exact GELU: on every fp16 input in
//              [-300, 300], evaluated step by step in fp16 with tanh rounded exactly (the hardware
//              approximation adds its own error), within 8.3e-4 of it where |GELU| < 1 and within one
//              fp16 step above. A fast-precision candidate that a tuner must check against the erf
//              form, as cuBLASLt's tanh epilogue.
//   wgmma:     1 (exact resident kernels d64 / d128, row per warp; ignored elsewhere, and where
//              the build has no sm_90a code or the device is not compute capability 9.0) = the
//              products as warpgroup MMAs (wgmma.cuh): the tensor cores read the weights from
//              shared memory once per group of 4 warps instead of each warp through ldmatrix;
//              warps then count in whole groups of 4, each group taking 64 rows at a time.
struct PostAttnConfig {
  int warps = 0;
  int prefetch = -1;
  int split = 0;
  int reg_weights = 0;
  int gelu_tanh = 0;
  int wgmma = 0;
};
inline bool operator==(const PostAttnConfig& a, const PostAttnConfig& b) {
  return a.warps == b.warps && a.prefetch == b.prefetch && a.split == b.split && a.reg_weights == b.reg_weights &&
         a.gelu_tanh == b.gelu_tanh && a.wgmma == b.wgmma;
}

// True when this build can run (D, F): D and F multiples of 8 with D <= 256 and F <= 256.
// Exact kernels for (64,64), (128,128) (weights resident in shared memory, persistent CTAs) and
// (256,256) (weight panels streamed through a double buffer); any other (D, F) in range runs on
// a zero-padded generic kernel (D, F <= 128: the 128 resident kernel; else the 256 streamed one).
// Limits: the fp32 residual row lives in registers (D/2 floats per thread: 128 at D = 256), and
// resident weights (3 * D * F halves) must fit next to the per-warp tiles in shared memory.
// Also raises the kernels' dynamic shared-memory limit (once per process, current device), so
// calling it before a graph capture keeps the capture free of attribute changes.
bool post_attn_fused_supports(int D, int F);

// Launches the chain on `stream`: no synchronisation, no allocation, graph-capturable.
// Throws std::invalid_argument for unsupported shapes, null or misaligned pointers.
// rows == 0 launches nothing.
void post_attn_fused(const PostAttnParams& p, cudaStream_t stream);
void post_attn_fused(const PostAttnParams& p, cudaStream_t stream, const PostAttnConfig& config);

// The configuration a launch of (D, F, rows) with `config` would run on the current device, after
// clamping to the kernel's limits and its shared memory: warps > 0 and prefetch 0 / 1 (always 0
// for the streamed and column-split kernels), split and reg_weights as run when (D, F) has the
// column-split kernel (else 0), gelu_tanh and wgmma as run. {0, -1, 0, 0, 0, 0} if (D, F) is
// unsupported.
PostAttnConfig post_attn_fused_effective(int D, int F, int64_t rows, const PostAttnConfig& config);

// Configurations worth timing for (D, F, rows) on the current device, the automatic one first
// (empty if unsupported). Every other entry runs exactly as given (post_attn_fused_effective
// returns its warps and, where it sets one, its prefetch) and no two entries run the same
// configuration:
//   streamed kernels (d256, pad256): fewer warps per CTA while the larger count leaves SMs idle
//     (a CTA covers 16 * warps rows: fewer warps = more CTAs, e.g. 128 rows: 1 CTA at 8 warps);
//   resident kernels, warps with several row blocks each: the o double buffer flipped, and
//     2/3 and 1/2 of the warps with the double buffer (fewer warps leave it room on the A100);
//   resident kernels, at most one row block per warp (few rows: the grid is one CTA per row
//     block whatever the warp count): no double buffer, and 4 and 1 warps per CTA (smaller
//     CTAs: idle warps and smem the row blocks do not use);
//   column-split kernel (D = F = 64 or 128), last: 8 warps per row block with the weights in
//     registers, then with them in shared memory and 1 and 2 row blocks per CTA, 4 warps per row
//     block with 2 and 4 (while there are at most 16 row blocks per SM; beyond that only 8 x 2);
//   with tanh_gelu (fast precision, the exact GELU not pinned) and an exact resident kernel: each
//     row-per-warp entry above again as it runs (explicit warps and prefetch) with gelu_tanh = 1;
//   exact resident kernels where the warpgroup kernels run (sm_90a build, compute capability 9.0):
//     each row-per-warp entry above (erf and tanh) again with wgmma = 1, its warps rounded down to
//     a multiple of 4, unless that runs as an earlier entry;
//   then the column-split entries.
std::vector<PostAttnConfig> post_attn_fused_candidates(int D, int F, int64_t rows, bool tanh_gelu = false);

// The chain with the next layer's QKV projection (PostAttnParams::qkv_out): D = F = 64 or 128,
// where Wqkv fits in shared memory next to the chain's tiles. Candidates run exactly as given, the
// default first: {8 warps, split 8, weights in registers}, {8, split 8}, {16, split 8} (2 row
// blocks per CTA where shared memory allows). Empty when unsupported.
bool post_attn_qkv_supports(int D, int F);
std::vector<PostAttnConfig> post_attn_qkv_candidates(int D, int F, int64_t rows);
// "hk::post_attn[cuda.fused.d128.qkv]" / "...d64.qkv]"; "" if unsupported.
const char* post_attn_qkv_name(int D, int F);

// The chain with the layer's attention in front (PostAttnParams::qkv_in): the column-split kernel
// of width 8 with the chain's weights in registers, for (D, head_dim) = (128, 32) or (64, 16) with
// D = F, S a multiple of 16 up to 128 (the dense layout; sequence b's S / 16 row blocks run on one
// cluster of S / 16 CTAs, each one row block), on compute capability 9.0 and later; with or without
// qkv_out, or as the tail. One configuration, launched by post_attn_fused with any config (the
// config is ignored). The keys and values of a sequence are staged in shared memory, so
// (S, D) must also fit the device's shared memory next to Wqkv.
bool post_attn_attention_supports(int D, int F, int H, int S);
// "hk::post_attn[cuda.fused.d128.attn.qkv]", "...d128.attn]" (h_out or tail), with front (the
// layer's ln1 and QKV projection in front, qkv only) "...d128.ln.qkv.attn.qkv]"; d64 likewise; ""
// if unsupported.
const char* post_attn_attention_name(int D, int F, int H, bool qkv, bool front = false);

// The whole forward in one kernel (PostAttnModelParams): where post_attn_attention_supports(D, F, H,
// S) holds, 2 <= L <= kPostAttnModelMaxLayers and the shared memory fits (the attention chain's plus the
// next layer's chain weights staged on their way into registers: ~220 KB at D = 128, S = 128). One
// thread-block cluster of S / 16 CTAs per
// sequence runs all L layers of it (each CTA one row block; about one wave of clusters loops over the
// batch); one cluster barrier per layer more than the per-layer kernels (the next q | k | v of every
// row block written before any CTA stages it). Throws std::invalid_argument where unsupported or
// inconsistent (the same checks as post_attn_fused for every layer, plus the layer structure above).
// rows == 0 launches nothing.
bool post_attn_model_supports(int D, int F, int H, int S, int L);
void post_attn_model(const PostAttnModelParams& p, cudaStream_t stream);
// "hk::model[cuda.attn_chain.d128]" / "...d64]"; "" if not instantiated for (D, F, H).
const char* post_attn_model_name(int D, int F, int H);

// Profiler name of the kernel (D, F) runs on, e.g. "hk::post_attn[cuda.fused.d128]",
// "hk::post_attn[cuda.fused.d256.stream]", "hk::post_attn[cuda.fused.pad128]"; "" if unsupported.
const char* post_attn_fused_name(int D, int F);

}  // namespace hk::cuda
