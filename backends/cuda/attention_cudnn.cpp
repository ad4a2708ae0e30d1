// The cuDNN attention route: builds the composite SDPA operation graph with the raw cuDNN
// backend API (no cudnn-frontend here), picks an engine by heuristics, caches one execution
// plan per shape, and executes it with a variant pack built from AttentionParams' pointers.
//
// The graph (what cuDNN's fused flash-attention engine recognises, with a 9.14 runtime):
//   S  = matmul(Q, K^T)                 M override = seq_len_q, N override = seq_len_kv
//   S *= scale                          (by-value float)
//   padding mask: row < seq_len_q AND col < seq_len_kv, else -inf   (GEN_INDEX axes 2 / 3)
//   causal mask:  row >= col, else -inf                              (own GEN_INDEX pair)
//   softmax: max, sub, exp, sum, div  (+ log, add: the statistics branch, kept virtual)
//   O  = matmul(P, V)                   P in f16; M override = seq_len_q, K override = seq_len_kv
// Every cudnnBackend* call is checked; a failure throws CudaError naming the descriptor and the
// attribute, plus cuDNN's own last-error text.
#include "attention_cudnn.cuh"

#include "common.cuh"

#include <cudnn.h>

#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace hk::cuda {
namespace {

constexpr const char* kRoute = "hk::attention[cuda.cudnn]";

std::string status_text(cudnnStatus_t s) {
  std::string m = cudnnGetErrorString(s);
  char last[1024] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  if (last[0] != '\0') {
    m += " (";
    m += last;
    m += ")";
  }
  return m;
}

void check(cudnnStatus_t s, const std::string& what) {
  if (s != CUDNN_STATUS_SUCCESS) {
    throw CudaError(std::string(kRoute) + ": " + what + " failed: " + status_text(s));
  }
}

// ---- a backend descriptor with a name for error messages ---------------------------------------

class Desc {
 public:
  Desc(cudnnBackendDescriptorType_t type, std::string name) : name_(std::move(name)) {
    check(cudnnBackendCreateDescriptor(type, &d_), "cudnnBackendCreateDescriptor(" + name_ + ")");
  }
  ~Desc() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  const std::string& name() const { return name_; }

  void set(cudnnBackendAttributeName_t attr, const char* attr_name,
           cudnnBackendAttributeType_t type, int64_t count, const void* values) {
    check(cudnnBackendSetAttribute(d_, attr, type, count, values),
          "SetAttribute " + name_ + "." + attr_name);
  }
  void set_desc(cudnnBackendAttributeName_t attr, const char* attr_name, const Desc& value) {
    cudnnBackendDescriptor_t v = value.get();
    check(cudnnBackendSetAttribute(d_, attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v),
          "SetAttribute " + name_ + "." + attr_name + " = " + value.name());
  }
  void finalize() { check(cudnnBackendFinalize(d_), "Finalize " + name_); }
  // For candidates that may legitimately fail (engine configs): status instead of a throw.
  cudnnStatus_t try_finalize() { return cudnnBackendFinalize(d_); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  std::string name_;
};

// Stringifies the attribute so the error message names it.
#define HK_SET(desc, attr, type, count, values) (desc).set(attr, #attr, type, count, values)
#define HK_SET_DESC(desc, attr, value) (desc).set_desc(attr, #attr, value)

using Dims = std::array<int64_t, 4>;

Dims packed_strides(const Dims& d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

// ---- the graph builder: owns every descriptor, keeps the ops in topological order ---------------

class GraphBuilder {
 public:
  // Non-virtual tensors get fixed uids (the variant pack names them); virtual ones count from here.
  static constexpr int64_t kFirstVirtualUid = 1000;

  Desc& tensor(const std::string& name, int64_t uid, cudnnDataType_t dtype, const Dims& dims,
               const Dims& strides, bool is_virtual, bool by_value = false) {
    Desc& t = own(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor " + name);
    const int64_t alignment = 16;
    HK_SET(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype);
    HK_SET(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    HK_SET(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    HK_SET(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    HK_SET(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    HK_SET(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) HK_SET(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    t.finalize();
    return t;
  }

  // A graph-internal tensor, packed row-major (its strides only fix the logical order).
  Desc& virt(const std::string& name, cudnnDataType_t dtype, const Dims& dims) {
    return tensor(name, next_virtual_uid_++, dtype, dims, packed_strides(dims), true);
  }

  // A host scalar passed by value through the variant pack.
  Desc& scalar(const std::string& name, int64_t uid) {
    return tensor(name, uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x[, b[, t]]). `axis` only for GEN_INDEX.
  void pointwise(const std::string& name, cudnnPointwiseMode_t mode, cudnnDataType_t math,
                 const Desc& x, const Desc* b, const Desc* t, const Desc& y, int64_t axis = -1) {
    Desc& pw = own(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, name + ".pointwise");
    HK_SET(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    HK_SET(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (mode == CUDNN_POINTWISE_GEN_INDEX) {
      HK_SET(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    }
    pw.finalize();

    Desc& op = own(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name);
    HK_SET_DESC(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    HK_SET_DESC(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b != nullptr) HK_SET_DESC(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t != nullptr) HK_SET_DESC(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    HK_SET_DESC(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    const float one = 1.0f;
    HK_SET(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    HK_SET(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    op.finalize();
    ops_.push_back(op.get());
  }

  // c = a @ b over the last two dims, fp32 accumulation; the overrides are per-batch INT32
  // sizes (the sequence lengths) that bound M, N, K.
  void matmul(const std::string& name, const Desc& a, const Desc& b, const Desc& c,
              const Desc* m_override, const Desc* n_override, const Desc* k_override) {
    Desc& mm = own(CUDNN_BACKEND_MATMUL_DESCRIPTOR, name + ".matmul");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    const double padding = 0.0;  // value of the product outside the overridden extents
    HK_SET(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    HK_SET(mm, CUDNN_ATTR_MATMUL_PADDING_VALUE, CUDNN_TYPE_DOUBLE, 1, &padding);
    mm.finalize();

    Desc& op = own(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name);
    HK_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    HK_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    HK_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    if (m_override != nullptr) {
      HK_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, *m_override);
    }
    if (n_override != nullptr) {
      HK_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, *n_override);
    }
    if (k_override != nullptr) {
      HK_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, *k_override);
    }
    HK_SET_DESC(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    op.finalize();
    ops_.push_back(op.get());
  }

  // y = reduce(x) over the dims where y has extent 1.
  void reduction(const std::string& name, cudnnReduceTensorOp_t reduce_op, const Desc& x,
                 const Desc& y) {
    Desc& rd = own(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, name + ".reduction");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    HK_SET(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce_op);
    HK_SET(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    rd.finalize();

    Desc& op = own(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name);
    HK_SET_DESC(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd);
    HK_SET_DESC(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    HK_SET_DESC(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    op.finalize();
    ops_.push_back(op.get());
  }

  Desc& operation_graph(cudnnHandle_t handle) {
    Desc& g = own(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    HK_SET(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
           static_cast<int64_t>(ops_.size()), ops_.data());
    // Marked deprecated in the 9.19 headers; the 9.14 runtime still takes the handle here.
    HK_SET(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    g.finalize();
    return g;
  }

  size_t descriptor_count() const { return owned_.size(); }
  size_t op_count() const { return ops_.size(); }

  // The descriptors must outlive the plan built from them: hand them over to it.
  std::vector<std::unique_ptr<Desc>> release() { return std::move(owned_); }

 private:
  Desc& own(cudnnBackendDescriptorType_t type, std::string name) {
    owned_.push_back(std::make_unique<Desc>(type, std::move(name)));
    return *owned_.back();
  }

  std::vector<std::unique_ptr<Desc>> owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_uid_ = kFirstVirtualUid;
};

// Uids of the tensors the variant pack binds.
enum Uid : int64_t {
  kUidQ = 1,
  kUidK = 2,
  kUidV = 3,
  kUidO = 4,
  kUidSeqLenQ = 5,
  kUidSeqLenKV = 6,
  kUidScale = 7,
  kUidNegInfPadding = 8,
  kUidNegInfCausal = 9,
};

// Masked scores. -inf is what cuDNN >= 9.10 expects (older runtimes preferred float lowest()).
constexpr float kMaskedScore = -std::numeric_limits<float>::infinity();

struct RuntimeStatus {
  bool ok = false;
  std::string why_not;
  int version = 0;
};

const RuntimeStatus& runtime_status() {
  static const RuntimeStatus status = [] {
    RuntimeStatus r;
    r.version = static_cast<int>(cudnnGetVersion());
    if (r.version < 90000) {
      r.why_not = "cuDNN runtime " + std::to_string(r.version) + " is older than 9.0";
      return r;
    }
    if (r.version == 91000 || r.version == 91001) {
      r.why_not = "cuDNN 9.10.0/9.10.1 has known-bad fp16 attention forward";
      return r;
    }
    const cudnnStatus_t graph = cudnnGraphVersionCheck();
    if (graph != CUDNN_STATUS_SUCCESS) {
      r.why_not = std::string("cuDNN graph sub-library check failed: ") + status_text(graph);
      return r;
    }
    int device = 0;
    int major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      cudaGetLastError();  // clear the error so later CUDA calls do not report it
      r.why_not = "no usable CUDA device";
      return r;
    }
    if (major < 8) {
      r.why_not = "device sm " + std::to_string(major) + "x is older than sm 80";
      return r;
    }
    r.ok = true;
    return r;
  }();
  return status;
}

int current_device() {
  int device = 0;
  HK_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

// ---- the cached plan of one shape --------------------------------------------------------------

struct CudnnAttention::Plan {
  std::vector<std::unique_ptr<Desc>> graph;  // tensors, ops, operation graph (kept alive)
  std::unique_ptr<Desc> engine_config;
  std::unique_ptr<Desc> plan;
  int64_t workspace = 0;
  int64_t engine_index = -1;
  bool causal = false;

  // By-value scalars: the variant pack points at these, so their addresses must stay fixed.
  float scale = 0.f;
  float neg_inf = kMaskedScore;

  // The variant pack of the last run, reused while the pointers and the scale are unchanged.
  std::unique_ptr<Desc> variant_pack;
  std::array<const void*, 4> bound{};  // qkv, out, lengths, workspace
  float bound_scale = std::numeric_limits<float>::quiet_NaN();
};

bool CudnnAttention::Key::operator<(const Key& o) const {
  return std::tie(B, S, H, head_dim, causal, qkv_row_stride, out_row_stride) <
         std::tie(o.B, o.S, o.H, o.head_dim, o.causal, o.qkv_row_stride, o.out_row_stride);
}

CudnnAttention::CudnnAttention() = default;

CudnnAttention::~CudnnAttention() {
  plans_.clear();  // plans reference the handle: destroy them first
  if (handle_ != nullptr) cudnnDestroy(handle_);
}

bool CudnnAttention::runtime_ok(std::string* why_not) {
  const RuntimeStatus& s = runtime_status();
  if (!s.ok && why_not != nullptr) *why_not = s.why_not;
  return s.ok;
}

int CudnnAttention::runtime_version() { return static_cast<int>(cudnnGetVersion()); }

CudnnAttention::Key CudnnAttention::key_of(const AttentionParams& p) {
  return Key{p.B, p.S, p.H, p.head_dim, p.causal, p.qkv_row_stride, p.out_row_stride};
}

bool CudnnAttention::supports(const AttentionParams& p) const {
  if (!runtime_ok()) return false;
  if (p.dtype != DType::f16 || p.seq_start != nullptr || p.lengths == nullptr) return false;
  if (p.qkv == nullptr || p.out == nullptr) return false;
  if (p.B < 1 || p.S < 1 || p.H < 1 || p.head_dim < 8 || p.head_dim % 8 != 0) return false;
  if (sm_major_ < 0) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, current_device()) !=
        cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    sm_major_ = major;
  }
  // Hopper's fused kernels reach head_dim 256; Ampere-class ones stop at 128.
  const int max_head_dim = sm_major_ >= 9 ? 256 : 128;
  if (p.head_dim > max_head_dim) return false;
  const int64_t D = static_cast<int64_t>(p.H) * p.head_dim;
  if (p.qkv_row_stride < 3 * D || p.out_row_stride < D) return false;
  // 16-byte alignment of every row start (K and V start at D and 2D: D*2 bytes is a multiple
  // of 16 because head_dim is a multiple of 8).
  if (!aligned16(p.qkv) || !aligned16(p.out) || !aligned16(p.lengths)) return false;
  if ((p.qkv_row_stride * 2) % 16 != 0 || (p.out_row_stride * 2) % 16 != 0) return false;
  return true;
}

void CudnnAttention::ensure_handle() const {
  const int device = current_device();
  if (handle_ == nullptr) {
    std::string why;
    if (!runtime_ok(&why)) throw CudaError(std::string(kRoute) + ": cuDNN unusable: " + why);
    check(cudnnCreate(&handle_), "cudnnCreate");
    device_ = device;
  } else if (device != device_) {
    throw CudaError(std::string(kRoute) + ": plans were built for device " +
                    std::to_string(device_) + ", current device is " + std::to_string(device));
  }
}

CudnnAttention::Plan& CudnnAttention::plan_for(const AttentionParams& p) const {
  const Key key = key_of(p);
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  if (!supports(p)) {
    throw std::invalid_argument(std::string(kRoute) + ": unsupported parameters (B=" +
                                std::to_string(p.B) + " S=" + std::to_string(p.S) + " H=" +
                                std::to_string(p.H) + " hd=" + std::to_string(p.head_dim) + ")");
  }
  ensure_handle();

  const int64_t B = p.B, H = p.H, S = p.S, hd = p.head_dim;
  const int64_t rs = p.qkv_row_stride, os = p.out_row_stride;
  const std::string shape = "[B=" + std::to_string(B) + " S=" + std::to_string(S) +
                            " H=" + std::to_string(H) + " hd=" + std::to_string(hd) +
                            (p.causal ? " causal]" : "]");

  GraphBuilder g;
  // I/O: strided views of the fused qkv rows (token t = b*S + s, head h at column h*hd).
  Desc& q = g.tensor("Q", kUidQ, CUDNN_DATA_HALF, {B, H, S, hd}, {S * rs, hd, rs, 1}, false);
  // K is described transposed, [B, H, hd, S]: the backend multiplies Q by K^T as given.
  Desc& kt = g.tensor("K^T", kUidK, CUDNN_DATA_HALF, {B, H, hd, S}, {S * rs, hd, 1, rs}, false);
  Desc& v = g.tensor("V", kUidV, CUDNN_DATA_HALF, {B, H, S, hd}, {S * rs, hd, rs, 1}, false);
  Desc& o = g.tensor("O", kUidO, CUDNN_DATA_HALF, {B, H, S, hd}, {S * os, hd, os, 1}, false);
  // The per-sequence lengths bound both sides: two tensors (as the fused pattern has them),
  // one buffer.
  Desc& seq_q =
      g.tensor("seq_len_q", kUidSeqLenQ, CUDNN_DATA_INT32, {B, 1, 1, 1}, {1, 1, 1, 1}, false);
  Desc& seq_kv =
      g.tensor("seq_len_kv", kUidSeqLenKV, CUDNN_DATA_INT32, {B, 1, 1, 1}, {1, 1, 1, 1}, false);
  Desc& scale = g.scalar("attn_scale", kUidScale);
  Desc& neg_inf_padding = g.scalar("neg_inf_padding", kUidNegInfPadding);

  const Dims scores{B, H, S, S};
  const Dims per_row{B, H, S, 1};

  Desc& s = g.virt("S", CUDNN_DATA_FLOAT, scores);
  g.matmul("bmm1 Q*K^T", q, kt, s, &seq_q, &seq_kv, nullptr);
  Desc& s_scaled = g.virt("S*scale", CUDNN_DATA_FLOAT, scores);
  g.pointwise("attn_scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, &scale, nullptr, s_scaled);

  // Padding mask: keep (row < seq_len_q) && (col < seq_len_kv).
  Desc& pad_row = g.virt("pad_row_idx", CUDNN_DATA_INT32, scores);
  g.pointwise("gen_row_idx_padding", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s_scaled,
              nullptr, nullptr, pad_row, 2);
  Desc& pad_col = g.virt("pad_col_idx", CUDNN_DATA_INT32, scores);
  g.pointwise("gen_col_idx_padding", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s_scaled,
              nullptr, nullptr, pad_col, 3);
  Desc& row_ok = g.virt("row<seq_len_q", CUDNN_DATA_BOOLEAN, scores);
  g.pointwise("lt_row_sq_padding", CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, pad_row, &seq_q,
              nullptr, row_ok);
  Desc& col_ok = g.virt("col<seq_len_kv", CUDNN_DATA_BOOLEAN, scores);
  g.pointwise("lt_col_skv_padding", CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, pad_col, &seq_kv,
              nullptr, col_ok);
  Desc& keep_pad = g.virt("padding_keep", CUDNN_DATA_BOOLEAN, scores);
  g.pointwise("and_row_col_padding", CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, row_ok,
              &col_ok, nullptr, keep_pad);
  Desc& s_padded = g.virt("S_padded", CUDNN_DATA_FLOAT, scores);
  g.pointwise("select_padding", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s_scaled,
              &neg_inf_padding, &keep_pad, s_padded);
  const Desc* last = &s_padded;

  if (p.causal) {
    // Causal mask: keep row >= col. Its own index pair, as the fused engine's pattern expects
    // (FLOAT math, INT32 indices: the form cudnn-frontend emits for pre-9.21 runtimes).
    Desc& neg_inf_causal = g.scalar("neg_inf_causal", kUidNegInfCausal);
    Desc& c_row = g.virt("causal_row_idx", CUDNN_DATA_INT32, scores);
    g.pointwise("gen_row_idx_causal", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, *last, nullptr,
                nullptr, c_row, 2);
    Desc& c_col = g.virt("causal_col_idx", CUDNN_DATA_INT32, scores);
    g.pointwise("gen_col_idx_causal", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, *last, nullptr,
                nullptr, c_col, 3);
    Desc& keep_causal = g.virt("row>=col", CUDNN_DATA_BOOLEAN, scores);
    g.pointwise("row_greater_than_col", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, c_row, &c_col,
                nullptr, keep_causal);
    Desc& s_causal = g.virt("S_causal", CUDNN_DATA_FLOAT, scores);
    g.pointwise("select_causal", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, *last,
                &neg_inf_causal, &keep_causal, s_causal);
    last = &s_causal;
  }

  // Softmax over the key axis.
  Desc& row_max = g.virt("row_max", CUDNN_DATA_FLOAT, per_row);
  g.reduction("softmax max", CUDNN_REDUCE_TENSOR_MAX, *last, row_max);
  Desc& centered = g.virt("S-max", CUDNN_DATA_FLOAT, scores);
  g.pointwise("softmax sub", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, *last, &row_max, nullptr,
              centered);
  Desc& e = g.virt("exp(S-max)", CUDNN_DATA_FLOAT, scores);
  g.pointwise("softmax exp", CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, centered, nullptr, nullptr, e);
  Desc& row_sum = g.virt("row_sum", CUDNN_DATA_FLOAT, per_row);
  g.reduction("softmax sum", CUDNN_REDUCE_TENSOR_ADD, e, row_sum);
  // The statistics branch (max + log(sum)) of the fused engine's pattern; virtual, unused.
  Desc& log_sum = g.virt("log(row_sum)", CUDNN_DATA_FLOAT, per_row);
  g.pointwise("softmax log", CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, row_sum, nullptr, nullptr,
              log_sum);
  Desc& stats = g.virt("stats", CUDNN_DATA_FLOAT, per_row);
  g.pointwise("softmax stats", CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, row_max, &log_sum, nullptr,
              stats);
  // P must be in the I/O type for the second matmul.
  Desc& prob = g.virt("P", CUDNN_DATA_HALF, scores);
  g.pointwise("softmax div", CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, &row_sum, nullptr, prob);

  g.matmul("bmm2 P*V", prob, v, o, &seq_q, nullptr, &seq_kv);

  Desc& op_graph = g.operation_graph(handle_);

  // Engine choice: heuristics mode A, first config that finalises into a plan; fallback mode
  // only when mode A offers none that works.
  auto plan = std::make_unique<Plan>();
  std::string rejected;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "A" : "FALLBACK";
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, std::string("engine heuristics ") + mode_name);
    HK_SET_DESC(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, op_graph);
    HK_SET(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    heur.finalize();

    int64_t count = 0;
    check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
          heur.name() + ": GetAttribute CUDNN_ATTR_ENGINEHEUR_RESULTS (count)");
    if (count <= 0) {
      rejected += std::string(" [mode ") + mode_name + ": no engine config]";
      continue;
    }
    std::vector<std::unique_ptr<Desc>> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.push_back(std::make_unique<Desc>(
          CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
          std::string("engine config ") + mode_name + "#" + std::to_string(i)));
      raw.push_back(configs.back()->get());
    }
    int64_t returned = 0;
    check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, raw.data()),
          heur.name() + ": GetAttribute CUDNN_ATTR_ENGINEHEUR_RESULTS");

    for (int64_t i = 0; i < returned && plan->plan == nullptr; ++i) {
      auto candidate = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                                              "execution plan (" + configs[i]->name() + ")");
      HK_SET(*candidate, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
      HK_SET_DESC(*candidate, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *configs[i]);
      const cudnnStatus_t st = candidate->try_finalize();
      if (st != CUDNN_STATUS_SUCCESS) {
        rejected += " [" + configs[i]->name() + ": " + status_text(st) + "]";
        continue;
      }
      plan->plan = std::move(candidate);
      plan->engine_config = std::move(configs[i]);
    }
    if (plan->plan != nullptr) break;
  }
  if (plan->plan == nullptr) {
    throw CudaError(std::string(kRoute) + ": no cuDNN engine executes the attention graph " +
                    shape + " (" + std::to_string(g.op_count()) + " ops, " +
                    std::to_string(g.descriptor_count()) + " descriptors):" + rejected);
  }

  int64_t n = 0;
  check(cudnnBackendGetAttribute(plan->plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                 CUDNN_TYPE_INT64, 1, &n, &plan->workspace),
        plan->plan->name() + ": GetAttribute CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE");

  // The engine's global index, for logs only: failures here are not errors.
  {
    cudnnBackendDescriptor_t engine = nullptr;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) ==
        CUDNN_STATUS_SUCCESS) {
      int64_t got = 0;
      if (cudnnBackendGetAttribute(plan->engine_config->get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got,
                                   &engine) == CUDNN_STATUS_SUCCESS) {
        cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got,
                                 &plan->engine_index);
      }
      cudnnBackendDestroyDescriptor(engine);
    }
  }

  plan->graph = g.release();
  plan->causal = p.causal;
  Plan& ref = *plan;
  plans_.emplace(key, std::move(plan));
  return ref;
}

void CudnnAttention::prepare(const AttentionParams& p, cudaStream_t stream) {
  plan_for(p);
  check(cudnnSetStream(handle_, stream), "cudnnSetStream");
}

size_t CudnnAttention::workspace_bytes(const AttentionParams& p) const {
  return static_cast<size_t>(plan_for(p).workspace);
}

std::string CudnnAttention::plan_info(const AttentionParams& p) const {
  auto it = plans_.find(key_of(p));
  if (it == plans_.end()) return {};
  return "engine " + std::to_string(it->second->engine_index) + ", workspace " +
         std::to_string(it->second->workspace) + " B";
}

void CudnnAttention::run(const AttentionParams& p, void* workspace, cudaStream_t stream) {
  auto it = plans_.find(key_of(p));
  if (it == plans_.end()) {
    throw std::logic_error(std::string(kRoute) + ": run() before prepare() for this shape");
  }
  Plan& plan = *it->second;
  if (plan.workspace > 0 && workspace == nullptr) {
    throw std::invalid_argument(std::string(kRoute) + ": the plan needs " +
                                std::to_string(plan.workspace) + " B of workspace, got none");
  }
  if (p.qkv == nullptr || p.out == nullptr || p.lengths == nullptr) {
    throw std::invalid_argument(std::string(kRoute) + ": null qkv/out/lengths");
  }

  // Rebuild the variant pack only when a bound pointer or the scale changed (host work only).
  const std::array<const void*, 4> bound{p.qkv, p.out, p.lengths, workspace};
  if (plan.variant_pack == nullptr || bound != plan.bound || p.scale != plan.bound_scale) {
    plan.scale = p.scale;
    const int64_t D = static_cast<int64_t>(p.H) * p.head_dim;
    auto* qkv = static_cast<__half*>(const_cast<void*>(p.qkv));  // cuDNN only reads inputs
    void* lengths = const_cast<int32_t*>(p.lengths);
    std::vector<int64_t> uids{kUidQ, kUidK, kUidV, kUidO, kUidSeqLenQ, kUidSeqLenKV,
                              kUidScale, kUidNegInfPadding};
    std::vector<void*> ptrs{qkv, qkv + D, qkv + 2 * D, p.out, lengths, lengths,
                            &plan.scale, &plan.neg_inf};
    if (plan.causal) {
      uids.push_back(kUidNegInfCausal);
      ptrs.push_back(&plan.neg_inf);
    }
    auto vp = std::make_unique<Desc>(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
    HK_SET(*vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
           static_cast<int64_t>(uids.size()), uids.data());
    HK_SET(*vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<int64_t>(ptrs.size()), ptrs.data());
    HK_SET(*vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    vp->finalize();
    plan.variant_pack = std::move(vp);
    plan.bound = bound;
    plan.bound_scale = p.scale;
  }

  check(cudnnSetStream(handle_, stream), "cudnnSetStream");
  check(cudnnBackendExecute(handle_, plan.plan->get(), plan.variant_pack->get()),
        "cudnnBackendExecute (" + plan.plan->name() + ")");
  detail::zero_padded_rows_f16(p.out, p.lengths, p.B, p.S, p.H * p.head_dim, p.out_row_stride,
                               stream);
}

}  // namespace hk::cuda
