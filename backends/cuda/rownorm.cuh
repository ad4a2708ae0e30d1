// Row kernels of the CUDA backend: LayerNorm of fp32 rows (the residual stream) into the
// activation type, and the final LayerNorm that also zeros padded rows.
// Host-compilable header: declarations only; kernels and launchers are static in rownorm.cu.
//
// Every kernel takes a row count, not B and S: a row is one token, wherever it sits, so a
// padding-free route can run them on packed valid tokens. Statistics are fp32, computed from the
// row held in registers (one read of each row) after shifting it by its first element: mean of
// x - x0, then the centred sum of squares. A constant row gets variance exactly 0 (output = b),
// and rows far from zero (|x| ~ 1e4, spread ~ 1) keep the accuracy of their spread.
//
// Padding-free (packed) execution: packed_offsets turns lengths into row offsets, pack_layer_norm
// gathers the valid rows of a padded [B, S, D] input into [Tcap, D] (and runs the first
// LayerNorm on them), final_layer_norm_packed scatters the final LayerNorm back to [B, S, D].
// Every entry point only launches (no allocation, no synchronisation): graph-capturable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention.hpp"  // DType

namespace hk::cuda {

// How one row of D elements is spread over threads. Pure function of D, exposed for tests.
//   vec:              elements per load (4: 16-byte float4 loads, needs D % 4 == 0; else 1)
//   per_thread:       loads each thread keeps in registers (per_thread * vec <= 32 floats)
//   threads_per_row:  32 (a warp per row, 4 rows per block), 256 (a block per row) or
//                     0 (rows too wide for registers: a block loops over the row in memory)
struct RowNormLaunch {
  int vec = 1;
  int per_thread = 1;
  int threads_per_row = 32;
};
RowNormLaunch choose_row_norm_launch(int D);
// "cuda.warp", "cuda.block" or "cuda.block_loop": the variant choose_row_norm_launch(D) picks.
const char* row_norm_variant(int D);

// out[r, :] = LN(x[r, :]; w, b) for r < rows; out holds `out_type` elements (f16 or f32).
// x and out rows are contiguous (stride D); w, b are fp32 [D].
// rows_per_block: for the warp-per-row variant, rows (warps) per block, 1..8 (0: the default 4);
// a tuning choice, ignored by the block variants.
void layer_norm(const float* x, void* out, DType out_type, const float* w, const float* b,
                int64_t rows, int D, float eps, cudaStream_t stream, int rows_per_block = 0);

// y[r, :] = LN(x[r, :]; w, b) when row r (position r % S of sequence r / S) is valid, i.e.
// r % S < lengths[r / S]; zeros otherwise (padded rows are not read). lengths null: all valid.
void final_layer_norm(const float* x, float* y, const float* w, const float* b, int64_t rows,
                      int D, float eps, const int32_t* lengths, int S, cudaStream_t stream);

// seq_start[b] = lengths[0] + ... + lengths[b-1] for b = 0..B (B + 1 entries; seq_start[B] = T,
// the number of valid rows). lengths null: every sequence has S rows. Lengths are clamped to
// [0, S], as the row kernels read them. One single-CTA launch (a block scan looping over B);
// T must stay below 2^31.
void packed_offsets(const int32_t* lengths, int B, int S, int32_t* seq_start, cudaStream_t stream);

// Gather + first LayerNorm of the packed route. Row b * S + s of x is valid iff
// s < lengths[b] (lengths null: all valid); padded rows of x are never read. With
// T = seq_start[B] (device value, from packed_offsets):
//   valid row (b, s) -> packed row r = seq_start[b] + s (when r < Tcap):
//       x_packed[r] = x[b, s] (x_packed null: not written), h[r] = LN(x[b, s]; w, b) in `act`,
//       row_dst[r] = b * S + s
//   rows r in [T, Tcap):  x_packed[r] = 0, h[r] = 0, o[r] = 0, row_dst[r] = -1
//       (o: the attention output buffer, written by attention for valid rows only, read whole
//       by the next GEMM)
//   padded rows of y [B, S, D] (s >= lengths[b]) = 0 (y null: skipped; y may alias x)
// T > Tcap: nothing at or beyond row Tcap is written, and *overflow = 1 (overflow may be null);
// the flag is only ever set, never cleared. Alignment as layer_norm (x, x_packed, y 16 bytes,
// h and o 8 bytes, when D % 4 == 0).
struct PackParams {
  const float* x = nullptr;          // [B, S, D] padded input (fp32)
  const int32_t* lengths = nullptr;  // [B] device, or null (all S)
  const int32_t* seq_start = nullptr;  // [B + 1] device, from packed_offsets
  int B = 0;
  int S = 0;
  int D = 0;
  int64_t Tcap = 0;                  // rows of the packed buffers
  float* x_packed = nullptr;         // [Tcap, D] fp32, or null: the residual's packed copy is not
                                     // made (a consumer reads x through row_dst instead)
  void* h = nullptr;                 // [Tcap, D] of act
  void* o = nullptr;                 // [Tcap, D] of act: rows [T, Tcap) zeroed (null: skipped)
  DType act = DType::f16;
  int32_t* row_dst = nullptr;        // [Tcap]
  float* y = nullptr;                // [B, S, D]: padded rows zeroed (null: skipped)
  const float* w = nullptr;          // LayerNorm weight [D]
  const float* b = nullptr;          // LayerNorm bias [D]
  float eps = 1e-5f;
  int32_t* overflow = nullptr;       // device flag, set to 1 when T > Tcap (null: not reported)
};
void pack_layer_norm(const PackParams& p, cudaStream_t stream);

// Scatter + final LayerNorm of the packed route: y[row_dst[r]] = LN(x_packed[r]; w, b) for every
// r < Tcap with row_dst[r] >= 0 (y rows are D floats apart; padded rows are not touched: they
// were zeroed by pack_layer_norm).
void final_layer_norm_packed(const float* x_packed, float* y, const int32_t* row_dst, int64_t Tcap, int D,
                             const float* w, const float* b, float eps, cudaStream_t stream);

}  // namespace hk::cuda
