// cuBLASLt GEMMs (see gemm_cublaslt.cuh). Host code only: every kernel comes from cuBLASLt.
#include "gemm_cublaslt.cuh"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <string>

#include "cublaslt_api.hpp"
#include "common.cuh"

namespace hk::cuda {
namespace {

cudaDataType_t cuda_type(DType t) { return t == DType::f16 ? CUDA_R_16F : CUDA_R_32F; }

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  return e == GemmEpilogue::bias_gelu_tanh ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
}

template <class T>
T algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  if (lt::api().MatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS)
    return T{};
  return v;
}

template <class T>
void set_algo_config(cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr, T v) {
  lt::api().MatmulAlgoConfigSetAttribute(&algo, attr, &v, sizeof(v));
}

// A capability list of uint32 ids (tile ids); empty when the algorithm lists none.
std::vector<uint32_t> algo_cap_ids(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  if (lt::api().MatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0)
    return {};
  std::vector<uint32_t> ids(bytes / sizeof(uint32_t));
  size_t written = 0;
  if (lt::api().MatmulAlgoCapGetAttribute(&algo, attr, ids.data(), bytes, &written) != CUBLAS_STATUS_SUCCESS)
    return {};
  return ids;
}

// The minimum alignments (bytes) of A, B, C and D the algorithm needs; 256 (the most any
// asks) where the capability cannot be read.
std::array<uint32_t, 4> algo_alignments(const cublasLtMatmulAlgo_t& algo) {
  const cublasLtMatmulAlgoCapAttributes_t attrs[4] = {
      CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES};
  std::array<uint32_t, 4> a{};
  for (int i = 0; i < 4; ++i) {
    uint32_t v = 256;
    size_t written = 0;
    if (lt::api().MatmulAlgoCapGetAttribute(&algo, attrs[i], &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS)
      v = 256;
    a[size_t(i)] = v;
  }
  return a;
}

}  // namespace

const char* to_string(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::bias: return "bias";
    case GemmEpilogue::bias_gelu_tanh: return "bias_gelu_tanh";
    case GemmEpilogue::bias_residual: return "bias_residual";
  }
  return "?";
}

std::string algo_fields(const cublasLtMatmulAlgo_t& a) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "a%d.t%u.s%u.c%u.i%u.w%u.u%u.k%d.r%u",
                algo_config<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID), algo_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
                algo_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                unsigned(algo_config<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)),
                unsigned(algo_config<uint16_t>(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID)),
                algo_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                algo_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
                algo_config<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                algo_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME));
  return buf;
}

void check_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw CudaError(std::string("cuBLASLt error in ") + what + " (" + file + ":" + std::to_string(line) +
                    "): " + lt::api().GetStatusString(s));
}

template <class Pick>
void LtGemm::init(const void* bias_example, unsigned residual_align, Pick&& pick) {
  const GemmShape& shape = shape_;
  if (shape.rows <= 0 || shape.n <= 0 || shape.k <= 0)
    throw CudaError("LtGemm: empty shape rows=" + std::to_string(shape.rows) + " n=" + std::to_string(shape.n) +
                    " k=" + std::to_string(shape.k));
  if (shape.epilogue == GemmEpilogue::bias_residual && shape.out_type != DType::f32)
    throw CudaError("LtGemm: the residual epilogue writes the fp32 residual stream");
  const cudaDataType_t ab = cuda_type(shape.in_type), cd = cuda_type(shape.out_type);
  // Column-major views of the row-major buffers (see the header): W as k x n (ld k), the
  // activations as k x rows (ld k), the output as n x rows (ld n).
  cublasLtMatmulDesc_t probe = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  try {
    if (shape.weight_kn) {  // row-major [k, n] is column-major n x k (ld n), used untransposed
      HK_CUBLAS_CHECK(lt::api().MatrixLayoutCreate(&a_, ab, uint64_t(shape.n), uint64_t(shape.k), int64_t(shape.n)));
    } else {
      HK_CUBLAS_CHECK(lt::api().MatrixLayoutCreate(&a_, ab, uint64_t(shape.k), uint64_t(shape.n), int64_t(shape.k)));
    }
    HK_CUBLAS_CHECK(lt::api().MatrixLayoutCreate(&b_, ab, uint64_t(shape.k), uint64_t(shape.rows), int64_t(shape.k)));
    HK_CUBLAS_CHECK(lt::api().MatrixLayoutCreate(&c_, cd, uint64_t(shape.n), uint64_t(shape.rows), int64_t(shape.n)));
    probe = make_desc(bias_example);
    HK_CUBLAS_CHECK(lt::api().MatmulPreferenceCreate(&pref));
    const uint64_t ws = workspace_bytes_;
    HK_CUBLAS_CHECK(lt::api().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    if (shape.epilogue == GemmEpilogue::bias_residual) {
      // The residual input of layer 0 is the caller's x, guaranteed only 16-byte aligned.
      const uint32_t c_align = residual_align;
      HK_CUBLAS_CHECK(lt::api().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                           &c_align, sizeof(c_align)));
    }
    pick(probe, pref);
  } catch (...) {
    if (pref) lt::api().MatmulPreferenceDestroy(pref);
    if (probe) lt::api().MatmulDescDestroy(probe);
    if (a_) lt::api().MatrixLayoutDestroy(a_);
    if (b_) lt::api().MatrixLayoutDestroy(b_);
    if (c_) lt::api().MatrixLayoutDestroy(c_);
    throw;
  }
  lt::api().MatmulPreferenceDestroy(pref);
  lt::api().MatmulDescDestroy(probe);
}

LtGemm::LtGemm(cublasLtHandle_t lt, const GemmShape& shape, const void* bias_example,
               size_t workspace_bytes, int top_k, unsigned residual_align)
    : lt_(lt), shape_(shape), workspace_bytes_(workspace_bytes) {
  init(bias_example, residual_align, [&](cublasLtMatmulDesc_t probe, cublasLtMatmulPreference_t pref) {
    std::vector<cublasLtMatmulHeuristicResult_t> found(size_t(top_k > 0 ? top_k : 1));
    int count = 0;
    const cublasStatus_t st = lt::api().MatmulAlgoGetHeuristic(lt_, probe, a_, b_, c_, c_, pref, int(found.size()),
                                                             found.data(), &count);
    // NOT_SUPPORTED means "no algorithm for this problem": available() reports it.
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) HK_CUBLAS_CHECK(st);
    for (int i = 0; i < count && st == CUBLAS_STATUS_SUCCESS; ++i)
      if (found[size_t(i)].state == CUBLAS_STATUS_SUCCESS) candidates_.push_back(found[size_t(i)]);
  });
  base_count_ = int(candidates_.size());
}

LtGemm::LtGemm(cublasLtHandle_t lt, const GemmShape& shape, const void* bias_example,
               const std::vector<cublasLtMatmulAlgo_t>& known, size_t workspace_bytes, unsigned residual_align)
    : lt_(lt), shape_(shape), workspace_bytes_(workspace_bytes) {
  init(bias_example, residual_align, [&](cublasLtMatmulDesc_t probe, cublasLtMatmulPreference_t) {
    for (const cublasLtMatmulAlgo_t& algo : known) {
      cublasLtMatmulHeuristicResult_t r{};
      // Rejected (another library, device or problem): skipped, not an error.
      if (check(probe, algo, &r)) candidates_.push_back(r);
    }
  });
  base_count_ = int(candidates_.size());
}

LtGemm::~LtGemm() {
  for (auto d : descs_) lt::api().MatmulDescDestroy(d);
  if (a_) lt::api().MatrixLayoutDestroy(a_);
  if (b_) lt::api().MatrixLayoutDestroy(b_);
  if (c_) lt::api().MatrixLayoutDestroy(c_);
}

cublasLtMatmulDesc_t LtGemm::make_desc(const void* bias) const {
  cublasLtMatmulDesc_t d = nullptr;
  HK_CUBLAS_CHECK(lt::api().MatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  try {
    const cublasOperation_t ta = shape_.weight_kn ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const cublasLtEpilogue_t epi = lt_epilogue(shape_.epilogue);
    HK_CUBLAS_CHECK(lt::api().MatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    HK_CUBLAS_CHECK(lt::api().MatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    HK_CUBLAS_CHECK(lt::api().MatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    HK_CUBLAS_CHECK(lt::api().MatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  } catch (...) {
    lt::api().MatmulDescDestroy(d);
    throw;
  }
  return d;
}

void LtGemm::select(int index) {
  if (index < 0 || index >= int(candidates_.size()))
    throw CudaError("LtGemm::select: no candidate " + std::to_string(index) + " (have " +
                    std::to_string(candidates_.size()) + ")");
  selected_ = index;
}

std::string LtGemm::describe(int index) const {
  if (index < 0) index = selected_;
  if (index >= int(candidates_.size())) return "no algorithm";
  const cublasLtMatmulHeuristicResult_t& r = candidates_[size_t(index)];
  char buf[192];
  std::snprintf(buf, sizeof(buf), "algo %d tile %u stages %u cluster %u splitk %d ws %zu KiB waves %.2f",
                algo_config<int32_t>(r.algo, CUBLASLT_ALGO_CONFIG_ID),
                algo_config<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                algo_config<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                unsigned(algo_config<uint16_t>(r.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)),
                algo_config<int32_t>(r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), r.workspaceSize >> 10,
                double(r.wavesCount));
  return buf;
}

bool LtGemm::check(cublasLtMatmulDesc_t desc, const cublasLtMatmulAlgo_t& algo,
                   cublasLtMatmulHeuristicResult_t* r) const {
  if (lt::api().MatmulAlgoCheck(lt_, desc, a_, b_, c_, c_, &algo, r) != CUBLAS_STATUS_SUCCESS) return false;
  if (r->workspaceSize > workspace_bytes_) return false;
  r->algo = algo;
  r->state = CUBLAS_STATUS_SUCCESS;
  return true;
}

std::vector<cublasLtMatmulAlgo_t> LtGemm::neighbours(int index, bool clusters, bool tiles) const {
  if (index < 0 || index >= int(candidates_.size()))
    throw CudaError("LtGemm::neighbours: no candidate " + std::to_string(index));
  const cublasLtMatmulAlgo_t& base = candidates_[size_t(index)].algo;
  std::vector<cublasLtMatmulAlgo_t> out;
  const auto seen = [&](const cublasLtMatmulAlgo_t& a) {
    for (const auto& r : candidates_)
      if (std::memcmp(&r.algo, &a, sizeof a) == 0) return true;
    for (const auto& o : out)
      if (std::memcmp(&o, &a, sizeof a) == 0) return true;
    return false;
  };
  if (clusters) {
    for (uint16_t cl = CUBLASLT_CLUSTER_SHAPE_1x1x1; cl < CUBLASLT_CLUSTER_SHAPE_END; ++cl) {
      cublasLtMatmulAlgo_t a = base;
      set_algo_config(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cl);
      if (!seen(a)) out.push_back(a);
    }
  }
  if (tiles) {
    for (uint32_t t : algo_cap_ids(base, CUBLASLT_ALGO_CAP_TILE_IDS)) {
      cublasLtMatmulAlgo_t a = base;
      set_algo_config(a, CUBLASLT_ALGO_CONFIG_TILE_ID, t);
      if (!seen(a)) out.push_back(a);
    }
  }
  return out;
}

std::vector<LtGemm::Neighbour> LtGemm::neighbourhood(const std::vector<bool>& tiles, size_t* generated) const {
  std::vector<Neighbour> out;
  if (generated) *generated = 0;
  for (int b = 0; b < base_count_; ++b) {
    const bool with_tiles = size_t(b) < tiles.size() && tiles[size_t(b)];
    for (const cublasLtMatmulAlgo_t& a : neighbours(b, true, with_tiles)) {
      if (generated) ++*generated;
      bool seen = false;
      for (const Neighbour& o : out) seen = seen || std::memcmp(&o.algo, &a, sizeof a) == 0;
      if (!seen) out.push_back({b, a});
    }
  }
  return out;
}

std::vector<int> LtGemm::set_extra(const std::vector<cublasLtMatmulAlgo_t>& extra) {
  if (descs_.empty()) throw CudaError("LtGemm::set_extra: bind a bias first");
  candidates_.resize(size_t(base_count_));
  if (selected_ >= base_count_) selected_ = 0;
  // Every constructor candidate runs on the operands' guaranteed alignments, so the most any of
  // them needs is guaranteed.
  std::array<uint32_t, 4> limit = {0, 0, 0, 0};
  for (const auto& r : candidates_) {
    const std::array<uint32_t, 4> a = algo_alignments(r.algo);
    for (size_t i = 0; i < 4; ++i) limit[i] = std::max(limit[i], a[i]);
  }
  std::vector<int> index(extra.size(), -1);
  for (size_t j = 0; j < extra.size(); ++j) {
    cublasLtMatmulHeuristicResult_t r{};
    if (!check(descs_.front(), extra[j], &r)) continue;
    const std::array<uint32_t, 4> a = algo_alignments(extra[j]);
    bool aligned = true;
    for (size_t i = 0; i < 4; ++i) aligned = aligned && a[i] <= limit[i];
    if (!aligned) continue;
    index[j] = int(candidates_.size());
    candidates_.push_back(r);
  }
  return index;
}

int LtGemm::bind_bias(const void* bias) {
  descs_.push_back(make_desc(bias));
  return int(descs_.size()) - 1;
}

void LtGemm::run(int binding, const void* W, const void* in, const float* residual, void* out,
                 void* workspace, cudaStream_t stream) const {
  if (candidates_.empty()) throw CudaError("LtGemm::run: no cuBLASLt algorithm for this shape");
  const float alpha = 1.f;
  const float beta = shape_.epilogue == GemmEpilogue::bias_residual ? 1.f : 0.f;
  const void* c = shape_.epilogue == GemmEpilogue::bias_residual ? static_cast<const void*>(residual) : out;
  const cublasLtMatmulHeuristicResult_t& r = candidates_[size_t(selected_)];
  HK_CUBLAS_CHECK(lt::api().Matmul(lt_, descs_.at(size_t(binding)), &alpha, W, a_, in, b_, &beta, c, c_, out, c_,
                                 &r.algo, workspace, workspace_bytes_, stream));
}

}  // namespace hk::cuda
