// Materialised-score attention (entry points and the algorithm: attention_materialized.cuh).
//
// cuBLASLt sees the row-major buffers as column-major matrices (as in gemm_cublaslt.cu):
//   QK^T  C(j, i) = sum_d K(d, j) Q(d, i):  A = K [hd x S, ld R] transposed, B = Q [hd x S, ld R],
//         C = scores [S x S, ld LS] fp32, so row i of a sequence's scores holds keys j contiguous;
//   P V   C(c, i) = sum_j V(c, j) P(j, i):  A = V [hd x S, ld R], B = P [S x S, ld 2*LS] fp16,
//         C = o [hd x S, ld out_row_stride];
// batched over the B sequences with strides S*R (qkv), S*LS / S*2*LS (scores / P), S*out_stride.
// LS = S rounded up to 8 floats: every row, every batch and every head block stays 32-byte
// aligned for any S, so the algorithms need no alignment fallback (the heuristic is told 16).
// P overwrites the first half of its own fp32 score row, hence its leading dimension 2*LS halves.
#include "attention_materialized.cuh"

#include "cublaslt_api.hpp"
#include "common.cuh"
#include "gemm_cublaslt.cuh"  // HK_CUBLAS_CHECK

#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace hk::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kSoftmaxWarps = 4;  // one row per warp
constexpr int kSoftmaxThreads = 32 * kSoftmaxWarps;
// Rows up to this many keys are held in registers (16 float2 per lane); longer rows take the
// three-pass loop over global memory (L2-resident: one row is 4*S bytes).
constexpr int kMaxRegisterKeys = 1024;

int64_t score_ld(int S) { return (int64_t(S) + 7) / 8 * 8; }
int64_t score_bytes(const AttentionParams& p) {
  const int64_t bytes = int64_t(p.H) * p.B * p.S * score_ld(p.S) * int64_t(sizeof(float));
  return (bytes + 255) / 256 * 256;
}

struct SoftmaxArgs {
  float* scores;  // [H][B][S][ld] fp32 in, fp16 P out (row stride 2*ld halves, in place)
  const int32_t* lengths;
  int64_t rows;   // H * B * S
  int B, S;
  int64_t ld;
  bool causal;
};

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Keys j < lim of the row are allowed. float2 pairs (j even): rows are 32-byte aligned and ld is
// even, so a pair never leaves its row; the odd element of a pair crossing lim is masked.
__device__ __forceinline__ float2 load_pair(const float* srow, int j, int lim) {
  if (j >= lim) return make_float2(-INFINITY, -INFINITY);
  float2 v = *reinterpret_cast<const float2*>(srow + j);
  if (j + 1 >= lim) v.y = -INFINITY;
  return v;
}

// One warp per score row: mask, softmax (fp32, exp2 with the max subtracted), P = fp16 written
// over the row's first 2*S bytes. NP float2 pairs per lane hold the row (S <= 64*NP); NP = 0 is
// the loop form for any S. Rows with no allowed key (i >= len, len = 0) become zeros.
template <int NP>
__global__ void __launch_bounds__(kSoftmaxThreads) masked_softmax_kernel(const SoftmaxArgs a) {
  const int64_t row = int64_t(blockIdx.x) * kSoftmaxWarps + threadIdx.x / 32;
  if (row >= a.rows) return;  // warp-uniform
  const int lane = threadIdx.x % 32;
  const int i = int(row % a.S);
  const int b = int((row / a.S) % a.B);
  int len = a.lengths ? a.lengths[b] : a.S;
  len = len < 0 ? 0 : (len > a.S ? a.S : len);
  const int lim = i < len ? (a.causal ? min(len, i + 1) : len) : 0;
  float* srow = a.scores + row * a.ld;
  __half* prow = reinterpret_cast<__half*>(srow);

  if constexpr (NP > 0) {
    float2 v[NP];
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < NP; ++k) {
      v[k] = load_pair(srow, 2 * (lane + 32 * k), lim);
      mx = fmaxf(mx, fmaxf(v[k].x, v[k].y));
    }
    mx = warp_max(mx);
    const float mb = mx == -INFINITY ? 0.f : mx * kLog2e;  // no inf - inf on an empty row
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < NP; ++k) {
      v[k].x = exp2f(fmaf(v[k].x, kLog2e, -mb));
      v[k].y = exp2f(fmaf(v[k].y, kLog2e, -mb));
      sum += v[k].x + v[k].y;
    }
    sum = warp_sum(sum);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    __syncwarp();  // every lane has read its scores before P overwrites them
#pragma unroll
    for (int k = 0; k < NP; ++k) {
      const int j = 2 * (lane + 32 * k);
      if (j < a.S) *reinterpret_cast<__half2*>(prow + j) = __floats2half2_rn(v[k].x * inv, v[k].y * inv);
    }
  } else {
    float mx = -INFINITY;
    for (int j = 2 * lane; j < lim; j += 64) {
      const float2 v = load_pair(srow, j, lim);
      mx = fmaxf(mx, fmaxf(v.x, v.y));
    }
    mx = warp_max(mx);
    const float mb = mx == -INFINITY ? 0.f : mx * kLog2e;
    float sum = 0.f;
    for (int j = 2 * lane; j < lim; j += 64) {
      const float2 v = load_pair(srow, j, lim);
      sum += exp2f(fmaf(v.x, kLog2e, -mb)) + exp2f(fmaf(v.y, kLog2e, -mb));
    }
    sum = warp_sum(sum);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    // Chunk j0 writes halves [j0, j0+64) = floats [j0/2, j0/2+32): all read in this chunk (before
    // the barrier) or an earlier one, and never read again.
    for (int j0 = 0; j0 < a.S; j0 += 64) {  // warp-uniform trip count
      const int j = j0 + 2 * lane;
      const float2 v = load_pair(srow, j, lim);
      __syncwarp();
      if (j < a.S)
        *reinterpret_cast<__half2*>(prow + j) = __floats2half2_rn(exp2f(fmaf(v.x, kLog2e, -mb)) * inv,
                                                                  exp2f(fmaf(v.y, kLog2e, -mb)) * inv);
    }
  }
}

template <int NP>
void launch_softmax(const SoftmaxArgs& a, cudaStream_t stream) {
  const int64_t blocks = (a.rows + kSoftmaxWarps - 1) / kSoftmaxWarps;
  masked_softmax_kernel<NP><<<unsigned(blocks), kSoftmaxThreads, 0, stream>>>(a);
  HK_CUDA_CHECK_LAUNCH();
}

void softmax(const SoftmaxArgs& a, cudaStream_t stream) {
  const int pairs = (a.S + 63) / 64;
  if (pairs <= 1) return launch_softmax<1>(a, stream);
  if (pairs <= 2) return launch_softmax<2>(a, stream);
  if (pairs <= 4) return launch_softmax<4>(a, stream);
  if (pairs <= 8) return launch_softmax<8>(a, stream);
  if (pairs <= kMaxRegisterKeys / 64) return launch_softmax<kMaxRegisterKeys / 64>(a, stream);
  return launch_softmax<0>(a, stream);
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int batch,
                                   int64_t batch_stride) {
  cublasLtMatrixLayout_t l = nullptr;
  HK_CUBLAS_CHECK(lt::api().MatrixLayoutCreate(&l, type, uint64_t(rows), uint64_t(cols), ld));
  try {
    HK_CUBLAS_CHECK(lt::api().MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
    HK_CUBLAS_CHECK(lt::api().MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                                     sizeof(batch_stride)));
  } catch (...) {
    lt::api().MatrixLayoutDestroy(l);
    throw;
  }
  return l;
}

cublasLtMatmulDesc_t make_desc(cublasOperation_t ta, cublasOperation_t tb) {
  cublasLtMatmulDesc_t d = nullptr;
  HK_CUBLAS_CHECK(lt::api().MatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  try {
    HK_CUBLAS_CHECK(lt::api().MatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    HK_CUBLAS_CHECK(lt::api().MatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  } catch (...) {
    lt::api().MatmulDescDestroy(d);
    throw;
  }
  return d;
}

template <class T>
T algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  if (lt::api().MatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return T{};
  return v;
}

std::string describe(const cublasLtMatmulHeuristicResult_t& r) {
  return "algo " + std::to_string(algo_config<int32_t>(r.algo, CUBLASLT_ALGO_CONFIG_ID)) + " tile " +
         std::to_string(algo_config<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_TILE_ID)) + " stages " +
         std::to_string(algo_config<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID)) + " ws " +
         std::to_string(r.workspaceSize >> 10) + " KiB";
}

}  // namespace

// ---- free functions -----------------------------------------------------------------------------
bool attention_materialized_supports(const AttentionParams& p, size_t max_workspace_bytes) {
  if (p.dtype != DType::f16 || p.seq_start != nullptr) return false;
  if (p.B < 0 || p.S < 0 || p.H < 1 || p.head_dim < 8 || p.head_dim % 8 != 0) return false;
  const int64_t D = int64_t(p.H) * p.head_dim;
  if (p.qkv_row_stride < 3 * D || p.out_row_stride < D) return false;
  if (p.qkv_row_stride % 8 != 0 || p.out_row_stride % 8 != 0) return false;
  if (int64_t(p.B) * p.S > 0) {
    if (!p.qkv || !p.out || !aligned16(p.qkv) || !aligned16(p.out)) return false;
  }
  // Softmax grid: H*B*S rows, kSoftmaxWarps per block, grid x < 2^31.
  if ((int64_t(p.H) * p.B * p.S + kSoftmaxWarps - 1) / kSoftmaxWarps > INT_MAX) return false;
  return attention_materialized_workspace(p) <= max_workspace_bytes;
}

size_t attention_materialized_workspace(const AttentionParams& p) {
  if (p.B <= 0 || p.S <= 0 || p.H <= 0) return 0;
  return size_t(score_bytes(p)) + kMaterializedLtWorkspaceBytes;
}

const char* attention_materialized_name() { return "hk::attention[cuda.materialized]"; }

// ---- the route's state --------------------------------------------------------------------------
struct MaterializedAttention::Plan {
  bool empty = false;  // B*S == 0: nothing to launch
  cublasLtMatmulDesc_t qk = nullptr, pv = nullptr;
  cublasLtMatrixLayout_t k = nullptr, q = nullptr, s = nullptr;  // QK^T operands
  cublasLtMatrixLayout_t v = nullptr, pm = nullptr, o = nullptr;  // P V operands
  cublasLtMatmulHeuristicResult_t qk_algo{}, pv_algo{};
  ~Plan() {
    for (cublasLtMatmulDesc_t d : {qk, pv})
      if (d) lt::api().MatmulDescDestroy(d);
    for (cublasLtMatrixLayout_t l : {k, q, s, v, pm, o})
      if (l) lt::api().MatrixLayoutDestroy(l);
  }
};

bool MaterializedAttention::Key::operator<(const Key& o) const {
  return std::tie(B, S, H, head_dim, qkv_row_stride, out_row_stride) <
         std::tie(o.B, o.S, o.H, o.head_dim, o.qkv_row_stride, o.out_row_stride);
}

MaterializedAttention::Key MaterializedAttention::key_of(const AttentionParams& p) {
  return Key{p.B, p.S, p.H, p.head_dim, p.qkv_row_stride, p.out_row_stride};
}

MaterializedAttention::MaterializedAttention(cublasLtHandle_t lt) : lt_(lt) {
  if (!lt_) {
    HK_CUBLAS_CHECK(lt::api().Create(&lt_));
    own_handle_ = true;
  }
}

MaterializedAttention::~MaterializedAttention() {
  plans_.clear();
  if (own_handle_) lt::api().Destroy(lt_);
}

bool MaterializedAttention::prepared(const AttentionParams& p) const { return plans_.count(key_of(p)) != 0; }

bool MaterializedAttention::prepare(const AttentionParams& p, std::string* why_not) {
  auto fail = [&](const std::string& why) {
    if (why_not) *why_not = why;
    return false;
  };
  if (!attention_materialized_supports(p, SIZE_MAX)) return fail("unsupported parameters (dtype, layout, head_dim, strides)");
  const Key key = key_of(p);
  if (plans_.count(key)) return true;
  auto plan = std::make_unique<Plan>();
  if (int64_t(p.B) * p.S == 0) {
    plan->empty = true;
    plans_.emplace(key, std::move(plan));
    return true;
  }
  const int64_t S = p.S, hd = p.head_dim, R = p.qkv_row_stride, LS = score_ld(p.S), O = p.out_row_stride;
  Plan& P = *plan;
  P.qk = make_desc(CUBLAS_OP_T, CUBLAS_OP_N);
  P.pv = make_desc(CUBLAS_OP_N, CUBLAS_OP_N);
  P.k = make_layout(CUDA_R_16F, hd, S, R, p.B, S * R);
  P.q = make_layout(CUDA_R_16F, hd, S, R, p.B, S * R);
  P.s = make_layout(CUDA_R_32F, S, S, LS, p.B, S * LS);
  P.v = make_layout(CUDA_R_16F, hd, S, R, p.B, S * R);
  P.pm = make_layout(CUDA_R_16F, S, S, 2 * LS, p.B, S * 2 * LS);
  P.o = make_layout(CUDA_R_16F, hd, S, O, p.B, S * O);

  cublasLtMatmulPreference_t pref = nullptr;
  HK_CUBLAS_CHECK(lt::api().MatmulPreferenceCreate(&pref));
  std::string why;
  try {
    const uint64_t ws = kMaterializedLtWorkspaceBytes;
    HK_CUBLAS_CHECK(lt::api().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    // Per-head column offsets of qkv and out are only 16-byte aligned (hd a multiple of 8).
    const uint32_t align = 16;
    for (cublasLtMatmulPreferenceAttributes_t a :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      HK_CUBLAS_CHECK(lt::api().MatmulPreferenceSetAttribute(pref, a, &align, sizeof(align)));
    auto pick = [&](cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                    cublasLtMatrixLayout_t c, cublasLtMatmulHeuristicResult_t& out, const char* what) {
      std::vector<cublasLtMatmulHeuristicResult_t> found(4);
      int count = 0;
      const cublasStatus_t st =
          lt::api().MatmulAlgoGetHeuristic(lt_, d, a, b, c, c, pref, int(found.size()), found.data(), &count);
      if (st != CUBLAS_STATUS_NOT_SUPPORTED) HK_CUBLAS_CHECK(st);
      for (int i = 0; i < count && st == CUBLAS_STATUS_SUCCESS; ++i)
        if (found[size_t(i)].state == CUBLAS_STATUS_SUCCESS && found[size_t(i)].workspaceSize <= ws) {
          out = found[size_t(i)];
          return true;
        }
      why = std::string("cuBLASLt offers no algorithm for the ") + what + " GEMM";
      return false;
    };
    const bool ok = pick(P.qk, P.k, P.q, P.s, P.qk_algo, "QK^T") && pick(P.pv, P.v, P.pm, P.o, P.pv_algo, "P V");
    lt::api().MatmulPreferenceDestroy(pref);
    if (!ok) return fail(why);
  } catch (...) {
    lt::api().MatmulPreferenceDestroy(pref);
    throw;
  }
  plans_.emplace(key, std::move(plan));
  return true;
}

void MaterializedAttention::run(const AttentionParams& p, void* workspace, cudaStream_t stream) const {
  const auto it = plans_.find(key_of(p));
  if (it == plans_.end()) throw std::logic_error("hk::attention[cuda.materialized]: shape not prepared");
  const Plan& P = *it->second;
  if (P.empty) return;
  if (!attention_materialized_supports(p, SIZE_MAX) || !workspace)
    throw std::invalid_argument("hk::attention[cuda.materialized]: unsupported parameters or no workspace");
  const int64_t D = int64_t(p.H) * p.head_dim, hd = p.head_dim;
  const int64_t head_scores = int64_t(p.B) * p.S * score_ld(p.S);  // floats per head block
  float* scores = static_cast<float*>(workspace);
  void* lt_ws = static_cast<char*>(workspace) + score_bytes(p);
  const __half* qkv = static_cast<const __half*>(p.qkv);
  __half* out = static_cast<__half*>(p.out);
  const float alpha_qk = p.scale, one = 1.f, zero = 0.f;

  for (int h = 0; h < p.H; ++h) {
    float* s = scores + h * head_scores;
    HK_CUBLAS_CHECK(lt::api().Matmul(lt_, P.qk, &alpha_qk, qkv + D + h * hd, P.k, qkv + h * hd, P.q, &zero, s, P.s, s,
                                   P.s, &P.qk_algo.algo, lt_ws, kMaterializedLtWorkspaceBytes, stream));
  }
  SoftmaxArgs a;
  a.scores = scores;
  a.lengths = p.lengths;
  a.rows = int64_t(p.H) * p.B * p.S;
  a.B = p.B;
  a.S = p.S;
  a.ld = score_ld(p.S);
  a.causal = p.causal;
  softmax(a, stream);
  for (int h = 0; h < p.H; ++h) {
    const __half* pm = reinterpret_cast<const __half*>(scores + h * head_scores);
    __half* o = out + h * hd;
    HK_CUBLAS_CHECK(lt::api().Matmul(lt_, P.pv, &one, qkv + 2 * D + h * hd, P.v, pm, P.pm, &zero, o, P.o, o, P.o,
                                   &P.pv_algo.algo, lt_ws, kMaterializedLtWorkspaceBytes, stream));
  }
}

std::string MaterializedAttention::plan_info(const AttentionParams& p) const {
  const auto it = plans_.find(key_of(p));
  if (it == plans_.end()) return "";
  if (it->second->empty) return "empty shape";
  return "qk: " + describe(it->second->qk_algo) + "; pv: " + describe(it->second->pv_algo);
}

}  // namespace hk::cuda
