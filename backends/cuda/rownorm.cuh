// Row kernels of the CUDA backend: LayerNorm of fp32 rows (the residual stream) into the
// activation type, and the final LayerNorm that also zeros padded rows.
// Host-compilable header: declarations only; kernels and launchers are static in rownorm.cu.
//
// Every kernel takes a row count, not B and S: a row is one token, wherever it sits, so a
// padding-free route can run them on packed valid tokens. Statistics are fp32, computed from the
// row held in registers (mean first, then the centred sum of squares: one read of each row).
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
void layer_norm(const float* x, void* out, DType out_type, const float* w, const float* b,
                int64_t rows, int D, float eps, cudaStream_t stream);

// y[r, :] = LN(x[r, :]; w, b) when row r (position r % S of sequence r / S) is valid, i.e.
// r % S < lengths[r / S]; zeros otherwise (padded rows are not read). lengths null: all valid.
void final_layer_norm(const float* x, float* y, const float* w, const float* b, int64_t rows,
                      int D, float eps, const int32_t* lengths, int S, cudaStream_t stream);

}  // namespace hk::cuda
