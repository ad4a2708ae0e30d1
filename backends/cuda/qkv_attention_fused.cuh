// QKV projection fused with attention for short sequences (S <= 128): one kernel computes
//   q, k, v = h Wqkv^T + bqkv   (per head, on chip)     and     o = softmax(q k^T * scale) v
// so the [T, 3D] qkv buffer of the unfused route (cuBLASLt GEMM + flash attention) never exists:
// HBM traffic is read(h) + read(Wqkv once per CTA) + write(o).
//
// A CTA holds the LayerNorm output of whole sequences in shared memory ([16 * ceil(S/16)] rows
// per sequence, short sequences packed up to 128 rows), stages the 3*hd rows of Wqkv of its heads
// once, and loops over its sequences. Each of its 8 warps owns one 16-row tile: it projects k and
// v of that tile into shared memory and q into registers, then computes the scores of its 16
// queries in registers, 64 keys at a time (S <= 64: one block, the plain softmax; S = 128: two,
// with one running-max rescale), P V, and writes o.
//
// Semantics (those of attention.hpp): key j is allowed iff j < lengths[b] and (!causal or j <= i);
// rows s >= lengths[b] of o are written as zeros (a sequence of length 0 writes zeros only).
// Packed layout (seq_start set): token s of sequence b is row seq_start[b] + s of h and o, and
// positions s >= lengths[b] are not part of the buffers (the next sequence starts there): they
// are neither read (zero-filled on chip) nor written.
// q, k, v are fp32 accumulations + bias rounded to fp16 (what the unfused route stores), the
// softmax is fp32, P is rounded to fp16 for the P V product, o is fp16.
// Host-compilable header.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hk::cuda {

struct QkvAttentionParams {
  const __half* h = nullptr;          // [tokens, D] LayerNorm output, token s of sequence b at row
                                      // seq_start[b] + s (packed) or b*S + s (dense)
  const __half* w_qkv = nullptr;      // [3D, D] rows q | k | v (nn.Linear [out, in]); head j of q at rows j*hd..
  const __half* b_qkv = nullptr;      // [3D]
  __half* o = nullptr;                // [tokens, D] rows as h, head j at columns j*hd (o_proj reads it)
  const int32_t* lengths = nullptr;   // device [B], each in 0..S; null means all S valid
  const int32_t* seq_start = nullptr; // device [B], first row of each sequence; null = b*S (dense)
  int B = 0, S = 0, D = 0, H = 0, head_dim = 0;
  float scale = 0.f;                  // 1/sqrt(head_dim)
  bool causal = false;
};

// Program map (the seed's BQ split / HPP / BPP):
//   q_split       CTAs sharing the query tiles of one (sequence, head group); each recomputes the
//                 k, v it needs (useful when B * H alone leaves SMs idle)
//   heads_per_cta heads one CTA processes (the h tile is loaded once for all of them); for
//                 head_dim < 16 a multiple of 16/head_dim (heads are packed into 16-wide units)
//   seqs_per_cta  consecutive sequences one CTA loops over (Wqkv staged once for all of them)
struct QkvAttentionMap {
  int q_split = 1;
  int heads_per_cta = 1;
  int seqs_per_cta = 1;
};

// True when the kernel can run these parameters with this map: head_dim in {8, 16, 32, 64, 128},
// D = H * head_dim a multiple of 16, 1 <= S <= 128, B * S <= INT_MAX (int32 row indices, like
// seq_start), 16-byte aligned h / w_qkv / o, a valid map, and shared memory within the current
// device's per-block limit. Dense and packed layouts are served by every map.
bool qkv_attention_fused_supports(const QkvAttentionParams& p, const QkvAttentionMap& m);

// Supported maps worth timing for this shape, default first (one unit of heads per CTA, short
// sequences packed into one CTA, no query split). Empty when no map is supported.
std::vector<QkvAttentionMap> qkv_attention_fused_candidates(const QkvAttentionParams& p);

// Enqueues the kernel on `stream`: no synchronisation, no allocation, graph-capturable.
// Throws std::invalid_argument when !qkv_attention_fused_supports(p, m). B == 0 launches nothing.
void qkv_attention_fused(const QkvAttentionParams& p, const QkvAttentionMap& m, cudaStream_t stream);

// Profiler name, e.g. "hk::qkv_attention[cuda.fused.hd32.q2h1b1]".
std::string qkv_attention_fused_name(const QkvAttentionParams& p, const QkvAttentionMap& m);

}  // namespace hk::cuda
