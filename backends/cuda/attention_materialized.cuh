// The materialised-score attention route of the CUDA backend (the "MATH" route): the scores of
// every (head, sequence) are written to a workspace, so the route trades O(H*B*S^2) memory traffic
// for two tensor-core GEMMs that cuBLASLt runs at full rate. It can win where a flash kernel has a
// poor geometry (head_dim 256: one [64, 256] fp32 accumulator per warp group) and the score matrix
// is small; a size limit keeps it away from the shapes where flash's structural win lives.
//
// Per head h (cuBLASLt strided-batched GEMMs over the B sequences, q/k/v of head h being column
// offsets of the fused QKV rows, layout contract: attention.hpp):
//   1. scores[h][b] = scale * q_b k_b^T          fp16 inputs, fp32 accumulation, fp32 scores
//   2. one kernel over all rows: mask (key j >= lengths[b]; causal j > i), softmax in fp32, P
//      rounded to fp16 and written in place over the row's fp32 scores; rows i >= lengths[b] and
//      rows of sequences of length 0 become all-zero P rows
//   3. o[b][:, h*hd : h*hd+hd] = P_b v_b         fp16 inputs, fp32 accumulation, fp16 out
// Padded query rows come out as exact zeros (a zero P row times finite v). Scores stay fp32 to keep
// the error of the route that of the flash kernel (fp32 scores, fp16 P): fp16 scores would add a
// relative error of 2^-11 * |score| to every exponent.
//
// Requirements: f16, dense layout (seq_start null), head_dim a multiple of 8, row strides
// multiples of 8 elements, 16-byte aligned qkv / out, and finite qkv values in padded rows (the
// P V GEMM multiplies them by P = 0; the engine's padded rows are projections of finite
// LayerNorm outputs). Host-compilable header.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "attention.hpp"

namespace hk::cuda {

// cuBLASLt scratch inside the route's workspace: the batched GEMMs here are small per batch and
// rarely take split-K algorithms that need more.
inline constexpr size_t kMaterializedLtWorkspaceBytes = size_t(4) << 20;

// True when the route computes `p` (dtype, layout, head_dim, strides, alignment, int32 limits)
// with a workspace of at most max_workspace_bytes. Host-only: no device call.
bool attention_materialized_supports(const AttentionParams& p, size_t max_workspace_bytes);

// Workspace bytes run() needs for `p`: H*B*S*ld fp32 scores (ld = S rounded up to 8) plus the
// cuBLASLt scratch; 0 when B*S == 0.
size_t attention_materialized_workspace(const AttentionParams& p);

// Profiler name: "hk::attention[cuda.materialized]".
const char* attention_materialized_name();

// The route's state: the cuBLASLt descriptors and heuristic algorithms of each prepared shape.
class MaterializedAttention {
 public:
  // `lt` is borrowed (must outlive this object); null creates an own handle.
  explicit MaterializedAttention(cublasLtHandle_t lt = nullptr);
  ~MaterializedAttention();
  MaterializedAttention(const MaterializedAttention&) = delete;
  MaterializedAttention& operator=(const MaterializedAttention&) = delete;

  // Builds the descriptors and picks the algorithms for this shape (key: B, S, H, head_dim and
  // both row strides; pointers, lengths, causal and scale are run-time values). Plan time only,
  // never inside a capture. A prepared shape returns at once. False (reason in why_not) when
  // !attention_materialized_supports(p, SIZE_MAX) or cuBLASLt offers no algorithm.
  bool prepare(const AttentionParams& p, std::string* why_not = nullptr);
  bool prepared(const AttentionParams& p) const;

  // Enqueues the 2*H GEMMs and the softmax kernel on `stream`: no allocation, no synchronisation,
  // graph-capturable. `workspace` holds attention_materialized_workspace(p) bytes, 256-byte
  // aligned (cudaMalloc). Throws std::logic_error when the shape is not prepared. B*S == 0 is a
  // no-op.
  void run(const AttentionParams& p, void* workspace, cudaStream_t stream) const;

  const char* name() const { return attention_materialized_name(); }
  // The chosen algorithms of a prepared shape, for logs ("qk: algo 21 tile 18 ..; pv: ..").
  std::string plan_info(const AttentionParams& p) const;

 private:
  struct Key {
    int B, S, H, head_dim;
    int64_t qkv_row_stride, out_row_stride;
    bool operator<(const Key& o) const;
  };
  struct Plan;
  static Key key_of(const AttentionParams& p);

  cublasLtHandle_t lt_ = nullptr;
  bool own_handle_ = false;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace hk::cuda
