// The cuDNN route of the CUDA backend's attention op: fused softmax(q k^T * scale) v through the
// cuDNN backend graph API (the composite SDPA graph; NOTES-attention.md explains why this form).
//   f16 only, dense layout (seq_start null), head_dim a multiple of 8 up to 256 (Hopper) or 128
//   (Ampere), 16-byte aligned pointers and row strides. Semantics are AttentionParams' exactly:
//   keys j >= lengths[b] are masked, query rows s >= lengths[b] are written as zeros.
// Plans are built per shape by prepare() (slow, ~0.4 s) and cached; run() only executes and is
// capturable into a CUDA graph. Host code: this header does not include cudnn.h.
#pragma once

#include "attention.hpp"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

struct cudnnContext;  // cuDNN's handle type (cudnnHandle_t is a cudnnContext*)

namespace hk::cuda {

class CudnnAttention {
 public:
  CudnnAttention();
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // cuDNN usable here: runtime >= 9.0 and not 9.10.0/9.10.1 (known-bad forward), its graph
  // sub-library consistent, current device sm >= 80. `why_not` receives the reason when false.
  // Evaluated once per process.
  static bool runtime_ok(std::string* why_not = nullptr);
  // cudnnGetVersion() of the loaded runtime, e.g. 91400 for 9.14.0.
  static int runtime_version();

  // True when this route computes `p` (dtype, layout, head_dim, alignment, runtime, device).
  bool supports(const AttentionParams& p) const;

  // Builds and finalises the plan of this shape (key: B, S, H, head_dim, causal, both row
  // strides); a cached shape returns at once. Call before any graph capture. `stream` is only
  // bound to the cuDNN handle. Throws CudaError naming the failing descriptor/attribute.
  void prepare(const AttentionParams& p, cudaStream_t stream);

  // Workspace run() needs for this shape (0 is common). Builds the plan if it is not cached.
  size_t workspace_bytes(const AttentionParams& p) const;

  // Executes the prepared plan and zeros the padded query rows: no allocation, no
  // synchronisation, graph-capturable. `workspace` holds workspace_bytes(p) bytes (may be null
  // when that is 0). Throws std::logic_error when the shape was not prepared.
  void run(const AttentionParams& p, void* workspace, cudaStream_t stream);

  const char* name() const { return "hk::attention[cuda.cudnn]"; }

  // The chosen engine and workspace of a prepared shape, for logs and tests
  // (e.g. "engine 8, workspace 0 B"); empty when the shape is not prepared.
  std::string plan_info(const AttentionParams& p) const;

 private:
  struct Key {
    int B, S, H, head_dim;
    bool causal;
    int64_t qkv_row_stride, out_row_stride;
    bool operator<(const Key& o) const;
  };
  struct Plan;

  static Key key_of(const AttentionParams& p);
  Plan& plan_for(const AttentionParams& p) const;  // cached or freshly built
  void ensure_handle() const;

  // Mutable: the plan cache and the handle are built lazily by const queries (workspace_bytes).
  mutable cudnnContext* handle_ = nullptr;
  mutable int device_ = -1;
  mutable int sm_major_ = -1;
  mutable std::map<Key, std::unique_ptr<Plan>> plans_;
};

namespace detail {
// Writes zeros to out[b*S + s, 0:D) for every s >= lengths[b] (f16, 16-byte aligned rows).
// Capturable; defined in attention_cudnn_zero.cu.
void zero_padded_rows_f16(void* out, const int32_t* lengths, int B, int S, int D,
                          int64_t out_row_stride, cudaStream_t stream);
}  // namespace detail

}  // namespace hk::cuda
