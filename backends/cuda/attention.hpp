// The attention op of the CUDA backend: the parameters every attention route takes.
//
// Layout contract (MODEL.md): the fused QKV projection writes one row per token,
//   qkv[t, 0:D)   = q,  qkv[t, D:2D) = k,  qkv[t, 2D:3D) = v,   head h at columns h*hd .. h*hd+hd-1
// and attention writes out[t, h*hd + c] (the [B, S, H, hd] order, so o_proj reads it directly).
// Token t of sequence b at position s is row  seq_start[b] + s  when seq_start is given
// (packed, padding-free layout), else row  b*S + s  (dense layout).
//
// Rows s >= lengths[b] are padding: a route writes zeros there (they never influence valid rows:
// a valid query only attends to keys j < lengths[b], which are valid tokens), so nothing is left
// unwritten. Under `causal` the key mask is implied by j <= i < lengths[b] and may be dropped.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hk::cuda {

enum class DType : int { f16 = 0, f32 = 1 };

struct AttentionParams {
  const void* qkv = nullptr;        // [tokens, qkv_row_stride] elements of `dtype`
  void* out = nullptr;              // [tokens, out_row_stride] elements of `dtype`
  const int32_t* lengths = nullptr; // device, [B], each in 0..S
  const int32_t* seq_start = nullptr;  // device, [B] first row of each sequence; null = b*S
  int B = 0;                        // sequences
  int S = 0;                        // max sequence length (positions per sequence)
  int H = 0;                        // heads
  int head_dim = 0;                 // hd = D / H
  int64_t qkv_row_stride = 0;       // elements between consecutive token rows of qkv (3*D dense)
  int64_t out_row_stride = 0;       // elements between consecutive token rows of out (D dense)
  float scale = 0.f;                // 1/sqrt(hd)
  bool causal = false;
  DType dtype = DType::f16;
};

}  // namespace hk::cuda
