// The GEMMs of the CUDA backend, through cuBLASLt.
//
//   out[r, :] = epilogue( in[r, :] . W^T )     r < rows,  W [n, k] (nn.Linear [out, in])
//                                              or, with weight_kn, W^T stored as [k, n]
//
// Row-major activations and nn.Linear weights map to cuBLASLt's column-major "TN" problem
// out^T[n, rows] = W[k, n]^T . in^T[k, rows], both operands K-contiguous (the layout cuBLASLt is
// most tuned for), m = n, so the epilogue's bias (one value per row of D) is the Linear bias.
// The [k, n] weight layout (weight_kn) is the "NN" problem over the same output: cuBLASLt
// dispatches it to other kernels, faster for some skinny shapes (a measured choice).
// Epilogues:
//   bias            out = in W^T + bias                  (out and bias of the output type)
//   bias_gelu_tanh  out = GELU_tanh(in W^T + bias)       (cuBLASLt's GELU is the tanh form)
//   bias_residual   out = residual + in W^T + bias       fp32 C/D (beta = 1), fp32 bias;
//                                                        residual may be `out` (in place)
// Accumulation is fp32 in every case (CUBLAS_COMPUTE_32F: no TF32 for fp32 inputs).
// Everything that depends only on the shape (descriptors, layouts, the heuristic's algorithms)
// is made once by the constructor; one matmul descriptor per bias vector is bound at plan time,
// so run() only enqueues. Host-compilable header.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attention.hpp"  // DType

namespace hk::cuda {

enum class GemmEpilogue { bias, bias_gelu_tanh, bias_residual };
const char* to_string(GemmEpilogue e);  // "bias", "bias_gelu_tanh", "bias_residual"

struct GemmShape {
  int64_t rows = 0;           // tokens
  int n = 0;                  // output features
  int k = 0;                  // input features
  DType in_type = DType::f16;   // W and in
  DType out_type = DType::f16;  // out and bias (bias_residual requires f32)
  GemmEpilogue epilogue = GemmEpilogue::bias;
  bool weight_kn = false;       // W passed to run() is W^T, row-major [k, n]
};

// cuBLASLt workspace: 32 MiB lets the heuristic offer split-K / stream-K algorithms for the
// large GEMMs; more changed nothing in the seed's measurements.
inline constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
// Algorithms kept from the heuristic, best first (a measured dispatch may time them all).
inline constexpr int kLtTopK = 8;

void check_cublas(cublasStatus_t s, const char* what, const char* file, int line);
#define HK_CUBLAS_CHECK(expr) ::hk::cuda::check_cublas((expr), #expr, __FILE__, __LINE__)

// The configuration fields of a cuBLASLt algorithm, short and stable (tune-cache ids):
// "a66.t327.s35.c5.i0.w0.u3.k1.r0" (algo, tile, stages, cluster shape, inner shape, swizzle,
// custom option, split-K, reduction scheme).
std::string algo_fields(const cublasLtMatmulAlgo_t& algo);

class LtGemm {
 public:
  // `bias_example`: one of the bias vectors run() will use (the heuristic reads its alignment;
  // all of them must be at least as aligned). `residual_align`: the alignment in bytes that a
  // residual input is guaranteed to have (bias_residual only; caller-provided buffers get 16).
  LtGemm(cublasLtHandle_t lt, const GemmShape& shape, const void* bias_example,
         size_t workspace_bytes = kLtWorkspaceBytes, int top_k = kLtTopK, unsigned residual_align = 16);
  // Without the heuristic: the `known` algorithms (e.g. kept from an earlier process with the same
  // library and device) become the candidates, in order, each once cublasLtMatmulAlgoCheck accepts
  // it for this problem; available() is false when none is accepted.
  LtGemm(cublasLtHandle_t lt, const GemmShape& shape, const void* bias_example,
         const std::vector<cublasLtMatmulAlgo_t>& known, size_t workspace_bytes = kLtWorkspaceBytes,
         unsigned residual_align = 16);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  const GemmShape& shape() const { return shape_; }
  // False when the heuristic returned no algorithm (e.g. an epilogue this type pair lacks).
  bool available() const { return !candidates_.empty(); }
  const std::vector<cublasLtMatmulHeuristicResult_t>& candidates() const { return candidates_; }
  // How many of candidates() came from the constructor (the heuristic's, or the accepted `known`);
  // the rest were added by set_extra().
  int base_count() const { return base_count_; }
  int selected() const { return selected_; }
  void select(int index);  // one of candidates(); throws on a bad index
  // "algo 21 tile 18 stages 12 splitk 1 ws 0 KiB waves 0.76" for candidate `index` (-1: selected)
  std::string describe(int index = -1) const;

  // Configurations around candidate `index`, each changed in one field, the rest of the algorithm
  // (including what no configuration attribute names) kept: every other cluster shape
  // (`clusters`), then every other tile id its algorithm lists (`tiles`). Those equal to a current
  // candidate are left out; none is checked against the problem yet (set_extra does).
  std::vector<cublasLtMatmulAlgo_t> neighbours(int index, bool clusters, bool tiles) const;
  // neighbours() of every constructor candidate (cluster shapes of all; tile ids of those where
  // `tiles[index]` is true, missing entries false), without repeats across candidates, each with the
  // index of the first candidate it came from. `generated` (optional) counts them before the repeats
  // are dropped.
  struct Neighbour {
    int base;
    cublasLtMatmulAlgo_t algo;
  };
  std::vector<Neighbour> neighbourhood(const std::vector<bool>& tiles, size_t* generated = nullptr) const;
  // Replaces the candidates beyond base_count() with those of `extra` that
  // cublasLtMatmulAlgoCheck accepts for this problem, within the workspace, needing no more
  // alignment of any operand than some constructor candidate does (the heuristic's were chosen
  // for the guaranteed alignments). Returns the candidate index of each of `extra`, -1 where
  // rejected. Resets the selection to 0 when it pointed beyond the base. Needs a bound bias.
  std::vector<int> set_extra(const std::vector<cublasLtMatmulAlgo_t>& extra);

  // Makes a matmul descriptor carrying `bias`; returns the binding run() takes.
  int bind_bias(const void* bias);

  // Enqueues out = epilogue(in W^T) on `stream` with the selected algorithm. `residual` is read
  // only by bias_residual (may equal `out`). `workspace` holds workspace_bytes (from the ctor).
  void run(int binding, const void* W, const void* in, const float* residual, void* out,
           void* workspace, cudaStream_t stream) const;

 private:
  cublasLtHandle_t lt_;
  GemmShape shape_;
  size_t workspace_bytes_;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  std::vector<cublasLtMatmulDesc_t> descs_;  // one per bound bias
  std::vector<cublasLtMatmulHeuristicResult_t> candidates_;
  int base_count_ = 0;
  int selected_ = 0;

  cublasLtMatmulDesc_t make_desc(const void* bias) const;
  // Whether cublasLtMatmulAlgoCheck accepts `algo` for this problem (with `desc`) within the
  // workspace; fills *r (algorithm, state, workspace, waves) when it does.
  bool check(cublasLtMatmulDesc_t desc, const cublasLtMatmulAlgo_t& algo, cublasLtMatmulHeuristicResult_t* r) const;
  // Layouts, a probe descriptor and the preference; then `pick` fills candidates_ (heuristic or
  // check). Cleans up and rethrows on failure.
  template <class Pick>
  void init(const void* bias_example, unsigned residual_align, Pick&& pick);
};

}  // namespace hk::cuda
