// The CUDA engine (see engine.hpp): the kernel table of hk/plan.hpp over cuBLASLt GEMMs, the row
// kernels and the attention routes, per-B plans, graph capture and the host/device entry points.
#include "engine.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "arena.hpp"
#include "attention_route.hpp"
#include "common.cuh"
#include "gelu.cuh"
#include "gemm_cublaslt.cuh"
#include "graph.hpp"
#include "hk/error.hpp"
#include "hk/plan.hpp"
#include "rownorm.cuh"
#include "weights.hpp"

namespace hk::cuda {
namespace {

// Graphs kept per engine: the host path's two outputs, the owned device path's two, and the
// rotating input sets of a benchmark (up to 8 sets x 2 outputs), across a few batch sizes.
// An eviction waits for the device, so the cache must hold a steady workload's whole set.
constexpr size_t kGraphCacheEntries = 32;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool env_choice(const char* name, const char* off, const char* on, bool default_on) {
  const std::string v = env(name);
  if (v.empty()) return default_on;
  if (v == on) return true;
  if (v == off) return false;
  throw Error(std::string(name) + " must be '" + off + "' or '" + on + "', got '" + v + "'");
}

// Every failure leaves the engine as hk::Error, naming what was being done.
template <class F>
auto translate(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw Error(std::string("cuda backend: ") + what + ": out of host memory");
  } catch (const std::exception& e) {
    throw Error(std::string("cuda backend: ") + what + ": " + e.what());
  }
}

// What one kernel invocation of the plan reads and writes beyond the engine's arena.
struct Ctx {
  cudaStream_t stream;
  const float* x;          // the forward's input: read by layer 0's ln1 and out_proj, never written
  const int32_t* lengths;  // [B], device
  float* y;                // [B*S, D] output
};

}  // namespace

Routes routes_from_environment() {
  Routes r;
  r.gelu_epilogue = env_choice("HK_GELU", "erf", "epilogue", false);
  r.prefer_cudnn = env_choice("HK_ATTENTION", "flash", "cudnn", false);
  r.graphs = env_choice("HK_GRAPH", "0", "1", true);
  r.poison = env_choice("HK_CUDA_POISON", "0", "1", false);
  return r;
}

// Everything that depends on B: GEMM descriptors and algorithms, the attention route, the plan.
struct Plan {
  int B = 0;
  int64_t T = 0;  // token rows
  Shape shape;
  AttentionParams attn;  // lengths bound per call
  std::unique_ptr<LtGemm> qkv, out, ffn_in, ffn_in_tanh, ffn_out;
  std::vector<int> qkv_bind, out_bind, ffn_in_bind, ffn_in_tanh_bind, ffn_out_bind;  // per layer
  std::string gelu_note;  // why the tanh epilogue was requested but is not used
  std::unique_ptr<CudnnRoute> cudnn;
  DeviceBuffer cudnn_workspace;
  std::string attention_note;  // why cuDNN was requested but is not used
  std::vector<Kernel<Ctx>> table;
  std::vector<PlannedKernel<Ctx>> kernels;
  bool warmed = false;
  std::string graph_note;  // non-empty: capture failed, this B runs eagerly
};

struct CudaEngine::Impl {
  ModelConfig cfg;
  Precision precision = Precision::fast;
  int max_batch = 0, S = 0, device = 0;
  Routes routes;
  std::string device_desc;
  DType act = DType::f16;
  float eps = 1e-5f;

  cudaStream_t stream = nullptr;          // host path, eager default
  cudaStream_t capture_stream = nullptr;  // warm-ups and captures
  cudaEvent_t done = nullptr;             // recorded after every forward (and warm-up)
  cudaEvent_t caller = nullptr;           // orders a warm-up after the caller's stream
  cublasLtHandle_t lt = nullptr;

  std::unique_ptr<DeviceWeights> weights;
  std::unique_ptr<DeviceArena> arena;
  Activations buf{};
  std::vector<Step> steps;
  std::map<int, std::unique_ptr<Plan>> plans;
  GraphCache graphs{kGraphCacheEntries};
  int next_out = 0;
  PinnedBuffer x_stage, y_stage, len_stage;

  Impl(const Model& model, const EngineOptions& o, const Routes& r);
  ~Impl() { release(); }
  void release() noexcept;

  Plan& plan(int B);
  std::unique_ptr<Plan> build_plan(int B);
  void build_table(Plan& p);
  void record(Plan& p, Ctx c) { run_plan(p.kernels, steps, c); }
  cudaGraphExec_t graph_for(Plan& p, const GraphKey& key, cudaStream_t caller_stream);
  void run(int B, const float* x, const int32_t* lengths, float* y, cudaStream_t s);
  void check_batch(int B, const char* what) const;
  float* next_output() {
    float* y = buf.y[next_out];
    next_out ^= 1;
    return y;
  }
};

CudaEngine::Impl::Impl(const Model& model, const EngineOptions& o, const Routes& r)
    : cfg(model.config), precision(o.precision), max_batch(o.max_batch), S(o.seq_len), device(o.device), routes(r) {
  cfg.validate("model");
  if (precision == Precision::reference)
    throw Error("cuda backend: precision 'reference' (float64) is not supported; use the kokkos backend");
  if (max_batch < 1 || S < 1) throw Error("cuda backend: max_batch and seq_len must be at least 1");
  if (int64_t(model.layers.size()) != cfg.n_layers) throw Error("cuda backend: model has the wrong number of layers");
  int count = 0;
  HK_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count)
    throw Error("cuda backend: device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                " CUDA device(s))");
  HK_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  HK_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  if (prop.major < 8)
    throw Error("cuda backend: device " + std::to_string(device) + " (" + prop.name + ") is sm_" +
                std::to_string(prop.major) + std::to_string(prop.minor) + "; sm_80 or newer is needed");
  std::ostringstream d;
  d << prop.name << " (sm_" << prop.major << prop.minor << ", " << prop.multiProcessorCount << " SMs, "
    << (prop.totalGlobalMem >> 30) << " GiB)";
  device_desc = d.str();
  act = precision == Precision::fast ? DType::f16 : DType::f32;
  eps = float(cfg.eps);
  try {
    HK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    HK_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream, cudaStreamNonBlocking));
    HK_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    HK_CUDA_CHECK(cudaEventCreateWithFlags(&caller, cudaEventDisableTiming));
    HK_CUBLAS_CHECK(cublasLtCreate(&lt));
    weights = std::make_unique<DeviceWeights>(model, precision);
    arena = std::make_unique<DeviceArena>(activation_layout(cfg, max_batch, S, precision, kLtWorkspaceBytes),
                                          max_batch, S, routes.poison);
    buf = arena->buffers();
    steps = forward_steps(cfg.n_layers);
  } catch (...) {
    release();
    throw;
  }
}

void CudaEngine::Impl::release() noexcept {
  cudaSetDevice(device);
  if (done) cudaEventSynchronize(done);  // the last forward, whatever stream it ran on
  if (stream) cudaStreamSynchronize(stream);
  if (capture_stream) cudaStreamSynchronize(capture_stream);
  graphs.clear();
  plans.clear();  // LtGemm descriptors and cuDNN plans, before their handles
  if (lt) cublasLtDestroy(lt);
  lt = nullptr;
  if (done) cudaEventDestroy(done);
  if (caller) cudaEventDestroy(caller);
  if (stream) cudaStreamDestroy(stream);
  if (capture_stream) cudaStreamDestroy(capture_stream);
  done = caller = nullptr;
  stream = capture_stream = nullptr;
}

void CudaEngine::Impl::check_batch(int B, const char* what) const {
  if (B < 0 || B > max_batch)
    throw Error(std::string("cuda backend: ") + what + ": B = " + std::to_string(B) + " is outside 0..max_batch (" +
                std::to_string(max_batch) + ")");
}

Plan& CudaEngine::Impl::plan(int B) {
  auto it = plans.find(B);
  if (it == plans.end()) it = plans.emplace(B, build_plan(B)).first;
  return *it->second;
}

std::unique_ptr<Plan> CudaEngine::Impl::build_plan(int B) {
  auto p = std::make_unique<Plan>();
  const int D = cfg.d_model, F = cfg.ffn_dim, L = cfg.n_layers;
  p->B = B;
  p->T = int64_t(B) * S;
  p->shape = Shape{B, S, cfg, precision};
  const DType g = act;

  auto gemm = [&](const char* step, GemmShape s, const void* bias, bool required) {
    auto m = std::make_unique<LtGemm>(lt, s, bias);
    if (!m->available() && required)
      throw Error(std::string("cuda backend: cuBLASLt offers no algorithm for ") + step + " (rows " +
                  std::to_string(s.rows) + ", n " + std::to_string(s.n) + ", k " + std::to_string(s.k) + ", " +
                  to_string(s.epilogue) + ")");
    return m;
  };
  const DeviceLayerWeights& w0 = weights->layer(0);
  p->qkv = gemm("qkv_proj", {p->T, 3 * D, D, g, g, GemmEpilogue::bias}, w0.b_qkv, true);
  p->out = gemm("out_proj", {p->T, D, D, g, DType::f32, GemmEpilogue::bias_residual}, w0.b_o, true);
  p->ffn_in = gemm("ffn_in", {p->T, F, D, g, g, GemmEpilogue::bias}, w0.b_in, true);
  p->ffn_out = gemm("ffn_out", {p->T, D, F, g, DType::f32, GemmEpilogue::bias_residual}, w0.b_out, true);
  if (routes.gelu_epilogue) {
    if (precision != Precision::fast) {
      p->gelu_note = "the tanh epilogue is not exact enough for fp32";
    } else {
      p->ffn_in_tanh = gemm("ffn_in", {p->T, F, D, g, g, GemmEpilogue::bias_gelu_tanh}, w0.b_in, false);
      if (!p->ffn_in_tanh->available()) {
        p->ffn_in_tanh.reset();
        p->gelu_note = "cuBLASLt offers no GELU-epilogue algorithm for this shape";
      }
    }
  }
  for (int l = 0; l < L; ++l) {
    const DeviceLayerWeights& w = weights->layer(l);
    p->qkv_bind.push_back(p->qkv->bind_bias(w.b_qkv));
    p->out_bind.push_back(p->out->bind_bias(w.b_o));
    p->ffn_in_bind.push_back(p->ffn_in->bind_bias(w.b_in));
    p->ffn_out_bind.push_back(p->ffn_out->bind_bias(w.b_out));
    if (p->ffn_in_tanh) p->ffn_in_tanh_bind.push_back(p->ffn_in_tanh->bind_bias(w.b_in));
  }

  AttentionParams& a = p->attn;
  a.qkv = buf.qkv;
  a.out = buf.o;
  a.lengths = buf.lengths_full;
  a.seq_start = nullptr;
  a.B = B;
  a.S = S;
  a.H = cfg.n_heads;
  a.head_dim = cfg.head_dim();
  a.qkv_row_stride = 3 * int64_t(D);
  a.out_row_stride = D;
  a.scale = float(1.0 / std::sqrt(double(a.head_dim)));
  a.causal = cfg.causal;
  a.dtype = act;
  if (routes.prefer_cudnn) {
    std::string why;
    if (!CudnnRoute::runtime_ok(&why)) {
      p->attention_note = why;
    } else {
      auto c = std::make_unique<CudnnRoute>();
      if (!c->supports(a)) {
        p->attention_note = "cuDNN does not support this shape/dtype";
      } else {
        c->prepare(a, capture_stream);  // plan time: cuDNN builds its plan outside any capture
        p->cudnn_workspace = DeviceBuffer(c->workspace_bytes(a));
        p->cudnn = std::move(c);
      }
    }
  }

  build_table(*p);
  try {
    p->kernels = hk::make_plan(steps, p->table, p->shape);
  } catch (const Error& e) {
    std::string detail;
    if (!flash_route_supports(a))
      detail = flash_route_compiled() ? " (the flash route does not support head_dim " + std::to_string(a.head_dim) +
                                            " in " + (act == DType::f16 ? "f16" : "f32") + ")"
                                      : " (the flash route is not part of this build)";
    throw Error(std::string("cuda backend: cannot plan B = ") + std::to_string(B) + ": " + e.what() + detail);
  }
  return p;
}

void CudaEngine::Impl::build_table(Plan& p) {
  Impl* E = this;
  Plan* P = &p;
  const int D = cfg.d_model;
  const std::string ln = std::string("hk::layer_norm[") + row_norm_variant(D) + "]";
  const std::string final_ln = std::string("hk::layer_norm[") + row_norm_variant(D) + ".final]";
  auto& t = p.table;

  t.push_back(single_step_kernel<Ctx>(ln, StepKind::ln1, [E, P, D](Ctx& c, const Step& s) {
    const DeviceLayerWeights& w = E->weights->layer(s.layer);
    // Layer 0 normalises the caller's input directly: no copy into the residual stream.
    layer_norm(s.layer == 0 ? c.x : E->buf.x, E->buf.h, E->act, w.ln1_w, w.ln1_b, P->T, D, E->eps, c.stream);
  }));
  t.push_back(single_step_kernel<Ctx>("hk::gemm[cuda.cublaslt.bias]", StepKind::qkv_proj, [E, P](Ctx& c, const Step& s) {
    P->qkv->run(P->qkv_bind[size_t(s.layer)], E->weights->layer(s.layer).w_qkv, E->buf.h, nullptr, E->buf.qkv,
                E->buf.workspace, c.stream);
  }));
  if (p.cudnn) {
    t.push_back(single_step_kernel<Ctx>(p.cudnn->name(), StepKind::attention, [P](Ctx& c, const Step&) {
      AttentionParams a = P->attn;
      a.lengths = c.lengths;
      P->cudnn->run(a, P->cudnn_workspace.get(), c.stream);
    }));
  }
  const bool flash_ok = flash_route_supports(p.attn);
  t.push_back(single_step_kernel<Ctx>(
      flash_ok ? flash_route_name(p.attn) : std::string("hk::attention[cuda.flash]"), StepKind::attention,
      [P](Ctx& c, const Step&) {
        AttentionParams a = P->attn;
        a.lengths = c.lengths;
        flash_route_run(a, c.stream);
      },
      [flash_ok](const Shape&) { return flash_ok; }));
  t.push_back(single_step_kernel<Ctx>("hk::gemm[cuda.cublaslt.bias_residual]", StepKind::out_proj,
                                      [E, P](Ctx& c, const Step& s) {
                                        // Layer 0: x = input + o Wo^T + bo lands in the residual
                                        // buffer, so the caller's input is never modified.
                                        const float* residual = s.layer == 0 ? c.x : E->buf.x;
                                        P->out->run(P->out_bind[size_t(s.layer)], E->weights->layer(s.layer).w_o,
                                                    E->buf.o, residual, E->buf.x, E->buf.workspace, c.stream);
                                      }));
  t.push_back(single_step_kernel<Ctx>(ln, StepKind::ln2, [E, P, D](Ctx& c, const Step& s) {
    const DeviceLayerWeights& w = E->weights->layer(s.layer);
    layer_norm(E->buf.x, E->buf.h, E->act, w.ln2_w, w.ln2_b, P->T, D, E->eps, c.stream);
  }));
  if (p.ffn_in_tanh) {
    t.push_back(single_step_kernel<Ctx>("hk::gemm[cuda.cublaslt.bias_gelu_tanh]", StepKind::ffn_in,
                                        [E, P](Ctx& c, const Step& s) {
                                          P->ffn_in_tanh->run(P->ffn_in_tanh_bind[size_t(s.layer)],
                                                              E->weights->layer(s.layer).w_in, E->buf.h, nullptr,
                                                              E->buf.f, E->buf.workspace, c.stream);
                                        }));
  }
  t.push_back(single_step_kernel<Ctx>("hk::gemm[cuda.cublaslt.bias] + hk::gelu[cuda.erf]", StepKind::ffn_in,
                                      [E, P](Ctx& c, const Step& s) {
                                        P->ffn_in->run(P->ffn_in_bind[size_t(s.layer)], E->weights->layer(s.layer).w_in,
                                                       E->buf.h, nullptr, E->buf.f, E->buf.workspace, c.stream);
                                        gelu_erf_inplace(E->buf.f, E->act, P->T * E->cfg.ffn_dim, c.stream);
                                      }));
  t.push_back(single_step_kernel<Ctx>("hk::gemm[cuda.cublaslt.bias_residual]", StepKind::ffn_out,
                                      [E, P](Ctx& c, const Step& s) {
                                        P->ffn_out->run(P->ffn_out_bind[size_t(s.layer)],
                                                        E->weights->layer(s.layer).w_out, E->buf.f, E->buf.x,
                                                        E->buf.x, E->buf.workspace, c.stream);
                                      }));
  t.push_back(single_step_kernel<Ctx>(final_ln, StepKind::final_ln, [E, P, D](Ctx& c, const Step&) {
    final_layer_norm(E->buf.x, c.y, E->weights->final_w(), E->weights->final_b(), P->T, D, E->eps, c.lengths, E->S,
                     c.stream);
  }));
}

cudaGraphExec_t CudaEngine::Impl::graph_for(Plan& p, const GraphKey& key, cudaStream_t caller_stream) {
  if (cudaGraphExec_t g = graphs.find(key)) return g;
  // The warm-up runs for real (cuBLASLt and cuDNN load their kernels, nothing lazy is left for
  // the capture): after the caller's pending work (it reads x, writes y) and the last forward.
  HK_CUDA_CHECK(cudaEventRecord(caller, caller_stream));
  HK_CUDA_CHECK(cudaStreamWaitEvent(capture_stream, caller, 0));
  HK_CUDA_CHECK(cudaStreamWaitEvent(capture_stream, done, 0));
  const Ctx c{capture_stream, static_cast<const float*>(key.x), static_cast<const int32_t*>(key.lengths),
              static_cast<float*>(const_cast<void*>(key.y))};
  if (!p.warmed) {
    record(p, c);
    p.warmed = true;
  }
  HK_CUDA_CHECK(cudaEventRecord(done, capture_stream));
  try {
    return graphs.capture(key, capture_stream, done, [&](cudaStream_t s) {
      Ctx cc = c;
      cc.stream = s;
      record(p, cc);
    });
  } catch (const std::exception& e) {
    p.graph_note = std::string("capture failed, running eagerly: ") + e.what();
    return nullptr;
  }
}

void CudaEngine::Impl::run(int B, const float* x, const int32_t* lengths, float* y, cudaStream_t s) {
  HK_CUDA_CHECK(cudaSetDevice(device));
  Plan& p = plan(B);
  cudaGraphExec_t g = nullptr;
  if (routes.graphs && p.graph_note.empty()) g = graph_for(p, GraphKey{B, x, lengths, y}, s);
  HK_CUDA_CHECK(cudaStreamWaitEvent(s, done, 0));
  if (g) {
    HK_CUDA_CHECK(cudaGraphLaunch(g, s));
  } else {
    record(p, Ctx{s, x, lengths, y});
  }
  HK_CUDA_CHECK(cudaEventRecord(done, s));
}

// ---- CudaEngine -------------------------------------------------------------------------------

CudaEngine::CudaEngine(const Model& model, const EngineOptions& options)
    : CudaEngine(model, options, routes_from_environment()) {}

CudaEngine::CudaEngine(const Model& model, const EngineOptions& options, const Routes& routes) {
  translate("creating the engine", [&] { impl_ = std::make_unique<Impl>(model, options, routes); });
}

CudaEngine::~CudaEngine() = default;

std::string CudaEngine::backend() const { return "cuda"; }
std::string CudaEngine::device() const { return impl_->device_desc; }
Precision CudaEngine::precision() const { return impl_->precision; }
int CudaEngine::max_batch() const { return impl_->max_batch; }
int CudaEngine::seq_len() const { return impl_->S; }
const ModelConfig& CudaEngine::config() const { return impl_->cfg; }
const Routes& CudaEngine::routes() const { return impl_->routes; }
cudaStream_t CudaEngine::stream() const { return impl_->stream; }

void CudaEngine::forward(const float* x, const int32_t* lengths, int B, float* y) {
  Impl& m = *impl_;
  translate("forward", [&] {
    m.check_batch(B, "forward");
    if (B == 0) return;
    if (!x || !y) throw Error("cuda backend: forward: x and y must not be null");
    const int S = m.S;
    if (lengths)
      for (int b = 0; b < B; ++b)
        if (lengths[b] < 0 || lengths[b] > S)
          throw Error("cuda backend: forward: lengths[" + std::to_string(b) + "] = " + std::to_string(lengths[b]) +
                      " is outside 0..S (S = " + std::to_string(S) + ")");
    HK_CUDA_CHECK(cudaSetDevice(m.device));
    const size_t full = size_t(m.max_batch) * size_t(S) * size_t(m.cfg.d_model) * sizeof(float);
    if (!m.x_stage.get()) {  // first host call: pinned staging sized for max_batch, kept
      m.x_stage = PinnedBuffer(full);
      m.y_stage = PinnedBuffer(full);
      m.len_stage = PinnedBuffer(size_t(m.max_batch) * sizeof(int32_t));
    }
    const size_t bytes = size_t(B) * size_t(S) * size_t(m.cfg.d_model) * sizeof(float);
    std::memcpy(m.x_stage.get(), x, bytes);
    auto* len = static_cast<int32_t*>(m.len_stage.get());
    for (int b = 0; b < B; ++b) len[b] = lengths ? lengths[b] : S;
    // The upload overwrites x_in / lengths_in: wait for whatever forward may still read them.
    HK_CUDA_CHECK(cudaStreamWaitEvent(m.stream, m.done, 0));
    HK_CUDA_CHECK(cudaMemcpyAsync(m.buf.x_in, m.x_stage.get(), bytes, cudaMemcpyHostToDevice, m.stream));
    HK_CUDA_CHECK(cudaMemcpyAsync(m.buf.lengths_in, len, size_t(B) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  m.stream));
    float* out = m.next_output();
    m.run(B, m.buf.x_in, m.buf.lengths_in, out, m.stream);
    HK_CUDA_CHECK(cudaMemcpyAsync(m.y_stage.get(), out, bytes, cudaMemcpyDeviceToHost, m.stream));
    HK_CUDA_CHECK(cudaStreamSynchronize(m.stream));
    std::memcpy(y, m.y_stage.get(), bytes);
  });
}

namespace {
void check_device_pointers(const float* x, const int32_t* lengths, const float* y) {
  auto misaligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a != 0; };
  if (!x || !y) throw Error("cuda backend: forward_device: x and y must not be null");
  if (misaligned(x, 16) || misaligned(y, 16))
    throw Error("cuda backend: forward_device: x and y must be 16-byte aligned device pointers");
  if (lengths && misaligned(lengths, 4)) throw Error("cuda backend: forward_device: lengths must be 4-byte aligned");
}
}  // namespace

void CudaEngine::forward_device(const float* x, const int32_t* lengths, int B, float* y, cudaStream_t stream) {
  Impl& m = *impl_;
  translate("forward_device", [&] {
    m.check_batch(B, "forward_device");
    if (B == 0) return;
    check_device_pointers(x, lengths, y);
    m.run(B, x, lengths ? lengths : m.buf.lengths_full, y, stream);
  });
}

const float* CudaEngine::forward_device(const float* x, const int32_t* lengths, int B, cudaStream_t stream) {
  Impl& m = *impl_;
  return translate("forward_device", [&]() -> const float* {
    m.check_batch(B, "forward_device");
    if (B == 0) return nullptr;
    check_device_pointers(x, lengths, m.buf.y[0]);
    float* y = m.next_output();
    m.run(B, x, lengths ? lengths : m.buf.lengths_full, y, stream);
    return y;
  });
}

void CudaEngine::prepare(int B, const float* x, const int32_t* lengths, float* y) {
  Impl& m = *impl_;
  translate("prepare", [&] {
    m.check_batch(B, "prepare");
    if (B == 0) return;
    HK_CUDA_CHECK(cudaSetDevice(m.device));
    Plan& p = m.plan(B);
    if (!m.routes.graphs) return;
    std::vector<GraphKey> keys;
    if (!x) {
      // The host path's lengths buffer holds whatever the last host call left (or nothing yet):
      // give the warm-up valid lengths.
      HK_CUDA_CHECK(cudaStreamWaitEvent(m.stream, m.done, 0));
      HK_CUDA_CHECK(cudaMemcpyAsync(m.buf.lengths_in, m.buf.lengths_full, size_t(m.max_batch) * sizeof(int32_t),
                                    cudaMemcpyDeviceToDevice, m.stream));
      HK_CUDA_CHECK(cudaEventRecord(m.done, m.stream));
      for (float* out : m.buf.y) keys.push_back({B, m.buf.x_in, m.buf.lengths_in, out});
    } else {
      const int32_t* len = lengths ? lengths : m.buf.lengths_full;
      if (y) {
        keys.push_back({B, x, len, y});
      } else {
        for (float* out : m.buf.y) keys.push_back({B, x, len, out});
      }
    }
    for (const GraphKey& k : keys) {
      if (!p.graph_note.empty()) break;
      m.graph_for(p, k, m.stream);
    }
    HK_CUDA_CHECK(cudaStreamSynchronize(m.capture_stream));
  });
}

std::string CudaEngine::explain(int B) const {
  Impl& m = *impl_;
  return translate("explain", [&] {
    if (B < 1 || B > m.max_batch)
      throw Error("cuda backend: explain: B = " + std::to_string(B) + " is outside 1..max_batch (" +
                  std::to_string(m.max_batch) + ")");
    HK_CUDA_CHECK(cudaSetDevice(m.device));
    Plan& p = m.plan(B);
    std::ostringstream o;
    o << "cuda backend on " << m.device_desc << ", precision " << to_string(m.precision) << ", B = " << B
      << ", S = " << m.S << " (" << p.T << " token rows)\n";
    o << "gelu: "
      << (p.ffn_in_tanh ? "cuBLASLt tanh epilogue (HK_GELU=epilogue)"
                        : "exact erf pass" + (p.gelu_note.empty() ? std::string() : " (" + p.gelu_note + ")"))
      << "\n";
    o << "attention: " << (p.cudnn ? "cudnn (HK_ATTENTION=cudnn; " + p.cudnn->plan_info(p.attn) + ")" : "flash")
      << (p.attention_note.empty() ? "" : " (cudnn not used: " + p.attention_note + ")") << "\n";
    o << "graphs: "
      << (!m.routes.graphs ? "off (HK_GRAPH=0)" : p.graph_note.empty() ? "on" : "off for this B: " + p.graph_note)
      << "\n";
    o << describe_plan(p.kernels, m.steps);
    auto gemm_line = [&o](const char* step, const LtGemm* g) {
      if (!g) return;
      const GemmShape& s = g->shape();
      o << "gemm " << step << " [" << to_string(s.epilogue) << "] rows " << s.rows << " n " << s.n << " k " << s.k
        << ": " << g->candidates().size() << " candidates, using #" << g->selected() << " (" << g->describe() << ")\n";
    };
    gemm_line("qkv_proj", p.qkv.get());
    gemm_line("out_proj", p.out.get());
    gemm_line("ffn_in", p.ffn_in_tanh ? p.ffn_in_tanh.get() : p.ffn_in.get());
    gemm_line("ffn_out", p.ffn_out.get());
    return o.str();
  });
}

}  // namespace hk::cuda
