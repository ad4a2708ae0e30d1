// The own flash-attention route of the CUDA backend: fused softmax(q k^T * scale) v over the
// strided q/k/v views of the fused QKV rows (layout contract: attention.hpp).
//   f16: tensor-core kernel (mma.sync m16n8k16 / m16n8k8, fp32 accumulation, online softmax),
//        head_dim a multiple of 8 up to 256, 16-byte aligned rows.
//   f32: SIMT kernel, fp32 everywhere (the `fp32` precision mode), any head_dim up to 256.
// Both honour lengths (keys j >= len masked, query rows s >= len written as zeros), causal
// masking with block skipping, and the packed layout (seq_start). With seq_start set, positions
// s >= lengths[b] are not part of the buffer (the next sequence starts there), so nothing is
// read from or written to them.
#pragma once

#include "attention.hpp"

namespace hk::cuda {

// Query rows per thread block of the f16 kernel. `automatic` picks q64 (4 warps) unless even the
// q16 grid (1 warp per block) has no more blocks than SMs. The explicit values exist for tuning
// and for tests that must exercise both.
enum class FlashQueryTile : int { automatic = 0, q64 = 64, q16 = 16 };

// True when the kernels can run these parameters (dtype, head_dim, strides, alignment, grid).
bool attention_flash_supports(const AttentionParams& p);

// Launches the kernel on `stream`: no synchronisation, no allocation, graph-capturable.
// Throws std::invalid_argument when !attention_flash_supports(p). The f32 kernel ignores `tile`.
void attention_flash(const AttentionParams& p, cudaStream_t stream);
void attention_flash(const AttentionParams& p, cudaStream_t stream, FlashQueryTile tile);

// Profiler name of the instantiation `attention_flash(p, stream)` runs,
// e.g. "hk::attention[cuda.flash.hd64.q64.f16]".
const char* attention_flash_name(const AttentionParams& p);
const char* attention_flash_name(const AttentionParams& p, FlashQueryTile tile);

// Keys split over `splits` (2 or 4) CTAs of a thread-block cluster per 64-row query tile: each
// CTA runs the online softmax over its share of the tile's key tiles and the cluster combines the
// partial results over distributed shared memory (no workspace, one launch). For long sequences
// with few (sequence, head) pairs, where the unsplit grid is short and every CTA walks many key
// tiles. f16, head_dim buckets 16, 32 and 64, sm_90 or newer; same output contract as above.
bool attention_flash_split_supports(const AttentionParams& p, int splits);
void attention_flash_split(const AttentionParams& p, cudaStream_t stream, int splits);
const char* attention_flash_split_name(const AttentionParams& p, int splits);  // "...hd32.q64k2.f16]"

// Head groups: `heads` adjacent heads of one sequence per q64 CTA, their columns side by side in
// the shared tiles, each head with its own online softmax. For the smallest head dim, where one
// head's rows are 16 bytes and a CTA's fixed work (set-up, length and offset loads, the K/V
// pipeline, the stores) outweighs its few key tiles: one CTA does it for all its heads. Built for
// f16, head_dim exactly 8 and 4 heads (H a multiple of 4); same output contract as above.
bool attention_flash_grouped_supports(const AttentionParams& p, int heads);
void attention_flash_grouped(const AttentionParams& p, cudaStream_t stream, int heads);
const char* attention_flash_grouped_name(const AttentionParams& p, int heads);  // "...hd8.q64g4.f16]"

}  // namespace hk::cuda
