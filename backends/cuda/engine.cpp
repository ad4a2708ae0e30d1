// The CUDA engine (see engine.hpp): the kernel table of hk/plan.hpp over cuBLASLt GEMMs, the row
// kernels, the attention routes and the fused chains; per-B plans chosen by the tune mechanism
// (src/hk/tune: every covering kernel of a position is a candidate, the table's first is the
// default), graph capture and the host/device entry points.
#include "engine.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "cublaslt_api.hpp"
#include "arena.hpp"
#include "attention_route.hpp"
#include "common.cuh"
#include "gelu.cuh"
#include "gemm_cublaslt.cuh"
#include "gemm_small.cuh"
#include "graph.hpp"
#include "hk/error.hpp"
#include "hk/plan.hpp"
#include "hk/synthetic.hpp"
#include "hk/tune/chooser.hpp"
#include "hk/tune/fingerprint.hpp"
#include "hk/tune/knobs.hpp"
#include "hk/tune/plan_choice.hpp"
#include "attention_materialized.cuh"
#include "packing.hpp"
#include "rownorm.cuh"
#include "tune_cuda.hpp"
#include "weights.hpp"

// The fused chains join the table when their sources are part of the build
// (backends/cuda/CMakeLists.txt defines these next to the files).
#ifndef HK_CUDA_HAVE_POST_ATTN_FUSED
#define HK_CUDA_HAVE_POST_ATTN_FUSED 0
#endif
#ifndef HK_CUDA_HAVE_QKV_ATTENTION_FUSED
#define HK_CUDA_HAVE_QKV_ATTENTION_FUSED 0
#endif
#if HK_CUDA_HAVE_POST_ATTN_FUSED
#include "post_attn_fused.cuh"
#endif
#if HK_CUDA_HAVE_QKV_ATTENTION_FUSED
#include "qkv_attention_fused.cuh"
#endif
#ifndef HK_CUDA_HAVE_MODEL_PERSISTENT
#define HK_CUDA_HAVE_MODEL_PERSISTENT 0
#endif
#if HK_CUDA_HAVE_MODEL_PERSISTENT
#include "model_persistent.cuh"
#endif

namespace hk::cuda {
namespace {

// Graphs kept per engine: the host path's two outputs, the owned device path's two, and the
// rotating input sets of a benchmark (up to 8 sets x 2 outputs), across a few batch sizes.
// An eviction waits for the device, so the cache must hold a steady workload's whole set.
constexpr size_t kGraphCacheEntries = 32;

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

// Host memory registered with or allocated by CUDA (copies from it can be asynchronous).
bool is_page_locked(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

// What one kernel invocation of the plan reads and writes beyond the engine's arena.
struct Ctx {
  cudaStream_t stream;
  const float* x;          // the forward's input: read by layer 0's ln1 and out_proj, never written
  const int32_t* lengths;  // [B], device
  float* y;                // [B*S, D] output
};

// The arena buffers a step reads and writes (plan.hpp's names), for the tuner: which state a
// measured segment must restore before each candidate runs, and which outputs it must compare.
enum BufBit : unsigned { kX = 1, kH = 2, kQKV = 4, kO = 8, kF = 16, kY = 32 };
constexpr unsigned kAllBufs[] = {kX, kH, kQKV, kO, kF, kY};

struct Access {
  unsigned reads, writes;
};
// Padding-free plans: layer 0's ln1 packs the caller's x into the residual buffer (and zeroes
// the tail rows of o and the padded rows of y), so layer 0's out_proj reads the residual buffer.
Access step_access(const Step& s, bool packed) {
  // Dense layer 0 reads the caller's x.
  const unsigned x_if_inner = s.layer == 0 && !packed ? 0u : unsigned(kX);
  switch (s.kind) {
    case StepKind::ln1:
      if (packed && s.layer == 0) return {0u, kH | kX | kO | kY};
      return {x_if_inner, kH};
    case StepKind::qkv_proj: return {kH, kQKV};
    case StepKind::attention: return {kQKV, kO};
    case StepKind::out_proj: return {kO | x_if_inner, kX};
    case StepKind::ln2: return {kX, kH};
    case StepKind::ffn_in: return {kH, kF};
    case StepKind::ffn_out: return {kF | kX, kX};
    case StepKind::final_ln: return {kX, kY};
  }
  return {0, 0};
}
// Buffers the segment writes whose incoming value it also reads (restored before each candidate).
unsigned restore_set(const std::vector<Step>& steps, size_t first, int count, bool packed) {
  unsigned written = 0, needed = 0;
  for (size_t i = first; i < first + size_t(count); ++i) {
    const Access a = step_access(steps[i], packed);
    needed |= a.reads & ~written;
    written |= a.writes;
  }
  return needed & written;
}
// Buffers the segment writes that a later step reads before overwriting (compared by the guard).
unsigned live_outputs(const std::vector<Step>& steps, size_t first, int count, bool packed) {
  unsigned written = 0;
  for (size_t i = first; i < first + size_t(count); ++i) written |= step_access(steps[i], packed).writes;
  unsigned live = written & kY, overwritten = 0;
  for (size_t i = first + size_t(count); i < steps.size(); ++i) {
    const Access a = step_access(steps[i], packed);
    live |= a.reads & written & ~overwritten;
    overwritten |= a.writes;
  }
  return live;
}

std::string pin_of(const Routes& r, const char* family, const std::string& legacy) {
  auto it = r.pins.find(family);
  return it != r.pins.end() && !it->second.empty() && it->second != "auto" ? it->second : legacy;
}

// Materialised-score attention is a candidate only up to this much score memory.
constexpr size_t kMaterializedLimit = size_t(128) << 20;

// HK_LIBRARIES=auto: a job of at most this many GEMM flops runs on the own kernels only. On the
// H200 (perf/RESULTS.md) cuBLASLt's one-time set-up on hk_forward's critical path is ~0.15 s
// (library load ~0.05 s, its first fp16 GEMM set-up ~0.09 s). The own-kernel plan's extra GPU
// time per position (tuned forwards, perf/results/*-14-plans-final.txt): ~0.75 ns at case 6
// (D = F = 128, L = 4; 7.9e5 GEMM flops per position), break-even ~2e8 positions = 1.6e14
// flops; ~9 ns at case 12 (D = F = 256; 3.1e6 flops: own QKV kernel +0.08 ms, chain instead of
// the cuBLASLt split route +0.07 ms per 16384 positions), break-even ~1.6e7 positions = 5e13
// flops. The bound is the lower of the two.
constexpr double kShortJobFlops = 5e13;

// GEMM flops of one position through the whole model (QKV, out_proj, ffn_in, ffn_out).
double gemm_flops_per_position(const ModelConfig& c) {
  const double D = double(c.d_model), F = double(c.ffn_dim);
  return 2.0 * double(c.n_layers) * (3 * D * D + D * D + 2 * D * F);
}

// "" when the own kernels alone can run every step of this model (fast precision): the mma QKV
// kernel, f16 flash attention, the fused post-attention chain; else why not.
std::string own_kernels_gap(const ModelConfig& c, Precision precision, int S) {
  if (precision != Precision::fast) return "fp32 precision runs its GEMMs on cuBLASLt";
  if (!small_gemm_supports(3 * c.d_model, c.d_model)) return "the own QKV kernel needs D a multiple of 32 up to 256";
#if HK_CUDA_HAVE_POST_ATTN_FUSED
  if (!post_attn_fused_supports(c.d_model, c.ffn_dim))
    return "the fused post-attention chain needs D and F multiples of 8 up to 256";
#else
  return "the fused post-attention chain is not part of this build";
#endif
  AttentionParams a;
  a.B = 0;
  a.S = S;
  a.H = c.n_heads;
  a.head_dim = c.head_dim();
  a.qkv_row_stride = 3 * int64_t(c.d_model);
  a.out_row_stride = c.d_model;
  a.dtype = DType::f16;
  if (!flash_route_supports(a)) return "the flash kernel does not take head_dim " + std::to_string(a.head_dim);
  return "";
}

// Source files (prefixes) each kind of kernel depends on: an edit invalidates its cache entries.
const std::vector<std::string> kEngineSources = {"backends/cuda/engine.", "backends/cuda/tune_cuda",
                                                 "backends/cuda/arena.", "backends/cuda/weights."};

}  // namespace

Routes routes_from_environment() {
  using tune::knob_choice;
  Routes r;
  const std::string gelu = knob_choice("HK_GELU", {"auto", "erf", "epilogue"});
  const std::string attention =
      knob_choice("HK_ATTENTION", {"auto", "flash", "flash.q64", "flash.q16", "flash.k2", "flash.k4", "flash.g4",
                                   "cudnn", "materialized"});
  const std::string graph = knob_choice("HK_GRAPH", {"auto", "0", "1"});
  r.gelu_epilogue = gelu == "epilogue";
  r.prefer_cudnn = attention == "cudnn";
  r.graphs = graph != "0";
  r.poison = knob_choice("HK_CUDA_POISON", {"0", "1"}) == "1";
  r.tune = tune::tune_enabled();
  r.tune_verbose = knob_choice("HK_TUNE_VERBOSE", {"0", "1"}) == "1";
  r.tune_remeasure = knob_choice("HK_TUNE_REMEASURE", {"0", "1"}) == "1";
  if (r.tune) r.tune_cache_dir = tune::TuneCache::default_directory();
  if (gelu == "erf") r.pins["gelu"] = "erf";
  if (attention == "flash" || attention == "flash.q64" || attention == "flash.q16" || attention == "flash.k2" ||
      attention == "flash.k4" || attention == "flash.g4" || attention == "materialized")
    r.pins["attention"] = attention;
  if (graph == "1") r.pins["graph"] = "1";
  const std::string layout = knob_choice("HK_GEMM_LAYOUT", {"auto", "nk", "kn"});
  if (layout == "nk" || layout == "kn") r.pins["gemm_layout"] = layout;
  const std::string algo = knob_choice("HK_GEMM_ALGO", {"auto", "0", "1", "2", "3", "4", "5", "6", "7"});
  if (!algo.empty() && algo != "auto") r.pins["gemm_algo"] = algo;
  const std::string neighbours = knob_choice("HK_GEMM_NEIGHBOURS", {"off", "cluster", "tiles"});
  if (neighbours == "cluster" || neighbours == "tiles") r.pins["gemm_neighbours"] = neighbours;
  const std::string qkv_gemm = knob_choice("HK_QKV_GEMM", {"auto", "cublaslt", "mma"});
  if (qkv_gemm == "cublaslt" || qkv_gemm == "mma") r.pins["qkv_gemm"] = qkv_gemm;
  const std::string chains = knob_choice("HK_CHAINS", {"auto", "off", "persistent", "post_attn_qkv", "attention_chain", "attention_model"});
  if (!chains.empty() && chains != "auto") r.pins["chains"] = chains;
  const std::string pack = knob_choice("HK_PACK", {"auto", "0", "1"});
  if (pack == "0" || pack == "1") r.pins["pack"] = pack;
  const std::string libraries = knob_choice("HK_LIBRARIES", {"auto", "all", "own"});
  if (libraries == "all" || libraries == "own") r.pins["libraries"] = libraries;
  return r;
}

// The four GEMM nodes of a layer.
enum class GemmWhich { qkv, out, in, outf };

// One GEMM node of a plan: its cuBLASLt problem in the [N, K] weight layout and, when the
// transposed copies exist, the [K, N] one; the measured (or default) layout and algorithm.
struct GemmNode {
  const char* step = "";
  GemmWhich which = GemmWhich::qkv;
  std::unique_ptr<LtGemm> nk, kn;
  std::vector<int> nk_bind, kn_bind;  // per layer
  bool use_kn = false;
  bool decided = false;
  // The own mma kernel's tile widths offered beside cuBLASLt (QKV projection, fp16, K <= 256);
  // use_mma >= 0: the measured choice is that kernel with mma[use_mma].
  std::vector<SmallGemmConfig> mma;
  int use_mma = -1;
  GemmShape shape;  // the [N, K] problem (known before any cuBLASLt descriptor exists)
  std::function<void()> make;  // builds nk / kn and the bias bindings; empty once built
  // Not during a stream capture: cuBLASLt's set-up may allocate. The engine decides every GEMM
  // of a plan (decide_gemm) before it captures or times anything.
  void ensure() {
    if (!make) return;
    make();  // throws: stays unbuilt, the next use tries again
    make = nullptr;
  }
  bool built() const { return !make; }
  LtGemm& active() const { return use_kn ? *kn : *nk; }
  int binding(int layer) const { return (use_kn ? kn_bind : nk_bind)[size_t(layer)]; }
};

// What the tuner needs to know about each kernel of the table (same index).
struct KernelMeta {
  std::string id;                    // candidate id ("flash.q16", "post_attn", ...)
  std::vector<std::string> sources;  // fingerprint prefixes
  std::function<void(Ctx&, const Step*, int)> inner;  // its own decisions (GEMM algorithm, chain map)
};

// Everything that depends on B: GEMM descriptors and algorithms, the attention routes, the plan.
struct Plan {
  int B = 0;
  int order = 0;  // how many plans existed before this one
  int64_t T = 0;  // token rows: B * S, or the padding-free bucket
  bool packed = false;  // padding-free: rows are the packed valid tokens (+ zero rows up to T)
  // Packed plans: the pack kernel writes the residual's packed copy (buf.x). Cleared once the plan
  // is final when its first layer's post-attention step is the fused chain, which gathers the
  // residual from the input rows itself; every measurement before that runs with the copy made.
  bool pack_x = true;
  Shape shape;
  std::string shape_text;  // for tune keys
  AttentionParams attn;    // lengths bound per call
  GemmNode qkv, out, ffn_in, ffn_in_tanh, ffn_out;
  bool have_tanh = false;
  std::string gelu_note;  // why the tanh epilogue is not a candidate
  std::unique_ptr<CudnnRoute> cudnn;
  DeviceBuffer cudnn_workspace;
  std::unique_ptr<MaterializedAttention> materialized;  // the scores in memory (size-guarded)
  DeviceBuffer materialized_workspace;
  std::string materialized_note;
  std::string attention_note;  // why cuDNN is not a candidate (when requested)
  std::vector<std::string> chain_notes;
  std::vector<Kernel<Ctx>> table;
  std::vector<KernelMeta> meta;
  std::vector<PlannedKernel<Ctx>> kernels;
  bool planned = false;  // kernels chosen (a tuning engine chooses during the first forward)
  bool warmed = false;
  std::string graph_note;  // non-empty: this B runs eagerly (capture failed or eager measured faster)
  bool graph_decided = false;
  std::vector<tune::Decision> decisions;
  TuneReport report;
  std::vector<int> whole_models;     // table indices of the whole-model kernels (tiles, columns)
  std::string whole_model_note;      // why it is not a candidate (explain)
#if HK_CUDA_HAVE_QKV_ATTENTION_FUSED
  QkvAttentionParams qkv_attention{};
  std::vector<QkvAttentionMap> qkv_attention_maps;
  size_t qkv_attention_map = 0;
  bool qkv_attention_decided = false;
#endif
#if HK_CUDA_HAVE_POST_ATTN_FUSED
  std::vector<PostAttnConfig> post_attn_configs;
  size_t post_attn_config = 0;
  bool post_attn_decided = false;
  // The chain that also runs the next layer's QKV projection (its own launch configurations).
  std::vector<PostAttnConfig> post_attn_qkv_configs;
  size_t post_attn_qkv_config = 0;
  bool post_attn_qkv_decided = false;
#endif
  size_t index_of(const Kernel<Ctx>* k) const { return size_t(k - table.data()); }
  // Whether the chosen kernels run a step of this kind as a kernel of its own (not in a chain).
  bool runs_alone(const std::vector<Step>& steps, StepKind kind) const {
    for (const auto& k : kernels)
      if (k.count == 1 && steps[size_t(k.first)].kind == kind) return true;
    return false;
  }
};

// The transposed [K, N] copies of every GEMM weight (the layout alternative), one allocation.
struct KnWeights {
  DeviceBuffer buf;
  struct Layer {
    const void* w_qkv;
    const void* w_o;
    const void* w_in;
    const void* w_out;
  };
  std::vector<Layer> layers;
};

struct CudaEngine::Impl {
  ModelConfig cfg;
  Precision precision = Precision::fast;
  int max_batch = 0, S = 0, device = 0;
  Routes routes;
  std::string device_desc;
  int sm_count = 0;
  // The constructor's parts (ms, for stats()): waiting for / making the context, streams and the
  // cuBLASLt handle, the weights' upload, the activation arena; and the whole.
  double ctor_context_ms = 0, ctor_props_ms = 0, ctor_handles_ms = 0, ctor_weights_ms = 0, ctor_arena_ms = 0,
         ctor_cache_ms = 0, ctor_ms = 0;
  DType act = DType::f16;
  float eps = 1e-5f;
  // Resolved pins ("" = free).
  std::string pin_attention, pin_gelu, pin_layout, pin_algo, pin_qkv_gemm, pin_chains, pin_graph, pin_pack,
      pin_gemm_neighbours;
  bool step_pinned = false;  // the caller pinned a step route (attention, GELU, GEMM layout / algorithm, QKV GEMM)
  // Own kernels only (HK_LIBRARIES, EngineOptions::job_tokens): no cuBLASLt / cuDNN route is made,
  // cuBLASLt is never loaded; the QKV GEMM is the own kernel, the post-attention steps the fused
  // chain. `libraries_note` says which applied and why (explain).
  bool own_only = false;
  std::string libraries_note;

  cudaStream_t stream = nullptr;          // host path, eager default
  cudaStream_t capture_stream = nullptr;  // warm-ups, captures, tuning
  cudaEvent_t done = nullptr;             // recorded after every forward (and warm-up)
  cudaStream_t done_stream = nullptr;     // the stream `done` was last recorded on
  // One of the engine's own streams whose last forward `done` does not cover yet: on its own
  // streams the record is left until something else needs it (a wait from another stream, a graph
  // eviction, the destructor), so that back-to-back forwards on one stream carry no event work.
  cudaStream_t done_pending = nullptr;
  // `done` is recorded only through these, so that done_stream / done_pending stay true. A wait on
  // one of the engine's own streams for `done` last recorded (or pending) on that same stream is
  // ordered by the stream itself and is left out; a caller's stream always waits and gets its
  // record at once (its handle may have been destroyed and reused by the time of a later call).
  void flush_done() {
    if (!done_pending) return;
    HK_CUDA_CHECK(cudaEventRecord(done, done_pending));
    done_stream = done_pending;
    done_pending = nullptr;
  }
  bool own_stream(cudaStream_t s) const { return s == stream || s == capture_stream; }
  void record_done(cudaStream_t s) {
    if (done_pending && done_pending != s) {  // keep the other stream's work covered
      flush_done();
      HK_CUDA_CHECK(cudaStreamWaitEvent(s, done, 0));
    }
    if (own_stream(s)) {
      done_pending = s;
      return;
    }
    HK_CUDA_CHECK(cudaEventRecord(done, s));
    done_stream = s;
    done_pending = nullptr;
  }
  void wait_done(cudaStream_t s) {
    if (done_pending && done_pending == s) return;
    flush_done();
    if (!own_stream(s) || s != done_stream) HK_CUDA_CHECK(cudaStreamWaitEvent(s, done, 0));
  }
  cudaEvent_t caller = nullptr;           // orders a warm-up after the caller's stream
  cublasLtHandle_t lt = nullptr;  // made on first use (lt_handle): own-kernel plans never load cuBLASLt
  cublasLtHandle_t lt_handle() {
    if (!lt) HK_CUBLAS_CHECK(lt::api().Create(&lt));
    return lt;
  }

  std::unique_ptr<DeviceWeights> weights;
#if HK_CUDA_HAVE_MODEL_PERSISTENT
  std::unique_ptr<PersistentModel> persistent;  // the whole-model kernel's layer table, where supported
#endif
  DeviceBuffer alias_scratch;  // the caller's x while a warm-up runs with y == x
  std::unique_ptr<KnWeights> kn_weights;  // only when the layout decision may pick [K, N]
  std::unique_ptr<DeviceArena> arena;
  Activations buf{};
  std::vector<Step> steps;
  std::map<std::pair<int, int64_t>, std::unique_ptr<Plan>> plans;  // by (B, rows)
  std::map<int, const Plan*> last_plan;                              // by B: the plan used last
  GraphCache graphs{kGraphCacheEntries};
  int next_out = 0;
  PinnedBuffer x_stage, y_stage, len_stage, flag_stage;

  tune::DeviceIdentity identity;
  std::unique_ptr<tune::TuneCache> cache;
  std::unique_ptr<tune::Chooser> chooser;
  std::unique_ptr<CandidateTimer> timer;
  // Tuning only, freed once a plan is tuned: a segment's snapshot + reference, an inner
  // decision's (kept apart: inner decisions run while a segment's snapshot is held), the guard's
  // 4-byte result.
  DeviceBuffer seg_scratch, inner_scratch, guard_result;

  Impl(const Model& model, const EngineOptions& o, const Routes& r);
  ~Impl() { release(); }
  void release() noexcept;

  int64_t rows_for(int B, int64_t tokens) const;
  Plan& plan(int B, int64_t rows);
  std::unique_ptr<Plan> build_plan(int B, int64_t rows);
  void build_table(Plan& p);
  void make_kn_weights(const Model& model);
  void choose_plan(Plan& p, const Ctx& c);
  void finish_plan(Plan& p) const;
  std::string explain_plan(const Plan& p, int B) const;
  std::vector<PlannedKernel<Ctx>> replan_forcing(Plan& p, const Ctx& c, const std::map<std::string, int>& forced);
  void decide_chains_in_forward(Plan& p, const Ctx& c);
  int choose_segment(Plan& p, const tune::Segment<Ctx>& seg, const Ctx& c);
  int pinned_option(const Plan& p, const tune::Segment<Ctx>& seg) const;
  // HK_CHAINS pins one chain kernel (post_attn_qkv, attention_chain): its per-layer plan then
  // stays, tuned or not (no persistent whole-model kernel in its place); attention_model: the
  // chains' whole-model kernel replaces the plan (decide_whole_model).
  bool pinned_chain_kernel() const {
    return pin_chains == "post_attn_qkv" || pin_chains == "attention_chain" || pin_chains == "attention_model";
  }
  void decide_gemm(Plan& p, GemmNode& g, const Step& s, const Ctx& c);
  void decide_graph(Plan& p, cudaGraphExec_t g, const Ctx& c);
  void decide_whole_model(Plan& p, const Ctx& c);
  void decide_qkv_chain(Plan& p, const Ctx& c);
  tune::Decision decide_by_forward(Plan& p, const Ctx& c, const tune::TuneKey& k,
                                   const std::vector<tune::Candidate>& cands,
                                   const std::function<void(int, Ctx&)>& run_with);
  void run_inner(Plan& p, const PlannedKernel<Ctx>& k, Ctx& c);
  void run_gemm(Plan& p, GemmNode& g, int layer, const void* in, const float* residual, void* out,
                cudaStream_t s) const;
  void record(Plan& p, Ctx c) { run_plan(p.kernels, steps, c); }
  cudaGraphExec_t graph_for(Plan& p, const GraphKey& key, cudaStream_t caller_stream);
  void warm_up(Plan& p, const Ctx& c, cudaStream_t caller_stream);
  void run(int B, const float* x, const int32_t* lengths, float* y, cudaStream_t s, int64_t tokens);
  void check_batch(int B, const char* what) const;
  // x_in: a synthetic input of B sequences; lengths_in: all S, or `tokens` (>= 0) valid
  // positions spread evenly over the B sequences.
  void synthetic_host_input(int B, int64_t tokens = -1);
  float* next_output() {
    float* y = buf.y[next_out];
    next_out ^= 1;
    return y;
  }

  // Tuning helpers.
  tune::ChooserOptions chooser_options(const std::string& pin = "") const;
  tune::TuneKey key(const Plan& p, const std::string& op, const std::vector<std::string>& sources) const;
  struct BufView {
    void* ptr;
    DType type;
    int cols;
  };
  BufView view(const Plan& p, unsigned bit, const Ctx& c) const;
  // Rows of an arena buffer a plan uses: its token rows, except y ([B, S, D] always).
  int64_t rows_of(const Plan& p, unsigned bit) const { return bit == kY ? int64_t(p.B) * S : p.T; }
  void pack_input(Plan& p, const Ctx& c, const DeviceLayerWeights& w0);
  size_t buf_bytes(const Plan& p, unsigned set) const;
  void copy_set(const Plan& p, unsigned set, const Ctx& c, char* region, bool to_scratch) const;
  double diff_set(const Plan& p, unsigned set, const Ctx& c, const char* ref);
  char* scratch(DeviceBuffer& b, size_t bytes, cudaStream_t s);
};

CudaEngine::Impl::Impl(const Model& model, const EngineOptions& o, const Routes& r)
    : cfg(model.config), precision(o.precision), max_batch(o.max_batch), S(o.seq_len), device(o.device), routes(r) {
  cfg.validate("model");
  if (precision == Precision::reference)
    throw Error("cuda backend: precision 'reference' (float64) is not supported; use the kokkos backend");
  if (max_batch < 1 || S < 1) throw Error("cuda backend: max_batch and seq_len must be at least 1");
  if (int64_t(model.layers.size()) != cfg.n_layers) throw Error("cuda backend: model has the wrong number of layers");
  using ctor_clock = std::chrono::steady_clock;
  const auto t_ctor = ctor_clock::now();
  const auto ms_since = [](ctor_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(ctor_clock::now() - t).count();
  };
  int count = 0;
  HK_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count)
    throw Error("cuda backend: device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                " CUDA device(s))");
  HK_CUDA_CHECK(cudaSetDevice(device));
  HK_CUDA_CHECK(cudaFree(nullptr));  // the context (made here, or by Backend::prepare on another thread)
  ctor_context_ms = ms_since(t_ctor);
  const auto t_props = ctor_clock::now();
  cudaDeviceProp prop{};
  HK_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  ctor_props_ms = ms_since(t_props);
  if (prop.major < 8)
    throw Error("cuda backend: device " + std::to_string(device) + " (" + prop.name + ") is sm_" +
                std::to_string(prop.major) + std::to_string(prop.minor) + "; sm_80 or newer is needed");
  std::ostringstream d;
  d << prop.name << " (sm_" << prop.major << prop.minor << ", " << prop.multiProcessorCount << " SMs, "
    << (prop.totalGlobalMem >> 30) << " GiB)";
  device_desc = d.str();
  sm_count = prop.multiProcessorCount;
  act = precision == Precision::fast ? DType::f16 : DType::f32;
  eps = float(cfg.eps);
  pin_attention = pin_of(routes, "attention", routes.prefer_cudnn ? "cudnn" : "");
  pin_gelu = pin_of(routes, "gelu", routes.gelu_epilogue ? "epilogue" : "");
  pin_layout = pin_of(routes, "gemm_layout", "");
  pin_algo = pin_of(routes, "gemm_algo", "");
  pin_gemm_neighbours = pin_of(routes, "gemm_neighbours", "");
  pin_qkv_gemm = pin_of(routes, "qkv_gemm", "");
  // The caller's own pins (before HK_LIBRARIES=own adds its QKV GEMM one below).
  step_pinned = !pin_attention.empty() || !pin_gelu.empty() || !pin_layout.empty() || !pin_algo.empty() ||
                !pin_qkv_gemm.empty();
  pin_chains = pin_of(routes, "chains", "");
  pin_graph = pin_of(routes, "graph", routes.graphs ? "" : "0");
  pin_pack = pin_of(routes, "pack", "");
  // Own kernels only: pinned (HK_LIBRARIES=own), or a short job under auto; never against a pin
  // that names a library route, nor where the own kernels leave a step uncovered.
  const std::string pin_libraries = pin_of(routes, "libraries", "");
  const double job_flops = double(o.job_tokens) * gemm_flops_per_position(cfg);
  const bool want_own = pin_libraries == "own" ||
                        (pin_libraries.empty() && o.job_tokens > 0 && job_flops <= kShortJobFlops);
  if (want_own) {
    std::string why = own_kernels_gap(cfg, precision, S);
    if (why.empty() && (pin_qkv_gemm == "cublaslt" || pin_gelu == "epilogue" || !pin_layout.empty() ||
                        !pin_algo.empty() || pin_attention == "cudnn" || pin_attention == "materialized" ||
                        pin_chains == "off"))
      why = "a pin asks for a library route or single-step kernels";
    own_only = why.empty();
    char b[160];
    std::snprintf(b, sizeof b, "%.3g GEMM flops", job_flops);
    const std::string reason = pin_libraries == "own" ? std::string("HK_LIBRARIES=own") : "short job: " + std::string(b);
    libraries_note = own_only ? "own kernels only, cuBLASLt not loaded (" + reason + ")"
                              : "cuBLASLt as candidate (" + reason + ", but " + why + ")";
  } else {
    libraries_note = pin_libraries == "all" ? "cuBLASLt as candidate (HK_LIBRARIES=all)"
                     : o.job_tokens > 0     ? "cuBLASLt as candidate (a long job)"
                                            : "cuBLASLt as candidate (job size not given)";
  }
  if (own_only && pin_qkv_gemm.empty()) pin_qkv_gemm = "mma";
  try {
    auto t = ctor_clock::now();
    HK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    HK_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream, cudaStreamNonBlocking));
    HK_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    HK_CUDA_CHECK(cudaEventCreateWithFlags(&caller, cudaEventDisableTiming));
    if (!own_only) (void)lt_handle();  // cuBLASLt's load, here rather than inside the first plan
    ctor_handles_ms = ms_since(t);
    t = ctor_clock::now();
    weights = std::make_unique<DeviceWeights>(model, precision);
    // The [K, N] copies cost one more set of GEMM weights: only when the layout may be chosen.
    if (!own_only && (pin_layout == "kn" || (routes.tune && pin_layout.empty()))) make_kn_weights(model);
#if HK_CUDA_HAVE_MODEL_PERSISTENT
    if (precision == Precision::fast && pin_chains != "off" &&
        ((routes.tune && !pinned_chain_kernel()) || pin_chains == "persistent") &&
        std::any_of(std::begin(kPersistentKernels), std::end(kPersistentKernels),
                    [&](PersistentKernel k) { return model_persistent_supports(cfg, S, k); }))
      persistent = std::make_unique<PersistentModel>(cfg, *weights);
#endif
    ctor_weights_ms = ms_since(t);
    t = ctor_clock::now();
    arena = std::make_unique<DeviceArena>(activation_layout(cfg, max_batch, S, precision, kLtWorkspaceBytes),
                                          max_batch, S, routes.poison);
    ctor_arena_ms = ms_since(t);
    buf = arena->buffers();
    t = ctor_clock::now();
    steps = forward_steps(cfg.n_layers);
    identity = device_identity(device, !own_only);  // own kernels only: no library versions (nor loads)
    cache = std::make_unique<tune::TuneCache>(routes.tune ? routes.tune_cache_dir : std::string());
    chooser = std::make_unique<tune::Chooser>(cache.get(), routes.tune_verbose);
    timer = std::make_unique<CandidateTimer>(capture_stream);
    ctor_cache_ms = ms_since(t);
    ctor_ms = ms_since(t_ctor);
  } catch (...) {
    release();
    throw;
  }
}

void CudaEngine::Impl::make_kn_weights(const Model& model) {
  const WeightImage img = build_weight_image(model, precision);
  const size_t elem = img.gemm_type == DType::f16 ? 2 : 4;
  const int64_t D = cfg.d_model, F = cfg.ffn_dim;
  std::vector<unsigned char> out;
  auto put_transposed = [&](size_t src, int64_t n, int64_t k) {  // [n, k] -> [k, n]
    const size_t at = (out.size() + kTensorAlign - 1) / kTensorAlign * kTensorAlign;
    out.resize(at + size_t(n * k) * elem, 0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j)
        std::memcpy(&out[at + size_t(j * n + i) * elem], &img.bytes[src + size_t(i * k + j) * elem], elem);
    return at;
  };
  std::vector<std::array<size_t, 4>> offs;
  for (const WeightImage::Layer& l : img.layers)
    offs.push_back({put_transposed(l.w_qkv, 3 * D, D), put_transposed(l.w_o, D, D), put_transposed(l.w_in, F, D),
                    put_transposed(l.w_out, D, F)});
  auto kn = std::make_unique<KnWeights>();
  kn->buf = DeviceBuffer(out.size());
  HK_CUDA_CHECK(cudaMemcpy(kn->buf.get(), out.data(), out.size(), cudaMemcpyHostToDevice));
  const auto* base = static_cast<const unsigned char*>(kn->buf.get());
  for (const auto& o : offs) kn->layers.push_back({base + o[0], base + o[1], base + o[2], base + o[3]});
  kn_weights = std::move(kn);
}

void CudaEngine::Impl::release() noexcept {
  cudaSetDevice(device);
  if (done && done_pending) cudaEventRecord(done, done_pending);
  if (done) cudaEventSynchronize(done);  // the last forward, whatever stream it ran on
  if (stream) cudaStreamSynchronize(stream);
  if (capture_stream) cudaStreamSynchronize(capture_stream);
  graphs.clear();
  last_plan.clear();
  plans.clear();  // LtGemm descriptors and cuDNN plans, before their handles
#if HK_CUDA_HAVE_MODEL_PERSISTENT
  persistent.reset();
#endif
  timer.reset();
  if (lt) lt::api().Destroy(lt);
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

// The rows a plan of (B, tokens) runs on (engine.hpp: padding-free execution).
int64_t CudaEngine::Impl::rows_for(int B, int64_t tokens) const { return padding_free_rows(B, S, tokens, pin_pack); }

Plan& CudaEngine::Impl::plan(int B, int64_t rows) {
  auto it = plans.find({B, rows});
  if (it == plans.end()) {
    const auto t0 = std::chrono::steady_clock::now();
    auto p = build_plan(B, rows);
    p->order = int(plans.size());
    p->report.build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    it = plans.emplace(std::make_pair(B, rows), std::move(p)).first;
  }
  last_plan[B] = it->second.get();
  return *it->second;
}

std::unique_ptr<Plan> CudaEngine::Impl::build_plan(int B, int64_t rows) {
  auto p = std::make_unique<Plan>();
  const int D = cfg.d_model, F = cfg.ffn_dim, L = cfg.n_layers;
  p->B = B;
  p->T = rows;
  p->packed = rows < int64_t(B) * S;
  p->shape = Shape{B, S, cfg, precision};
  {
    std::ostringstream s;
    s << "B=" << B << " S=" << S << " D=" << D << " H=" << cfg.n_heads << " F=" << F << " L=" << L
      << (cfg.causal ? " causal" : " bidirectional") << " " << to_string(precision);
    if (p->packed) s << " packed rows=" << rows;
    p->shape_text = s.str();
  }
  const DType g = act;
  const bool kn = kn_weights != nullptr && pin_layout != "nk";
  const bool nk = pin_layout != "kn";

  // A GEMM node's cuBLASLt descriptors (both weight layouts where tuning may choose either, the
  // algorithm candidates, one bias binding per layer) are made on its first use: its decision
  // or its first run. cuBLASLt sets itself up once per type and epilogue combination (~65-150 ms
  // each on an H200), so a plan whose chosen kernels use no residual GEMM (the fused
  // post-attention chain) never pays for that combination. `eager`: made now, and the return
  // value says whether cuBLASLt offers an algorithm (optional nodes).
  Plan* P = p.get();
  auto gemm = [&, P](GemmNode& node, const char* step, GemmWhich which, GemmShape s, const void* first_bias,
                     bool required, bool eager) {
    node.step = step;
    node.which = which;
    node.shape = s;
    node.make = [this, P, &node, step, s, first_bias, required, nk, kn, L] {
      const auto t0 = std::chrono::steady_clock::now();
      node.nk.reset();  // a build that threw part-way starts over
      node.kn.reset();
      node.nk_bind.clear();
      node.kn_bind.clear();
      node.use_kn = false;
      auto make = [&](bool kn_layout) {
        GemmShape t = s;
        t.weight_kn = kn_layout;
        return std::make_unique<LtGemm>(lt_handle(), t, first_bias);
      };
      if (nk) node.nk = make(false);
      if (kn) node.kn = make(true);
      if (node.kn && !node.kn->available()) node.kn.reset();
      if (node.nk && !node.nk->available()) node.nk.reset();
      if (!node.nk && node.kn) node.use_kn = true;  // pinned [K, N]
      if (!node.nk && !node.kn && !(nk && !kn && !required)) {
        // A pinned [K, N] the heuristic lacks falls back to [N, K].
        if (!nk) node.nk = make(false);
        if ((!node.nk || !node.nk->available()) && required) {
          throw Error(std::string("cuda backend: cuBLASLt offers no algorithm for ") + step + " (rows " +
                      std::to_string(s.rows) + ", n " + std::to_string(s.n) + ", k " + std::to_string(s.k) + ", " +
                      to_string(s.epilogue) + ")");
        }
        if (node.nk && !node.nk->available()) node.nk.reset();
      }
      for (int l = 0; l < L; ++l) {
        const DeviceLayerWeights& w = weights->layer(l);
        const void* bias = node.which == GemmWhich::qkv   ? static_cast<const void*>(w.b_qkv)
                           : node.which == GemmWhich::out ? static_cast<const void*>(w.b_o)
                           : node.which == GemmWhich::in  ? static_cast<const void*>(w.b_in)
                                                          : static_cast<const void*>(w.b_out);
        if (node.nk) node.nk_bind.push_back(node.nk->bind_bias(bias));
        if (node.kn) node.kn_bind.push_back(node.kn->bind_bias(bias));
      }
      P->report.gemm_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    if (!eager) return true;
    node.ensure();
    return node.nk != nullptr || node.kn != nullptr;
  };
  const DeviceLayerWeights& w0 = weights->layer(0);
  gemm(p->qkv, "qkv_proj", GemmWhich::qkv, {p->T, 3 * D, D, g, g, GemmEpilogue::bias}, w0.b_qkv, true, false);
  // The own kernel: the only candidates when pinned (HK_QKV_GEMM=mma), else a measured
  // alternative (never the untuned default, not beside a pinned cuBLASLt algorithm or layout).
  const bool offer_mma = pin_qkv_gemm == "mma" ||
                         (pin_qkv_gemm.empty() && routes.tune && pin_algo.empty() && pin_layout.empty());
  if (g == DType::f16 && offer_mma && small_gemm_supports(3 * D, D)) p->qkv.mma = small_gemm_candidates(p->T, 3 * D, D);
  gemm(p->out, "out_proj", GemmWhich::out, {p->T, D, D, g, DType::f32, GemmEpilogue::bias_residual}, w0.b_o, true,
       false);
  gemm(p->ffn_in, "ffn_in", GemmWhich::in, {p->T, F, D, g, g, GemmEpilogue::bias}, w0.b_in, true, false);
  gemm(p->ffn_out, "ffn_out", GemmWhich::outf, {p->T, D, F, g, DType::f32, GemmEpilogue::bias_residual}, w0.b_out,
       true, false);
  const bool want_tanh = !own_only && (pin_gelu == "epilogue" || (routes.tune && pin_gelu.empty()));
  if (want_tanh) {
    // Made now: whether cuBLASLt has this epilogue for the shape decides whether the route exists.
    if (precision != Precision::fast) {
      p->gelu_note = "the tanh epilogue is not exact enough for fp32";
    } else if (!gemm(p->ffn_in_tanh, "ffn_in", GemmWhich::in, {p->T, F, D, g, g, GemmEpilogue::bias_gelu_tanh},
                     w0.b_in, false, true)) {
      p->gelu_note = "cuBLASLt offers no GELU-epilogue algorithm for this shape";
    } else {
      p->have_tanh = true;
    }
  }

  AttentionParams& a = p->attn;
  a.qkv = buf.qkv;
  a.out = buf.o;
  a.lengths = buf.lengths_full;
  a.seq_start = p->packed ? buf.seq_start : nullptr;
  a.B = B;
  a.S = S;
  a.H = cfg.n_heads;
  a.head_dim = cfg.head_dim();
  a.qkv_row_stride = 3 * int64_t(D);
  a.out_row_stride = D;
  a.scale = float(1.0 / std::sqrt(double(a.head_dim)));
  a.causal = cfg.causal;
  a.dtype = act;
  const bool want_cudnn = !own_only && (pin_attention == "cudnn" || (routes.tune && pin_attention.empty()));
  if (want_cudnn && p->packed) {
    p->attention_note = "cudnn not used: the padding-free layout is not a cuDNN route here";
  } else if (want_cudnn) {
    std::string why;
    if (!CudnnRoute::runtime_ok(&why)) {
      p->attention_note = "cudnn not used: " + why;
    } else {
      auto c = std::make_unique<CudnnRoute>();
      if (!c->supports(a)) {
        p->attention_note = "cudnn not used: cuDNN does not support this shape/dtype";
      } else {
        c->prepare(a, capture_stream);  // plan time: cuDNN builds its plan outside any capture
        p->cudnn_workspace = DeviceBuffer(c->workspace_bytes(a));
        p->cudnn = std::move(c);
      }
    }
  }

  // Materialised scores (H x B x S x S fp32): a candidate only while they stay within the limit.
  const bool want_materialized =
      !own_only && (pin_attention == "materialized" || (routes.tune && pin_attention.empty()));
  if (want_materialized) {
    std::string why;
    if (act != DType::f16 || p->packed) {
      p->materialized_note = "f16 dense layout only";
    } else if (!attention_materialized_supports(a, kMaterializedLimit)) {
      p->materialized_note = "scores beyond " + std::to_string(kMaterializedLimit >> 20) + " MiB, or shape unsupported";
    } else {
      auto m = std::make_unique<MaterializedAttention>(lt_handle());
      if (m->prepare(a, &why)) {
        p->materialized_workspace = DeviceBuffer(attention_materialized_workspace(a));
        // The score rows' padding columns (S rounded up to 8) are never written by the GEMMs;
        // the softmax reads them in pairs and ignores them: zero once, so nothing reads garbage.
        HK_CUDA_CHECK(cudaMemset(p->materialized_workspace.get(), 0, p->materialized_workspace.bytes()));
        p->materialized = std::move(m);
      } else {
        p->materialized_note = why;
      }
    }
  }

  build_table(*p);
  // Why the attention has no route, with what does run it (the f16 kernels read a head as
  // 16-byte chunks: head_dim a multiple of 8; the f32 flash kernel takes any head_dim up to 256).
  auto attention_gap = [&]() -> std::string {
    if (flash_route_supports(a)) return "";
    if (!flash_route_compiled()) return " (the flash route is not part of this build)";
    const std::string hd = std::to_string(a.head_dim);
    if (act == DType::f16 && a.head_dim % 8 != 0 && a.head_dim <= 256)
      return " (the fast precision's attention kernels take head_dim a multiple of 8, not " + hd +
             "; precision fp32 runs it: hk_forward --precision fp32)";
    return " (no attention route supports head_dim " + hd + " in " + (act == DType::f16 ? "f16" : "f32") + ")";
  };
  if (!routes.tune) {
    // Untuned: nothing is measured, so the plan needs no data: the defaults (and pins) now.
    Ctx none{capture_stream, nullptr, nullptr, nullptr};
    try {
      choose_plan(*p, none);
      decide_whole_model(*p, none);  // only a pin (HK_CHAINS=persistent) applies untuned
      finish_plan(*p);
    } catch (const Error& e) {
      throw Error(std::string("cuda backend: cannot plan B = ") + std::to_string(B) + ": " + e.what() +
                  attention_gap());
    }
  } else {
    // A tuning engine chooses during the first forward; fail now if no route covers a step.
    try {
      (void)hk::make_plan(steps, p->table, p->shape);
    } catch (const Error& e) {
      throw Error(std::string("cuda backend: cannot plan B = ") + std::to_string(B) + ": " + e.what() +
                  attention_gap());
    }
  }
  return p;
}

// Padding-free layer 0 ln1: offsets of the sequences, then the valid rows of the caller's x
// packed into the residual buffer with their LayerNorm, the tail rows zeroed (x, h, o) and the
// padded rows of y zeroed (nothing later writes them).
void CudaEngine::Impl::pack_input(Plan& p, const Ctx& c, const DeviceLayerWeights& w0) {
  packed_offsets(c.lengths, p.B, S, buf.seq_start, c.stream);
  PackParams k;
  k.x = c.x;
  k.lengths = c.lengths;
  k.seq_start = buf.seq_start;
  k.B = p.B;
  k.S = S;
  k.D = cfg.d_model;
  k.Tcap = p.T;
  k.x_packed = p.pack_x ? buf.x : nullptr;
  k.h = buf.h;
  k.act = act;
  k.w = w0.ln1_w;
  k.b = w0.ln1_b;
  k.eps = eps;
  k.row_dst = buf.row_dst;
  k.o = buf.o;
  k.y = c.y;
  k.overflow = buf.pack_flag;
  pack_layer_norm(k, c.stream);
}

void CudaEngine::Impl::run_gemm(Plan& p, GemmNode& g, int layer, const void* in, const float* residual, void* out,
                                cudaStream_t s) const {
  if (g.use_mma >= 0) {  // QKV only (build_plan): [N, K] weights, fp16 bias
    const DeviceLayerWeights& w = weights->layer(layer);
    SmallGemmParams q;
    q.a = static_cast<const __half*>(in);
    q.w = static_cast<const __half*>(w.w_qkv);
    q.bias = static_cast<const __half*>(w.b_qkv);
    q.c = static_cast<__half*>(out);
    q.rows = p.T;
    q.n = 3 * cfg.d_model;
    q.k = cfg.d_model;
    small_gemm_bias(q, s, g.mma[size_t(g.use_mma)]);
    return;
  }
  g.ensure();  // normally made by decide_gemm already
  const void* W = nullptr;
  if (g.use_kn) {
    const KnWeights::Layer& k = kn_weights->layers[size_t(layer)];
    W = g.which == GemmWhich::qkv ? k.w_qkv : g.which == GemmWhich::out ? k.w_o : g.which == GemmWhich::in ? k.w_in : k.w_out;
  } else {
    const DeviceLayerWeights& w = weights->layer(layer);
    W = g.which == GemmWhich::qkv ? w.w_qkv : g.which == GemmWhich::out ? w.w_o : g.which == GemmWhich::in ? w.w_in : w.w_out;
  }
  g.active().run(g.binding(layer), W, in, residual, out, buf.workspace, s);
}

void CudaEngine::Impl::build_table(Plan& p) {
  Impl* E = this;
  Plan* P = &p;
  const int D = cfg.d_model;
  const std::string ln = std::string("hk::layer_norm[") + row_norm_variant(D) + "]";
  const std::string final_ln = std::string("hk::layer_norm[") + row_norm_variant(D) + ".final]";
  auto& t = p.table;
  auto& m = p.meta;
  const std::vector<std::string> ln_src = {"backends/cuda/rownorm"};
  const std::vector<std::string> gemm_src = {"backends/cuda/gemm_cublaslt"};
  auto add = [&](Kernel<Ctx> k, std::string id, std::vector<std::string> sources,
                 std::function<void(Ctx&, const Step*, int)> inner = nullptr) {
    t.push_back(std::move(k));
    m.push_back({std::move(id), std::move(sources), std::move(inner)});
  };
  auto gemm_inner = [E, P](GemmNode* g) {
    return [E, P, g](Ctx& c, const Step* s, int) { E->decide_gemm(*P, *g, *s, c); };
  };

  // Single-step kernels first: for each step the table's first covering kernel is the untuned
  // default; alternatives and chains follow and are only ever chosen by measurement or a pin.
  add(single_step_kernel<Ctx>(p.packed ? "hk::pack[cuda.offsets] + hk::layer_norm[cuda.pack]" : ln, StepKind::ln1,
                              [E, P, D](Ctx& c, const Step& s) {
        const DeviceLayerWeights& w = E->weights->layer(s.layer);
        if (P->packed && s.layer == 0) {
          E->pack_input(*P, c, w);
          return;
        }
        // Dense layer 0 normalises the caller's input directly: no copy into the residual stream.
        layer_norm(s.layer == 0 ? c.x : E->buf.x, E->buf.h, E->act, w.ln1_w, w.ln1_b, P->T, D, E->eps, c.stream);
      }),
      "ln", ln_src);
  add(single_step_kernel<Ctx>(p.qkv.mma.empty()         ? "hk::gemm[cuda.cublaslt.bias]"
                              : pin_qkv_gemm == "mma" ? "hk::gemm[cuda.mma.bias]"
                                                      : "hk::gemm[cuda.cublaslt|mma.bias]",
                              StepKind::qkv_proj,
                              [E, P](Ctx& c, const Step& s) {
                                E->run_gemm(*P, P->qkv, s.layer, E->buf.h, nullptr, E->buf.qkv, c.stream);
                              }),
      "gemm",
      p.qkv.mma.empty() ? gemm_src
                        : std::vector<std::string>{"backends/cuda/gemm_cublaslt", "backends/cuda/gemm_small"},
      gemm_inner(&p.qkv));

  // Attention: a pinned route alone (flash when the pinned one lacks the shape); otherwise the
  // flash kernel with its occupancy-chosen tile first, then its other tile and cuDNN.
  const bool flash_ok = flash_route_supports(p.attn);
  auto flash = [&](FlashTile tile, const std::string& id) {
    const bool ok = flash_route_supports(p.attn, tile);
    add(single_step_kernel<Ctx>(
            ok ? flash_route_name(p.attn, tile) : std::string("hk::attention[cuda.flash]"), StepKind::attention,
            [P, tile](Ctx& c, const Step&) {
              AttentionParams a = P->attn;
              a.lengths = c.lengths;
              flash_route_run(a, c.stream, tile);
            },
            [ok](const Shape&) { return ok; }),
        id, {"backends/cuda/attention_flash", "backends/cuda/attention_route"});
  };
  // Keys split over a cluster of CTAs: candidates (tuning) where a sequence has at least 4 key
  // tiles of 64 and the unsplit q64 grid is at most 8 CTAs per SM, so that each CTA walks many key
  // tiles while few CTAs run (case 10's 16 x 512).
  const int64_t q64_ctas = int64_t(p.attn.B) * p.attn.H * ((p.attn.S + 63) / 64);
  const bool split_worth = p.attn.S >= 256 && q64_ctas <= 8 * int64_t(sm_count);
  const auto split_tile = [](const std::string& id) { return id == "flash.k2" ? FlashTile::q64k2 : FlashTile::q64k4; };
  auto cudnn = [&] {
    add(single_step_kernel<Ctx>(p.cudnn->name(), StepKind::attention,
                                [P](Ctx& c, const Step&) {
                                  AttentionParams a = P->attn;
                                  a.lengths = c.lengths;
                                  P->cudnn->run(a, P->cudnn_workspace.get(), c.stream);
                                }),
        "cudnn", {"backends/cuda/attention_cudnn", "backends/cuda/attention_route"});
  };
  auto materialized = [&] {
    add(single_step_kernel<Ctx>(attention_materialized_name(), StepKind::attention,
                                [P](Ctx& c, const Step&) {
                                  AttentionParams a = P->attn;
                                  a.lengths = c.lengths;
                                  P->materialized->run(a, P->materialized_workspace.get(), c.stream);
                                }),
        "materialized", {"backends/cuda/attention_materialized", "backends/cuda/attention_route"});
  };
  const bool f16_tiles = flash_ok && act == DType::f16;
  const bool auto_is_q64 = f16_tiles && flash_route_name(p.attn) == flash_route_name(p.attn, FlashTile::q64);
  if (pin_attention == "cudnn" && p.cudnn) {
    cudnn();
  } else if (pin_attention == "materialized" && p.materialized) {
    materialized();
  } else if ((pin_attention == "flash.q64" || pin_attention == "flash.q16") && f16_tiles) {
    flash(pin_attention == "flash.q64" ? FlashTile::q64 : FlashTile::q16, pin_attention);
  } else if ((pin_attention == "flash.k2" || pin_attention == "flash.k4") &&
             flash_route_supports(p.attn, split_tile(pin_attention))) {
    flash(split_tile(pin_attention), pin_attention);
  } else if (pin_attention == "flash.g4" && flash_route_supports(p.attn, FlashTile::q64g4)) {
    flash(FlashTile::q64g4, pin_attention);
  } else {
    flash(FlashTile::automatic, "flash");
    if (pin_attention.empty() && routes.tune) {
      if (f16_tiles) flash(auto_is_q64 ? FlashTile::q16 : FlashTile::q64, auto_is_q64 ? "flash.q16" : "flash.q64");
      for (const char* id : {"flash.k2", "flash.k4"})
        if (split_worth && flash_route_supports(p.attn, split_tile(id))) flash(split_tile(id), id);
      // Head groups (4 heads of head_dim 8 per CTA): a candidate wherever the shape has them.
      if (flash_route_supports(p.attn, FlashTile::q64g4)) flash(FlashTile::q64g4, "flash.g4");
      if (p.cudnn) cudnn();
      if (p.materialized) materialized();
    }
  }
  if ((pin_attention == "flash.q64" || pin_attention == "flash.q16") && !f16_tiles)
    p.attention_note = "HK_ATTENTION: query tiles exist for the f16 kernel only";
  if ((pin_attention == "flash.k2" || pin_attention == "flash.k4") && !flash_route_supports(p.attn, split_tile(pin_attention)))
    p.attention_note = "HK_ATTENTION: key splits need the f16 kernel, head_dim 16-64 and thread-block clusters (sm_90+)";
  if (pin_attention == "flash.g4" && !flash_route_supports(p.attn, FlashTile::q64g4))
    p.attention_note = "HK_ATTENTION: head groups need the f16 kernel, head_dim 8 and H a multiple of 4";

  // Own kernels only: the post-attention steps have the fused chain alone (below), no cuBLASLt GEMM.
  if (!own_only)
  add(single_step_kernel<Ctx>("hk::gemm[cuda.cublaslt.bias_residual]", StepKind::out_proj,
                              [E, P](Ctx& c, const Step& s) {
                                // Dense layer 0: x = input + o Wo^T + bo lands in the residual
                                // buffer, so the caller's input is never modified.
                                const float* residual = s.layer == 0 && !P->packed ? c.x : E->buf.x;
                                E->run_gemm(*P, P->out, s.layer, E->buf.o, residual, E->buf.x, c.stream);
                              }),
      "gemm", gemm_src, gemm_inner(&p.out));
  add(single_step_kernel<Ctx>(ln, StepKind::ln2, [E, P, D](Ctx& c, const Step& s) {
        const DeviceLayerWeights& w = E->weights->layer(s.layer);
        layer_norm(E->buf.x, E->buf.h, E->act, w.ln2_w, w.ln2_b, P->T, D, E->eps, c.stream);
      }),
      "ln", ln_src);

  // bias + GELU: split (GEMM bias epilogue, exact erf pass) is the default; cuBLASLt's tanh
  // epilogue when pinned, or as a measured alternative that the numeric guard must accept.
  auto erf_split = [&] {
    add(single_step_kernel<Ctx>("hk::gemm[cuda.cublaslt.bias] + hk::gelu[cuda.erf]", StepKind::ffn_in,
                                [E, P](Ctx& c, const Step& s) {
                                  E->run_gemm(*P, P->ffn_in, s.layer, E->buf.h, nullptr, E->buf.f, c.stream);
                                  gelu_erf_inplace(E->buf.f, E->act, P->T * E->cfg.ffn_dim, c.stream);
                                }),
        "erf", {"backends/cuda/gemm_cublaslt", "backends/cuda/gelu"}, gemm_inner(&p.ffn_in));
  };
  auto tanh_epilogue = [&] {
    add(single_step_kernel<Ctx>("hk::gemm[cuda.cublaslt.bias_gelu_tanh]", StepKind::ffn_in,
                                [E, P](Ctx& c, const Step& s) {
                                  E->run_gemm(*P, P->ffn_in_tanh, s.layer, E->buf.h, nullptr, E->buf.f, c.stream);
                                }),
        "epilogue", gemm_src, gemm_inner(&p.ffn_in_tanh));
  };
  if (own_only) {
    // no ffn_in / ffn_out kernel of its own
  } else if (pin_gelu == "epilogue" && p.have_tanh) {
    tanh_epilogue();
  } else {
    erf_split();
    if (pin_gelu.empty() && p.have_tanh) tanh_epilogue();
  }
  if (!own_only)
  add(single_step_kernel<Ctx>("hk::gemm[cuda.cublaslt.bias_residual]", StepKind::ffn_out,
                              [E, P](Ctx& c, const Step& s) {
                                E->run_gemm(*P, P->ffn_out, s.layer, E->buf.f, E->buf.x, E->buf.x, c.stream);
                              }),
      "gemm", gemm_src, gemm_inner(&p.ffn_out));
  add(single_step_kernel<Ctx>(p.packed ? final_ln + " scatter" : final_ln, StepKind::final_ln,
                              [E, P, D](Ctx& c, const Step&) {
        if (P->packed) {
          // Packed rows back to [B, S, D]; the packing kernel already zeroed the padded rows.
          final_layer_norm_packed(E->buf.x, c.y, E->buf.row_dst, P->T, D, E->weights->final_w(),
                                  E->weights->final_b(), E->eps, c.stream);
          return;
        }
        final_layer_norm(E->buf.x, c.y, E->weights->final_w(), E->weights->final_b(), P->T, D, E->eps, c.lengths,
                         E->S, c.stream);
      }),
      "ln", ln_src);

  // LayerNorm launch shape: rows (warps) per block of the warp-per-row kernel, 4 by default; 8
  // and 2 as measured alternatives (more rows per block: fewer blocks to schedule; fewer: more
  // blocks resident per SM). Not for layer 0's ln1 of a padding-free plan (the packing kernel).
  if (routes.tune && std::string(row_norm_variant(D)) == "cuda.warp") {
    for (int rpb : {8, 2}) {
      Kernel<Ctx> k;
      k.name = ln + ".r" + std::to_string(rpb);
      k.covers = [P](const std::vector<Step>& st, size_t at, const Shape&) {
        const Step& s = st[at];
        if (s.kind == StepKind::ln2) return 1;
        return s.kind == StepKind::ln1 && !(P->packed && s.layer == 0) ? 1 : 0;
      };
      k.run = [E, P, D, rpb](Ctx& c, const Step* s, int) {
        const DeviceLayerWeights& w = E->weights->layer(s->layer);
        const bool first = s->kind == StepKind::ln1;
        const float* src = first && s->layer == 0 ? c.x : E->buf.x;
        layer_norm(src, E->buf.h, E->act, first ? w.ln1_w : w.ln2_w, first ? w.ln1_b : w.ln2_b, P->T, D, E->eps,
                   c.stream, rpb);
      };
      add(std::move(k), "ln.r" + std::to_string(rpb), ln_src);
    }
  }

  // ---- the whole forward in one kernel (small models): a plan-level candidate, decided after the
  // per-layer plan is chosen (decide_whole_model), never part of a segment (covers nothing).
#if HK_CUDA_HAVE_MODEL_PERSISTENT
  // A pinned step route (attention, GELU, GEMM layout / algorithm, QKV GEMM) is one the whole-model
  // kernels do not run: while one is pinned they are not candidates (HK_CHAINS=persistent still
  // pins them).
  if (persistent && step_pinned && pin_chains != "persistent") {
    p.whole_model_note = "persistent whole-model kernels: not candidates while a step route is pinned";
  } else if (persistent && precision == Precision::fast && pin_chains != "off" &&
             ((routes.tune && !pinned_chain_kernel()) || pin_chains == "persistent")) {
    // The kernels of model_persistent.cuh: a warp per row tile (tiles), or 16 warps per CTA
    // splitting every product by columns, a sequence on one CTA or on a cluster of 2, 4 or 8
    // (its row tiles dealt out; more CTAs than the sequence has row tiles would idle). Clusters
    // only while the batch's CTAs fit in about two waves: beyond, the sequences queue for SMs
    // and the split only adds the k / v exchange (measured on the H200: 4-CTA clusters 7.6x
    // slower than the per-layer plan at 10,000 sequences of 128).
    for (PersistentKernel kind : kPersistentKernels) {
      const int ctas = persistent_ctas_per_sequence(kind);
      if (ctas > (S + 15) / 16 || (ctas > 1 && int64_t(P->B) * ctas > 2 * int64_t(sm_count)) ||
          !model_persistent_supports(cfg, S, kind))
        continue;
      Kernel<Ctx> k;
      k.name = model_persistent_name(cfg, kind);
      k.covers = [](const std::vector<Step>&, size_t, const Shape&) { return 0; };
      k.run = [E, P, kind](Ctx& c, const Step*, int) {
        model_persistent_forward(*E->persistent, E->S, c.x, c.lengths, P->B, c.y, c.stream, kind);
      };
      p.whole_models.push_back(int(t.size()));
      add(std::move(k),
          kind == PersistentKernel::tiles ? std::string("persistent")
                                          : "persistent.cols" + (ctas > 1 ? ".c" + std::to_string(ctas) : std::string()),
          {"backends/cuda/model_persistent"});
    }
  } else if (!persistent) {
    p.whole_model_note = "persistent whole-model kernels: this model / S is outside their limits (or not built)";
  }
#else
  p.whole_model_note = "persistent whole-model kernels: not part of this build";
#endif

  // ---- fused chains: candidates against the single kernels they replace ----------------------
  // Own kernels only: the post-attention chain is the only cover of its steps, tuned or not.
  const bool chains =
      precision == Precision::fast && pin_chains != "off" && (routes.tune || own_only || pinned_chain_kernel());
  if (!chains) return;
#if HK_CUDA_HAVE_POST_ATTN_FUSED
  // The launch-configuration decision of a post-attention chain kernel (warps per CTA, o prefetch,
  // column split), its own measured decision, made once per plan on the first layer's chain (every
  // layer has the same shape). `list` / `chosen` / `decided` are the plan's fields of that kernel.
  using ConfigList = std::vector<PostAttnConfig> Plan::*;
  auto config_decision = [E, P](size_t self_index, ConfigList list, size_t Plan::*chosen, bool Plan::*decided,
                                std::string key_id) {
    return [E, P, self_index, list, chosen, decided, key_id](Ctx& c, const Step* first, int count) {
      const std::vector<PostAttnConfig>& configs = P->*list;
      if (P->*decided || configs.size() < 2) return;
      P->*decided = true;
      std::vector<tune::Candidate> cands;
      for (const PostAttnConfig& pc : configs)
        cands.push_back({"w" + std::to_string(pc.warps) + "p" + std::to_string(pc.prefetch) +
                             (pc.split > 0 ? "s" + std::to_string(pc.split) : std::string()) +
                             (pc.reg_weights ? "r" : "") + (pc.gelu_tanh ? "t" : "") + (pc.wgmma ? "g" : ""),
                         std::string("warps ") + (pc.warps > 0 ? std::to_string(pc.warps) : "auto") + ", prefetch " +
                             (pc.prefetch < 0 ? "auto" : std::to_string(pc.prefetch)) +
                             (pc.split > 0 ? ", " + std::to_string(pc.split) + " warps per row block" : std::string()) +
                             (pc.reg_weights ? ", weights in registers" : "") + (pc.gelu_tanh ? ", tanh GELU" : "") +
                             (pc.wgmma ? ", warpgroup MMA" : "")});
      const tune::TuneKey key = E->key(*P, key_id, {"backends/cuda/post_attn_fused"});
      const Kernel<Ctx>* self = &P->table[self_index];
      const size_t at = size_t(first - E->steps.data());
      const unsigned restore = restore_set(E->steps, at, count, P->packed);
      // What later steps read: a chain keeps its inner buffers (h of ln2, f) on chip.
      const unsigned live = live_outputs(E->steps, at, count, P->packed);
      const tune::ChooserOptions opt = E->chooser_options();
      char* snap = nullptr;
      char* ref = nullptr;
      if (!E->chooser->answered(key, cands, opt)) {
        const size_t snap_bytes = E->buf_bytes(*P, restore);
        snap = E->scratch(E->inner_scratch, snap_bytes + E->buf_bytes(*P, live), c.stream);
        ref = snap + snap_bytes;
        E->copy_set(*P, restore, c, snap, true);
      }
      tune::Probe probe;
      probe.run = [&](int i) {
        E->copy_set(*P, restore, c, snap, false);
        P->*chosen = size_t(i);
        self->run(c, first, count);
      };
      probe.keep_reference = [&] { E->copy_set(*P, live, c, ref, true); };
      probe.difference = [&] { return E->diff_set(*P, live, c, ref); };
      probe.time = [&](int i) {
        P->*chosen = size_t(i);
        return E->timer->time([&](cudaStream_t st) {
          Ctx cc = c;
          cc.stream = st;
          self->run(cc, first, count);
        }, E->pin_graph != "0");
      };
      const tune::Decision d = E->chooser->decide(key, cands, probe, opt);
      P->*chosen = size_t(d.chosen);
      if (snap) E->copy_set(*P, restore, c, snap, false);
      P->decisions.push_back(d);
    };
  };
  // The chain weights of a layer (out_proj .. ffn_out) into q.
  auto set_chain_weights = [](PostAttnParams& q, const DeviceLayerWeights& w) {
    q.w_o = static_cast<const __half*>(w.w_o);
    q.b_o = w.b_o;
    q.ln2_w = w.ln2_w;
    q.ln2_b = w.ln2_b;
    q.w_in = static_cast<const __half*>(w.w_in);
    q.b_in = static_cast<const __half*>(w.b_in);
    q.w_out = static_cast<const __half*>(w.w_out);
    q.b_out = w.b_out;
  };
  // The chain's parameters for the layer of `first` (`count` steps from out_proj): ending at the
  // next layer's ln1 (h_out), at its qkv_proj (qkv_out; h stays on chip), or at final_ln (y).
  auto chain_params = [E, P, set_chain_weights](const Ctx& c, const Step* first, int count) {
    const int l = first->layer;
    const StepKind last = first[count - 1].kind;
    const bool tail = last == StepKind::final_ln;
    const DeviceLayerWeights& w = E->weights->layer(l);
    PostAttnParams q;
    q.o = static_cast<const __half*>(E->buf.o);
    // Packed first layer (not the tail): the residual is read from the caller's padded input
    // through row_dst (packed row -> input row), so the pack kernel need not copy it.
    const bool gather = l == 0 && P->packed && !tail;
    q.x_in = l == 0 && (!P->packed || gather) ? c.x : E->buf.x;
    if (gather) q.x_rows = E->buf.row_dst;
    q.x_out = E->buf.x;
    set_chain_weights(q, w);
    if (tail) {
      q.ln_next_w = E->weights->final_w();
      q.ln_next_b = E->weights->final_b();
      q.y = c.y;
    } else {
      const DeviceLayerWeights& next = E->weights->layer(l + 1);
      q.ln_next_w = next.ln1_w;
      q.ln_next_b = next.ln1_b;
      if (last == StepKind::qkv_proj) {
        q.w_qkv = static_cast<const __half*>(next.w_qkv);
        q.b_qkv = static_cast<const __half*>(next.b_qkv);
        q.qkv_out = static_cast<__half*>(E->buf.qkv);
      } else {
        q.h_out = static_cast<__half*>(E->buf.h);
      }
    }
    q.lengths = c.lengths;
    if (P->packed) q.row_dst = E->buf.row_dst;  // tail: scatter; padded rows already zero
    q.S = E->S;
    q.tail = tail;
    q.rows = P->T;
    q.D = E->cfg.d_model;
    q.F = E->cfg.ffn_dim;
    q.eps = E->eps;
    return q;
  };
  // out_proj .. next layer's ln1 .. its qkv_proj: the column-split chain with Wqkv resident (few
  // rows, D = F = 64 or 128). A candidate after the chain below (the untuned default stays that
  // one), first when pinned (HK_CHAINS=post_attn_qkv).
  auto add_qkv_chain = [&] {
    if (!post_attn_qkv_supports(cfg.d_model, cfg.ffn_dim)) {
      p.chain_notes.push_back("post_attn_qkv: D " + std::to_string(cfg.d_model) + ", F " +
                              std::to_string(cfg.ffn_dim) + " not supported (D = F = 64 or 128)");
      return;
    }
    Kernel<Ctx> k;
    k.name = post_attn_qkv_name(cfg.d_model, cfg.ffn_dim);
    k.covers = [](const std::vector<Step>& st, size_t at, const Shape&) {
      return match_chain(st, at, {StepKind::out_proj, StepKind::ln2, StepKind::ffn_in, StepKind::ffn_out,
                                  StepKind::ln1, StepKind::qkv_proj});
    };
    k.run = [P, chain_params](Ctx& c, const Step* first, int count) {
      post_attn_fused(chain_params(c, first, count), c.stream, P->post_attn_qkv_configs[P->post_attn_qkv_config]);
    };
    p.post_attn_qkv_configs = post_attn_qkv_candidates(cfg.d_model, cfg.ffn_dim, p.T);
    const size_t self_index = t.size();
    add(std::move(k), "post_attn_qkv", {"backends/cuda/post_attn_fused"},
        config_decision(self_index, &Plan::post_attn_qkv_configs, &Plan::post_attn_qkv_config,
                        &Plan::post_attn_qkv_decided, "post_attn_qkv.config"));
  };
  if (pin_chains == "post_attn_qkv") add_qkv_chain();
  // out_proj .. next layer's ln1 (or .. final_ln in the last layer): one kernel per layer.
  if (post_attn_fused_supports(cfg.d_model, cfg.ffn_dim)) {
    Kernel<Ctx> k;
    k.name = post_attn_fused_name(cfg.d_model, cfg.ffn_dim);
    k.covers = [](const std::vector<Step>& st, size_t at, const Shape&) {
      const int n = match_chain(st, at, {StepKind::out_proj, StepKind::ln2, StepKind::ffn_in, StepKind::ffn_out,
                                         StepKind::ln1});
      return n ? n
               : match_chain(st, at, {StepKind::out_proj, StepKind::ln2, StepKind::ffn_in, StepKind::ffn_out,
                                      StepKind::final_ln});
    };
    k.run = [P, chain_params](Ctx& c, const Step* first, int count) {
      const PostAttnParams q = chain_params(c, first, count);
      if (P->post_attn_configs.empty()) {
        post_attn_fused(q, c.stream);
      } else {
        post_attn_fused(q, c.stream, P->post_attn_configs[P->post_attn_config]);
      }
    };
    // The tanh-form GELU only where the erf-form route could also be swapped for cuBLASLt's tanh
    // epilogue: fast precision (chains run only there) and HK_GELU not pinned to erf.
    p.post_attn_configs = post_attn_fused_candidates(cfg.d_model, cfg.ffn_dim, p.T, pin_gelu != "erf");
    const size_t self_index = t.size();
    // Its own key when no tanh-GELU entry is offered (HK_GELU=erf, or a kernel without one):
    // a winner from a list without them must not stand for a list with them.
    bool tanh_offered = false;
    for (const PostAttnConfig& pc : p.post_attn_configs) tanh_offered = tanh_offered || pc.gelu_tanh != 0;
    auto inner = config_decision(self_index, &Plan::post_attn_configs, &Plan::post_attn_config,
                                 &Plan::post_attn_decided, tanh_offered ? "post_attn.config" : "post_attn.config.no_tanh");
    add(std::move(k), "post_attn", {"backends/cuda/post_attn_fused"}, inner);
    if (pin_chains != "post_attn_qkv") add_qkv_chain();
    // attention .. out_proj .. the next layer's qkv_proj (or .. its ln1, or .. final_ln): the
    // column-split chain with the layer's attention in front, so o never leaves the chip and one
    // launch per layer replaces two. Dense plans with few rows (its clusters take one sequence
    // each; the row-per-warp chains win beyond ~16 row blocks per SM), S a multiple of 16 up to 128.
    const int64_t row_blocks = (p.T + 15) / 16;
    if (!pin_attention.empty()) {
      p.chain_notes.push_back("attention chain: not offered while the attention route is pinned (HK_ATTENTION)");
    } else if (p.packed) {
      p.chain_notes.push_back("attention chain: the padding-free layout is not served (dense only)");
    } else if (row_blocks > 16 * int64_t(sm_count)) {
      p.chain_notes.push_back("attention chain: not offered beyond 16 row blocks per SM");
    } else if (!post_attn_attention_supports(cfg.d_model, cfg.ffn_dim, cfg.n_heads, S)) {
      p.chain_notes.push_back("attention chain: (D, F, H, S) outside its limits (D = F = 128 with head_dim 32 or 64 "
                              "with 16; S a multiple of 16 up to 128; compute capability 9.0+)");
    } else {
      // The chain's parameters from out_proj (`count` steps) with the attention in front, reading
      // this layer's q | k | v from the qkv buffer.
      auto attention_params = [E, P, chain_params](const Ctx& c, const Step* out_proj, int count) {
        PostAttnParams q = chain_params(c, out_proj, count);
        q.o = nullptr;
        q.qkv_in = static_cast<const __half*>(E->buf.qkv);
        q.H = E->cfg.n_heads;
        q.causal = E->cfg.causal;
        q.attn_scale = P->attn.scale;
        return q;
      };
      for (const bool qkv : {true, false}) {
        Kernel<Ctx> k;
        k.name = post_attn_attention_name(cfg.d_model, cfg.ffn_dim, cfg.n_heads, qkv);
        k.covers = [qkv](const std::vector<Step>& st, size_t at, const Shape&) {
          if (qkv) {
            return match_chain(st, at, {StepKind::attention, StepKind::out_proj, StepKind::ln2, StepKind::ffn_in,
                                        StepKind::ffn_out, StepKind::ln1, StepKind::qkv_proj});
          }
          const int n = match_chain(st, at, {StepKind::attention, StepKind::out_proj, StepKind::ln2, StepKind::ffn_in,
                                             StepKind::ffn_out, StepKind::ln1});
          return n ? n
                   : match_chain(st, at, {StepKind::attention, StepKind::out_proj, StepKind::ln2, StepKind::ffn_in,
                                          StepKind::ffn_out, StepKind::final_ln});
        };
        k.run = [attention_params](Ctx& c, const Step* first, int count) {
          post_attn_fused(attention_params(c, first + 1, count - 1), c.stream);
        };
        add(std::move(k), qkv ? "attn_post_attn_qkv" : "attn_post_attn", {"backends/cuda/post_attn_fused"});
      }
      // ln1 .. qkv_proj .. attention .. the next layer's qkv_proj: the same with the layer's own
      // LayerNorm and QKV projection in front (a layer whose ln1 is a step of its own: layer 0).
      Kernel<Ctx> k;
      k.name = post_attn_attention_name(cfg.d_model, cfg.ffn_dim, cfg.n_heads, true, true);
      k.covers = [](const std::vector<Step>& st, size_t at, const Shape&) {
        return match_chain(st, at, {StepKind::ln1, StepKind::qkv_proj, StepKind::attention, StepKind::out_proj,
                                    StepKind::ln2, StepKind::ffn_in, StepKind::ffn_out, StepKind::ln1,
                                    StepKind::qkv_proj});
      };
      k.run = [E, attention_params](Ctx& c, const Step* first, int count) {
        PostAttnParams q = attention_params(c, first + 3, count - 3);
        const DeviceLayerWeights& w = E->weights->layer(first->layer);
        q.qkv_front = static_cast<__half*>(E->buf.qkv);
        q.w_qkv_front = static_cast<const __half*>(w.w_qkv);
        q.b_qkv_front = static_cast<const __half*>(w.b_qkv);
        q.ln_front_w = w.ln1_w;
        q.ln_front_b = w.ln1_b;
        post_attn_fused(q, c.stream);
      };
      add(std::move(k), "attn_front", {"backends/cuda/post_attn_fused"});
      // The whole forward in one kernel: these chains layer after layer on the same clusters, the
      // residual in registers (post_attn_model). A plan-level candidate as the persistent kernels.
      if (!post_attn_model_supports(cfg.d_model, cfg.ffn_dim, cfg.n_heads, S, cfg.n_layers)) {
        p.chain_notes.push_back("attention model: L = " + std::to_string(cfg.n_layers) + " outside 2.." +
                                std::to_string(kPostAttnModelMaxLayers) +
                                ", or its shared memory (the chain's plus the staged weights) does not fit");
      } else if (step_pinned && pin_chains != "attention_model") {
        p.chain_notes.push_back("attention model: not a candidate while a step route is pinned");
      } else if ((routes.tune && !pinned_chain_kernel()) || pin_chains == "attention_model") {
        Kernel<Ctx> km;
        km.name = post_attn_model_name(cfg.d_model, cfg.ffn_dim, cfg.n_heads);
        km.covers = [](const std::vector<Step>&, size_t, const Shape&) { return 0; };
        km.run = [E, P, set_chain_weights](Ctx& c, const Step*, int) {
          PostAttnModelParams m;
          m.L = E->cfg.n_layers;
          for (int l = 0; l < m.L; ++l) {
            const DeviceLayerWeights& w = E->weights->layer(l);
            PostAttnParams& q = m.layer[l];
            q.x_in = c.x;
            q.x_out = E->buf.x;  // neither read nor written (the residual stays on chip)
            set_chain_weights(q, w);
            if (l + 1 == m.L) {
              q.ln_next_w = E->weights->final_w();
              q.ln_next_b = E->weights->final_b();
              q.y = c.y;
              q.tail = true;
            } else {
              const DeviceLayerWeights& next = E->weights->layer(l + 1);
              q.ln_next_w = next.ln1_w;
              q.ln_next_b = next.ln1_b;
              q.w_qkv = static_cast<const __half*>(next.w_qkv);
              q.b_qkv = static_cast<const __half*>(next.b_qkv);
              q.qkv_out = static_cast<__half*>(E->buf.qkv);
            }
            if (l == 0) {
              q.qkv_front = static_cast<__half*>(E->buf.qkv);
              q.w_qkv_front = static_cast<const __half*>(w.w_qkv);
              q.b_qkv_front = static_cast<const __half*>(w.b_qkv);
              q.ln_front_w = w.ln1_w;
              q.ln_front_b = w.ln1_b;
            }
            q.qkv_in = static_cast<const __half*>(E->buf.qkv);
            q.H = E->cfg.n_heads;
            q.causal = E->cfg.causal;
            q.attn_scale = P->attn.scale;
            q.lengths = c.lengths;
            q.S = E->S;
            q.rows = int64_t(P->B) * E->S;
            q.D = E->cfg.d_model;
            q.F = E->cfg.ffn_dim;
            q.eps = E->eps;
          }
          post_attn_model(m, c.stream);
        };
        p.whole_models.push_back(int(t.size()));
        add(std::move(km), "attention_model", {"backends/cuda/post_attn_fused"});
      }
    }
  } else {
    p.chain_notes.push_back("post_attn: D " + std::to_string(cfg.d_model) + ", F " + std::to_string(cfg.ffn_dim) +
                            " not supported");
  }
#else
  p.chain_notes.push_back("post_attn: not part of this build");
#endif
#if HK_CUDA_HAVE_QKV_ATTENTION_FUSED
  // qkv_proj + attention for short sequences; its program map is its own measured decision.
  if (pin_attention.empty()) {
    QkvAttentionParams& q = p.qkv_attention;
    q.h = static_cast<const __half*>(buf.h);
    q.w_qkv = static_cast<const __half*>(weights->layer(0).w_qkv);
    q.b_qkv = static_cast<const __half*>(weights->layer(0).b_qkv);
    q.o = static_cast<__half*>(buf.o);
    q.lengths = buf.lengths_full;
    q.seq_start = p.packed ? buf.seq_start : nullptr;
    q.B = p.B;
    q.S = S;
    q.D = cfg.d_model;
    q.H = cfg.n_heads;
    q.head_dim = cfg.head_dim();
    q.scale = p.attn.scale;
    q.causal = cfg.causal;
    p.qkv_attention_maps = qkv_attention_fused_candidates(q);
    if (!p.qkv_attention_maps.empty()) {
      Kernel<Ctx> k;
      k.name = qkv_attention_fused_name(q, p.qkv_attention_maps[0]);
      k.covers = [](const std::vector<Step>& st, size_t at, const Shape&) {
        return match_chain(st, at, {StepKind::qkv_proj, StepKind::attention});
      };
      k.run = [E, P](Ctx& c, const Step* first, int) {
        QkvAttentionParams q = P->qkv_attention;
        q.w_qkv = static_cast<const __half*>(E->weights->layer(first->layer).w_qkv);
        q.b_qkv = static_cast<const __half*>(E->weights->layer(first->layer).b_qkv);
        q.lengths = c.lengths;
        qkv_attention_fused(q, P->qkv_attention_maps[P->qkv_attention_map], c.stream);
      };
      const size_t self_index = t.size();
      auto inner = [E, P, self_index](Ctx& c, const Step* first, int count) {
        if (P->qkv_attention_decided) return;
        P->qkv_attention_decided = true;
        std::vector<tune::Candidate> cands;
        for (const QkvAttentionMap& mp : P->qkv_attention_maps)
          cands.push_back({"q" + std::to_string(mp.q_split) + "h" + std::to_string(mp.heads_per_cta) + "b" +
                               std::to_string(mp.seqs_per_cta),
                           qkv_attention_fused_name(P->qkv_attention, mp)});
        const tune::TuneKey key = E->key(*P, "qkv_attention.map", {"backends/cuda/qkv_attention_fused"});
        const Kernel<Ctx>* self = &P->table[self_index];
        const unsigned live = kO;  // reads h (not written), writes o only: nothing to restore
        const tune::ChooserOptions opt = E->chooser_options();
        char* ref = E->chooser->answered(key, cands, opt)
                        ? nullptr
                        : E->scratch(E->inner_scratch, E->buf_bytes(*P, live), c.stream);
        tune::Probe probe;
        probe.run = [&](int i) {
          P->qkv_attention_map = size_t(i);
          self->run(c, first, count);
        };
        probe.keep_reference = [&] { E->copy_set(*P, live, c, ref, true); };
        probe.difference = [&] { return E->diff_set(*P, live, c, ref); };
        probe.time = [&](int i) {
          P->qkv_attention_map = size_t(i);
          return E->timer->time([&](cudaStream_t s) {
            Ctx cc = c;
            cc.stream = s;
            self->run(cc, first, count);
          }, E->pin_graph != "0");
        };
        const tune::Decision d = E->chooser->decide(key, cands, probe, opt);
        P->qkv_attention_map = size_t(d.chosen);
        P->decisions.push_back(d);
      };
      add(std::move(k), "qkv_attention", {"backends/cuda/qkv_attention_fused"}, inner);
    } else {
      p.chain_notes.push_back("qkv_attention: no supported program map for this shape");
    }
  }
#else
  p.chain_notes.push_back("qkv_attention: not part of this build");
#endif
}

// ---- measured dispatch ------------------------------------------------------------------------

tune::ChooserOptions CudaEngine::Impl::chooser_options(const std::string& pin) const {
  tune::ChooserOptions o;
  o.tune = routes.tune;
  o.pin = pin;
  o.remeasure = routes.tune_remeasure;
  return o;
}

tune::TuneKey CudaEngine::Impl::key(const Plan& p, const std::string& op, const std::vector<std::string>& sources) const {
  std::vector<std::string> all = kEngineSources;
  all.insert(all.end(), sources.begin(), sources.end());
  // Own kernels only narrows candidate sets (no cuBLASLt, no cuDNN): its answers get their own keys.
  return {own_only ? op + ".own" : op, p.shape_text, act == DType::f16 ? "f16" : "f32", identity,
          tune::fingerprint(all)};
}

CudaEngine::Impl::BufView CudaEngine::Impl::view(const Plan&, unsigned bit, const Ctx& c) const {
  switch (bit) {
    case kX: return {buf.x, DType::f32, cfg.d_model};
    case kH: return {buf.h, act, cfg.d_model};
    case kQKV: return {buf.qkv, act, 3 * cfg.d_model};
    case kO: return {buf.o, act, cfg.d_model};
    case kF: return {buf.f, act, cfg.ffn_dim};
    default: return {c.y, DType::f32, cfg.d_model};
  }
}

size_t CudaEngine::Impl::buf_bytes(const Plan& p, unsigned set) const {
  size_t n = 0;
  for (unsigned b : kAllBufs) {
    if (!(set & b)) continue;
    const BufView v = view(p, b, Ctx{});
    const size_t bytes = size_t(rows_of(p, b)) * size_t(v.cols) * (v.type == DType::f16 ? 2 : 4);
    n += (bytes + 255) / 256 * 256;
  }
  return n;
}

void CudaEngine::Impl::copy_set(const Plan& p, unsigned set, const Ctx& c, char* region, bool to_scratch) const {
  size_t off = 0;
  for (unsigned b : kAllBufs) {
    if (!(set & b)) continue;
    const BufView v = view(p, b, c);
    const size_t bytes = size_t(rows_of(p, b)) * size_t(v.cols) * (v.type == DType::f16 ? 2 : 4);
    if (to_scratch) {
      HK_CUDA_CHECK(cudaMemcpyAsync(region + off, v.ptr, bytes, cudaMemcpyDeviceToDevice, c.stream));
    } else {
      HK_CUDA_CHECK(cudaMemcpyAsync(v.ptr, region + off, bytes, cudaMemcpyDeviceToDevice, c.stream));
    }
    off += (bytes + 255) / 256 * 256;
  }
}

double CudaEngine::Impl::diff_set(const Plan& p, unsigned set, const Ctx& c, const char* ref) {
  if (!guard_result.get()) guard_result = DeviceBuffer(sizeof(float));
  float* result = static_cast<float*>(guard_result.get());
  double m = 0;
  size_t off = 0;
  for (unsigned b : kAllBufs) {
    if (!(set & b)) continue;
    const BufView v = view(p, b, c);
    const size_t bytes = size_t(rows_of(p, b)) * size_t(v.cols) * (v.type == DType::f16 ? 2 : 4);
    // Rows the model zeroes (padding) are skipped: routes may legitimately differ there. Packed
    // buffers hold valid tokens (and zero-fed tail rows) only; y is always [B, S, D].
    const int32_t* len = p.packed && b != kY ? nullptr : c.lengths;
    m = std::max(m, max_abs_diff(v.ptr, ref + off, v.type, rows_of(p, b), v.cols, v.cols, len, S, result, c.stream));
    off += (bytes + 255) / 256 * 256;
  }
  return m;
}

// At least `bytes` of `b`, regrown (after the stream's pending copies) when too small.
char* CudaEngine::Impl::scratch(DeviceBuffer& b, size_t bytes, cudaStream_t s) {
  if (b.bytes() < bytes) {
    HK_CUDA_CHECK(cudaStreamSynchronize(s));
    b = DeviceBuffer(bytes);
  }
  return static_cast<char*>(b.get());
}

void CudaEngine::Impl::decide_gemm(Plan& p, GemmNode& g, const Step& s, const Ctx& c) {
  if (g.decided) return;
  const bool mma_only = !g.mma.empty() && pin_qkv_gemm == "mma";
  if (!mma_only) g.ensure();  // the own kernel alone needs no cuBLASLt descriptor
  std::vector<tune::Candidate> cands;
  std::vector<std::pair<bool, int>> what;  // (kn, algorithm)
  for (bool kn : {false, true}) {
    LtGemm* m = kn ? g.kn.get() : g.nk.get();
    if (!m || mma_only) continue;
    m->set_extra({});  // the heuristic's candidates only (a decision that threw may have added others)
    const int n = int(m->candidates().size());
    for (int i = 0; i < n; ++i) {
      if (!pin_algo.empty() && std::to_string(i) != pin_algo && !(i == 0 && std::stoi(pin_algo) >= n)) continue;
      cands.push_back({std::string(kn ? "kn." : "nk.") + std::to_string(i),
                       std::string(kn ? "[K,N] " : "[N,K] ") + m->describe(i)});
      what.emplace_back(kn, i);
    }
  }
  // The own kernel's tile widths after cuBLASLt's algorithms (encoded as -1 - index).
  const GemmShape& gs = g.shape;
  for (size_t j = 0; j < g.mma.size(); ++j) {
    cands.push_back({"mma.bn" + std::to_string(g.mma[j].bn),
                     small_gemm_name(gs.rows, gs.n, gs.k, g.mma[j]) + " (64 x " + std::to_string(g.mma[j].bn) +
                         " tiles, programmatic launch)"});
    what.emplace_back(false, -1 - int(j));
  }
  auto apply = [&](size_t i) {
    if (what[i].second < 0) {
      g.use_mma = -1 - what[i].second;
      return;
    }
    g.use_mma = -1;
    g.use_kn = what[i].first;
    g.active().select(what[i].second);
  };
  std::vector<std::string> sources = {"backends/cuda/gemm_cublaslt"};
  if (!g.mma.empty()) sources.push_back("backends/cuda/gemm_small");
  // A pinned restriction (own kernel only, one weight layout, one algorithm index) decides among
  // fewer candidates: its own key, so that its answer is never taken for the unrestricted
  // decision (the cache only checks that a stored winner is among the candidates).
  std::string op = std::string("gemm.") + g.step + "." + to_string(gs.epilogue);
  if (mma_only) op += ".mma_only";
  if (!mma_only && !pin_layout.empty()) op += ".layout_" + pin_layout;
  if (!mma_only && !pin_algo.empty()) op += ".algo_" + pin_algo;
  // out_proj of layer 0 adds the caller's x; every other residual GEMM updates x in place, so
  // each candidate must start from the same x.
  const float* residual = g.which == GemmWhich::out ? (s.layer == 0 && !p.packed ? c.x : buf.x)
                          : g.which == GemmWhich::outf ? buf.x
                                                       : nullptr;
  const unsigned out_bit = g.which == GemmWhich::qkv ? kQKV : g.which == GemmWhich::in ? kF : kX;
  const unsigned restore = residual == buf.x ? unsigned(kX) : 0u;
  // One launch of this node for step s (whatever layer s is: its buffers and weights).
  const void* in = g.which == GemmWhich::out ? buf.o : g.which == GemmWhich::outf ? buf.f : buf.h;
  void* out = g.which == GemmWhich::qkv ? buf.qkv : g.which == GemmWhich::in ? buf.f : static_cast<void*>(buf.x);
  auto launch = [&](cudaStream_t st) { run_gemm(p, g, s.layer, in, residual, out, st); };
  // Decides among `cands` (applied through `what`) under key `op`; the winner is applied.
  auto decide = [&](const std::string& op_key, const tune::ChooserOptions& opt) {
    const tune::TuneKey k = key(p, op_key, sources);
    char* snap = nullptr;
    char* ref = nullptr;
    if (!chooser->answered(k, cands, opt)) {
      const size_t snap_bytes = buf_bytes(p, restore), ref_bytes = buf_bytes(p, out_bit);
      snap = scratch(inner_scratch, snap_bytes + ref_bytes, c.stream);
      ref = snap + snap_bytes;
      if (restore) copy_set(p, restore, c, snap, true);
    }
    tune::Probe probe;
    probe.run = [&](int i) {
      if (restore) copy_set(p, restore, c, snap, false);
      apply(size_t(i));
      launch(c.stream);
    };
    probe.keep_reference = [&] { copy_set(p, out_bit, c, ref, true); };
    probe.difference = [&] { return diff_set(p, out_bit, c, ref); };
    probe.time = [&](int i) {
      apply(size_t(i));
      return timer->time(launch, pin_graph != "0");
    };
    const tune::Decision d = chooser->decide(k, cands, probe, opt);
    apply(size_t(d.chosen));
    if (restore && snap) copy_set(p, restore, c, snap, false);
    return d;
  };
  const tune::Decision d = decide(op, chooser_options());

  // HK_GEMM_NEIGHBOURS: a second decision among the winner and the configurations around the
  // heuristic's candidates of the winner's weight layout (LtGemm::neighbours): cluster shapes of
  // every candidate, and with `tiles` every tile id of the first three and of the winner.
  // Measured only: untuned, pinned to an algorithm, or won by the own kernel, there is none.
  const std::pair<bool, int> first = what[size_t(d.chosen)];
  if (pin_gemm_neighbours.empty() || pin_gemm_neighbours == "off" || !routes.tune || !pin_algo.empty() ||
      first.second < 0) {
    p.decisions.push_back(d);
    g.decided = true;  // only once applied: a decision that threw is made again (never a cuBLASLt fallback)
    return;
  }
  LtGemm& m = g.active();
  const bool tiles = pin_gemm_neighbours == "tiles";
  const std::string layout = first.first ? "kn." : "nk.";
  std::vector<bool> with_tiles(size_t(m.base_count()), false);
  for (int b = 0; b < m.base_count(); ++b) with_tiles[size_t(b)] = tiles && (b < 3 || b == first.second);
  std::vector<cublasLtMatmulAlgo_t> extra;
  std::vector<std::string> ids;
  for (const LtGemm::Neighbour& n : m.neighbourhood(with_tiles)) {
    extra.push_back(n.algo);
    ids.push_back(layout + std::to_string(n.base) + "." + algo_fields(n.algo));
  }
  const std::vector<int> index = m.set_extra(extra);
  cands = {d.winner()};
  what = {first};
  for (size_t j = 0; j < extra.size(); ++j) {
    if (index[j] < 0) continue;
    cands.push_back({ids[j], std::string(first.first ? "[K,N] " : "[N,K] ") + m.describe(index[j])});
    what.emplace_back(first.first, index[j]);
  }
  if (cands.size() == 1) {  // nothing around the candidates that this problem accepts
    m.set_extra({});
    p.decisions.push_back(d);
    g.decided = true;
    return;
  }
  // A neighbour must beat the winner by 2%: among hundreds of single timings the fastest is
  // partly the luckiest, and the heuristic's own configuration is the safer one at equal speed.
  tune::ChooserOptions opt = chooser_options();
  opt.margin = std::max(opt.margin, 0.02);
  const double target = timer->target_ms;
  timer->target_ms = 1.0;  // ~60-100 launches per configuration of these 7-50 us GEMMs
  try {
    const tune::Decision n = decide(op + ".neighbours_" + pin_gemm_neighbours + ".from_" + d.winner().id, opt);
    timer->target_ms = target;
    p.decisions.push_back(d);  // both once both are made: a retry after a throw lists neither twice
    p.decisions.push_back(n);
  } catch (...) {
    timer->target_ms = target;
    throw;
  }
  g.decided = true;
}

void CudaEngine::Impl::run_inner(Plan& p, const PlannedKernel<Ctx>& k, Ctx& c) {
  const KernelMeta& m = p.meta[p.index_of(k.kernel)];
  if (m.inner) m.inner(c, &steps[k.first], k.count);
}

// HK_CHAINS=post_attn_qkv: the option of `seg` that starts with that chain, else -1.
// HK_CHAINS=attention_chain: the option starting with the attention chain that also runs the layer's
// ln1 and QKV projection, else the one with the next layer's QKV projection, else the one ending at
// ln1 / final_ln, else -1.
int CudaEngine::Impl::pinned_option(const Plan& p, const tune::Segment<Ctx>& seg) const {
  if (!pinned_chain_kernel() || pin_chains == "attention_model") return -1;  // the latter: a whole-model kernel
  const std::vector<std::string> ids = pin_chains == "post_attn_qkv"
                                           ? std::vector<std::string>{"post_attn_qkv"}
                                           : std::vector<std::string>{"attn_front", "attn_post_attn_qkv", "attn_post_attn"};
  for (const std::string& id : ids)
    for (size_t i = 0; i < seg.options.size(); ++i)
      if (p.meta[p.index_of(seg.options[i].kernels.front().kernel)].id == id) return int(i);
  return -1;
}

int CudaEngine::Impl::choose_segment(Plan& p, const tune::Segment<Ctx>& seg, const Ctx& c0) {
  if (const int pinned = pinned_option(p, seg); pinned >= 0) return pinned;
  Ctx c = c0;
  std::vector<tune::Candidate> cands;
  std::vector<std::string> sources;
  for (const auto& o : seg.options) {
    std::string id;
    for (const auto& k : o.kernels) {
      const KernelMeta& m = p.meta[p.index_of(k.kernel)];
      id += (id.empty() ? "" : "+") + m.id;
      sources.insert(sources.end(), m.sources.begin(), m.sources.end());
    }
    cands.push_back({id, o.name});
  }
  const std::string label = tune::segment_label(steps, seg.first, seg.count);
  const tune::TuneKey k = key(p, "plan." + label, sources);
  const tune::ChooserOptions opt = chooser_options();
  if (chooser->answered(k, cands, opt)) {
    const tune::Decision d = chooser->decide(k, cands, tune::Probe{}, opt);
    if (d.source != tune::Source::memo && d.source != tune::Source::single) p.decisions.push_back(d);
    return d.chosen;
  }
  // Measurement: every option starts from the segment's incoming state; the guard compares the
  // buffers later steps read.
  const unsigned restore = restore_set(steps, seg.first, seg.count, p.packed);
  const unsigned live = live_outputs(steps, seg.first, seg.count, p.packed);
  const size_t snap_bytes = buf_bytes(p, restore), ref_bytes = buf_bytes(p, live);
  char* snap = scratch(seg_scratch, snap_bytes + ref_bytes, c.stream);
  char* ref = snap + snap_bytes;
  copy_set(p, restore, c, snap, true);
  auto run_option = [&](size_t i, Ctx& cc) {
    for (const auto& kk : seg.options[i].kernels) kk.kernel->run(cc, &steps[kk.first], kk.count);
  };
  // The options' own decisions (GEMM algorithms, chain maps) first, each on the data its
  // predecessors in the option produce, so that options are compared at their best.
  for (size_t i = 0; i < seg.options.size(); ++i) {
    copy_set(p, restore, c, snap, false);
    for (const auto& kk : seg.options[i].kernels) {
      run_inner(p, kk, c);
      kk.kernel->run(c, &steps[kk.first], kk.count);
    }
  }
  tune::Probe probe;
  probe.run = [&](int i) {
    copy_set(p, restore, c, snap, false);
    run_option(size_t(i), c);
  };
  probe.keep_reference = [&] { copy_set(p, live, c, ref, true); };
  probe.difference = [&] { return diff_set(p, live, c, ref); };
  probe.time = [&](int i) {
    return timer->time([&](cudaStream_t s) {
      Ctx cc = c;
      cc.stream = s;
      run_option(size_t(i), cc);
    }, pin_graph != "0");
  };
  const tune::Decision d = chooser->decide(k, cands, probe, opt);
  copy_set(p, restore, c, snap, false);
  p.decisions.push_back(d);
  return d.chosen;
}

// Once the kernels of a plan are final: whether the pack kernel must still copy the residual
// (Plan::pack_x): not when the first layer's out_proj runs in the fused chain (it gathers).
void CudaEngine::Impl::finish_plan(Plan& p) const {
  if (!p.packed) return;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].kind != StepKind::out_proj || steps[i].layer != 0) continue;
    for (const auto& k : p.kernels) {
      if (size_t(k.first) > i || size_t(k.first + k.count) <= i) continue;
      const bool tail = steps[size_t(k.first + k.count) - 1].kind == StepKind::final_ln;
      const std::string& id = p.meta[p.index_of(k.kernel)].id;
      p.pack_x = !((id == "post_attn" || id == "post_attn_qkv") && !tail);
    }
  }
}

void CudaEngine::Impl::choose_plan(Plan& p, const Ctx& c0) {
  Ctx c = c0;
  const bool measure = routes.tune;  // untuned: nothing runs here, the choices need no data
  p.kernels = tune::make_plan_by_choice(
      steps, p.table, p.shape, [&](const tune::Segment<Ctx>& seg) { return choose_segment(p, seg, c); },
      [&](const PlannedKernel<Ctx>& k) {
        run_inner(p, k, c);
        if (measure) k.kernel->run(c, &steps[k.first], k.count);
      });
  p.planned = true;
}

// The plan again, every segment whose label is in `forced` taking that option (the others as
// decided: memoised, or measured where a forced option uncovers a position the first pass never
// chose). Each committed kernel runs, as in choose_plan, so later choices see the data they would.
std::vector<PlannedKernel<Ctx>> CudaEngine::Impl::replan_forcing(Plan& p, const Ctx& c0,
                                                                  const std::map<std::string, int>& forced) {
  Ctx c = c0;
  return tune::make_plan_by_choice(
      steps, p.table, p.shape,
      [&](const tune::Segment<Ctx>& seg) {
        const auto f = forced.find(tune::segment_label(steps, seg.first, seg.count));
        if (f != forced.end() && size_t(f->second) < seg.options.size()) return f->second;
        return choose_segment(p, seg, c);
      },
      [&](const PlannedKernel<Ctx>& k) {
        run_inner(p, k, c);
        k.kernel->run(c, &steps[k.first], k.count);
      });
}

// A chain kernel and the single kernels it replaces are compared per segment, each option timed
// alone between events (choose_segment). In the forward a chain also removes kernel boundaries
// (under programmatic dependent launch a kernel stages its weights while its predecessor ends;
// cuBLASLt's GEMMs never overlap), which timing alone cannot show. So for every segment label
// whose options include a chain, the whole forward is timed with each option at every segment of
// that label (the option the plan chose first: it wins ties), and the faster plan stays
// (key "plan.forward.<label>"). With y == x the caller's input is put back before every re-plan.
//
// An option that leaves a chain out uncovers shorter segments with chain options of their own
// (the first layer's ln1 + QKV + attention chain against ln1, then QKV + attention, then the
// post-attention chain): those segments are decided in that option's forward before the options
// are compared (keys "plan.forward.<label>=<option>.<inner label>"), so that the option is
// compared at its best, not with the shorter segments as timed alone.
void CudaEngine::Impl::decide_chains_in_forward(Plan& p, const Ctx& c) {
  struct Label {
    std::string text;
    std::vector<std::string> ids;  // per option
    std::vector<std::string> sources;  // of every option's kernels and of the plan as chosen
    int chosen = 0;
    int count = 0;  // steps of the segment
  };
  using Kernels = std::vector<PlannedKernel<Ctx>>;
  using Forced = std::map<std::string, int>;
  // The labels of the segments starting at a plan's kernels that have two options or more and no
  // pin, each once, with the plan's option.
  auto collect = [&](const Kernels& kernels) {
    std::vector<std::string> plan_sources;
    for (const auto& k : kernels) {
      const KernelMeta& m = p.meta[p.index_of(k.kernel)];
      plan_sources.insert(plan_sources.end(), m.sources.begin(), m.sources.end());
    }
    std::vector<Label> labels;
    for (const auto& k : kernels) {
      const tune::Segment<Ctx> seg = tune::segment_options(steps, p.table, p.shape, size_t(k.first));
      if (seg.count < 2 || seg.options.size() < 2 || pinned_option(p, seg) >= 0) continue;
      Label l;
      l.text = tune::segment_label(steps, seg.first, seg.count);
      l.count = seg.count;
      bool seen = false;
      for (const Label& o : labels) seen = seen || o.text == l.text;
      if (seen) continue;
      l.sources = plan_sources;
      for (size_t i = 0; i < seg.options.size(); ++i) {
        std::string id;
        for (const auto& kk : seg.options[i].kernels) {
          const KernelMeta& m = p.meta[p.index_of(kk.kernel)];
          id += (id.empty() ? "" : "+") + m.id;
          l.sources.insert(l.sources.end(), m.sources.begin(), m.sources.end());
        }
        l.ids.push_back(id);
        const PlannedKernel<Ctx>& head = seg.options[i].kernels.front();
        if (head.kernel == k.kernel && head.count == k.count) l.chosen = int(i);
      }
      std::sort(l.sources.begin(), l.sources.end());
      l.sources.erase(std::unique(l.sources.begin(), l.sources.end()), l.sources.end());
      labels.push_back(std::move(l));
    }
    return labels;
  };
  std::vector<Label> labels = collect(p.kernels);
  // The longest segments first: a chain that starts inside a shorter label's segment (the
  // attention chain inside QKV + attention's) is only a segment of the plan while that shorter
  // label's chain is not forced, so it is compared before; the shorter labels are then decided
  // with it in place. Ties keep the plan's order.
  std::stable_sort(labels.begin(), labels.end(), [](const Label& a, const Label& b) { return a.count > b.count; });
  std::vector<std::string> top;  // the plan's own labels (decided in the passes below)
  for (const Label& l : labels) top.push_back(l.text);
  const size_t x_bytes = size_t(p.B) * size_t(S) * size_t(cfg.d_model) * sizeof(float);
  auto restore_input = [&] {
    if (c.y == c.x)
      HK_CUDA_CHECK(cudaMemcpyAsync(const_cast<float*>(c.x), alias_scratch.get(), x_bytes, cudaMemcpyDeviceToDevice,
                                    c.stream));
  };
  const tune::ChooserOptions opt = chooser_options();
  // Pins change what a kernel id runs (the QKV GEMM's kernel, the GEMM layout and algorithm): a
  // pinned run's answer gets its own key.
  std::string pins_suffix;
  for (const auto& [name, v] : {std::pair<const char*, const std::string*>{"qkv_gemm", &pin_qkv_gemm},
                                {"gelu", &pin_gelu}, {"layout", &pin_layout}, {"algo", &pin_algo},
                                {"chains", &pin_chains}, {"neighbours", &pin_gemm_neighbours}})
    if (!v->empty()) pins_suffix += "." + std::string(name) + "_" + *v;
  std::string pass_suffix;  // "" in the first pass, ".again" in the second

  // Decides label l in the forward of `kernels` (whose option at l is `current`; the labels of f
  // forced): the forward is timed with each option that the per-segment decision did not reject,
  // `current` first (it wins ties). The winner's plan replaces kernels and its forced labels f.
  // Each other option first has the labels it uncovers decided (refine). Returns whether another
  // option than `current` won.
  std::function<void(Kernels&, Forced&, const std::string&)> refine;
  auto decide = [&](const Label& l, int current, const std::string& name, Kernels& kernels, Forced& f) {
    // The per-segment decision's verdicts, copied before anything below adds decisions (its op as
    // key() names it: with own kernels only, "plan.<label>.own").
    const std::string seg_op = key(p, "plan." + l.text, {}).op;
    std::vector<bool> excluded(l.ids.size(), false);
    for (const tune::Decision& d : p.decisions) {
      if (d.op != seg_op) continue;
      for (size_t i = 0; i < d.results.size() && i < excluded.size(); ++i)
        excluded[i] = d.results[i].verdict == tune::Verdict::rejected_numeric ||
                      d.results[i].verdict == tune::Verdict::failed;
      break;
    }
    std::vector<int> order = {current};
    for (int i = 0; i < int(l.ids.size()); ++i)
      if (i != current && !excluded[size_t(i)]) order.push_back(i);
    if (order.size() < 2) return false;
    std::vector<tune::Candidate> cands;
    for (int i : order)
      cands.push_back({l.ids[size_t(i)], "the forward with " + l.ids[size_t(i)] + " at every " + l.text});
    const tune::TuneKey k = key(p, "plan.forward." + name + pins_suffix + pass_suffix, l.sources);
    auto uncovered = [&](int i) { return name + "=" + l.ids[size_t(i)] + "."; };  // inner keys' prefix
    if (chooser->answered(k, cands, opt)) {
      // Known answer: only the chosen plan is built (an alternative's GEMMs would set up cuBLASLt
      // combinations the forward never uses: tens of ms of start-up per process).
      const tune::Decision d = chooser->decide(k, cands, tune::Probe{}, opt);
      if (d.source != tune::Source::memo && d.source != tune::Source::single) p.decisions.push_back(d);
      f[l.text] = order[size_t(d.chosen)];
      if (d.chosen == 0) return false;
      restore_input();
      kernels = replan_forcing(p, c, f);
      refine(kernels, f, uncovered(order[size_t(d.chosen)]));
      return true;
    }
    std::vector<Kernels> plans;
    std::vector<Forced> fs;
    for (int i : order) {
      Forced fi = f;
      fi[l.text] = i;
      if (i == current) {
        plans.push_back(kernels);
      } else {
        restore_input();
        plans.push_back(replan_forcing(p, c, fi));
        refine(plans.back(), fi, uncovered(i));
      }
      fs.push_back(std::move(fi));
    }
    restore_input();
    auto run_with = [&](int i, Ctx& cc) { run_plan(plans[size_t(i)], steps, cc); };
    const tune::Decision d = decide_by_forward(p, c, k, cands, run_with);
    p.decisions.push_back(d);
    kernels = plans[size_t(d.chosen)];
    f = fs[size_t(d.chosen)];
    return d.chosen != 0;
  };
  // The labels of `kernels` that are neither the plan's own nor forced yet, decided in its forward
  // one at a time, the longest first (a switch can uncover more), keys under `prefix`; their own
  // options refined in turn (QKV + attention in one kernel uncovers the post-attention chain's
  // segment). Each level forces one more label, so the recursion ends.
  refine = [&](Kernels& kernels, Forced& f, const std::string& prefix) {
    for (;;) {
      const std::vector<Label> found = collect(kernels);
      const Label* next = nullptr;
      for (const Label& l : found)
        if (std::find(top.begin(), top.end(), l.text) == top.end() && !f.count(l.text) &&
            (!next || l.count > next->count))
          next = &l;
      if (!next) return;
      if (!decide(*next, next->chosen, prefix + next->text, kernels, f)) f[next->text] = next->chosen;
    }
  };

  Forced forced;  // the labels decided so far, with their options
  // Each label is decided with the labels before it as decided and those after it as the plan had
  // them. A switch can change what is best for an earlier label (a chain forced later removes the
  // boundary that made an earlier alternative lose), so when the first pass switched any label,
  // a second pass decides every label again from the plan as it then is (keys ".again").
  bool switched = false;
  for (int pass = 0; pass < 2 && (pass == 0 || switched); ++pass) {
    pass_suffix = pass == 1 ? ".again" : "";
    for (const Label& l : labels) {
      const auto fl = forced.find(l.text);
      const int current = pass == 1 && fl != forced.end() ? fl->second : l.chosen;
      if (decide(l, current, l.text, p.kernels, forced)) switched = true;
    }
  }
}

void CudaEngine::Impl::decide_graph(Plan& p, cudaGraphExec_t g, const Ctx& c) {
  p.graph_decided = true;
  const std::vector<tune::Candidate> cands = {{"1", "graph replay"}, {"0", "eager launch"}};
  tune::ChooserOptions opt = chooser_options(pin_graph);
  opt.check_numerics = false;  // the same kernels either way
  opt.rounds = 3;              // best of three
  opt.margin = 0.005;
  tune::Probe probe;
  probe.run = [](int) {};
  probe.time = [&](int i) {
    return timer->time([&](cudaStream_t s) {
      if (i == 0) {
        HK_CUDA_CHECK(cudaGraphLaunch(g, s));
      } else {
        Ctx cc = c;
        cc.stream = s;
        record(p, cc);
      }
    }, false);
  };
  const tune::Decision d = chooser->decide(key(p, "graph", {}), cands, probe, opt);
  p.decisions.push_back(d);
  if (d.chosen == 1) {
    char b[96];
    std::snprintf(b, sizeof b, "eager launch measured faster (%.4g ms vs %.4g ms replay)", d.results[1].ms,
                  d.results[0].ms);
    p.graph_note = b;
  }
}

// The chosen per-layer plan against the whole-model kernel, timed as whole forwards (graph-timed
// unless graphs are off), the output y compared by the numeric guard; the faster is kept.
// HK_CHAINS=persistent pins the whole-model kernel (where the model is within its limits).
// The QKV projection's own kernel is timed alone by decide_gemm, where its programmatic launch
// cannot show: in the forward it stages its weights while the previous kernel finishes. When the
// chosen plan runs the QKV GEMM kernel with a cuBLASLt algorithm and the own kernel is a
// candidate, the whole forward is timed with each (the own kernel at its automatic width) and the
// faster stays (measured on the H200: cases 1 and 2 are 3-7% faster with it in the forward while
// it loses alone).
void CudaEngine::Impl::decide_qkv_chain(Plan& p, const Ctx& c) {
  GemmNode& g = p.qkv;
  if (g.mma.empty() || !g.decided || g.use_mma >= 0 || (!g.nk && !g.kn)) return;
  if (!p.runs_alone(steps, StepKind::qkv_proj)) return;
  std::vector<std::string> sources = {"backends/cuda/gemm_cublaslt", "backends/cuda/gemm_small"};
  for (const auto& k : p.kernels) {
    const KernelMeta& m = p.meta[p.index_of(k.kernel)];
    sources.insert(sources.end(), m.sources.begin(), m.sources.end());
  }
  const GemmShape& gs = g.active().shape();
  const tune::Candidate own{"mma", small_gemm_name(gs.rows, gs.n, gs.k, g.mma[0])};
  const std::vector<tune::Candidate> cands = {
      {"cublaslt", std::string(g.use_kn ? "[K,N] " : "[N,K] ") + g.active().describe() + " in the forward"}, own};
  auto run_with = [&](int i, Ctx& cc) {
    g.use_mma = i == 1 ? 0 : -1;
    run_plan(p.kernels, steps, cc);
  };
  tune::Decision d;
  try {
    d = decide_by_forward(p, c, key(p, "gemm.qkv_proj.chain", sources), cands, run_with);
  } catch (...) {
    g.use_mma = -1;  // the GEMM decision's choice stands
    throw;
  }
  p.decisions.push_back(d);
  g.use_mma = d.chosen == 1 ? 0 : -1;
}

void CudaEngine::Impl::decide_whole_model(Plan& p, const Ctx& c) {
  if (p.whole_models.empty()) return;
  auto whole_plan = [&](size_t i) {
    return std::vector<PlannedKernel<Ctx>>{{&p.table[size_t(p.whole_models[i])], 0, int(steps.size())}};
  };
  // HK_CHAINS=persistent: the first kernel the model fits (tiles, then columns); attention_model:
  // the only whole-model candidate then.
  if (pin_chains == "persistent" || pin_chains == "attention_model") {
    p.kernels = whole_plan(0);
    return;
  }
  const std::vector<PlannedKernel<Ctx>> layers = p.kernels;
  std::vector<std::string> sources;
  for (const auto& k : layers) {
    const KernelMeta& m = p.meta[p.index_of(k.kernel)];
    sources.insert(sources.end(), m.sources.begin(), m.sources.end());
  }
  sources.push_back("backends/cuda/model_persistent");
  std::vector<tune::Candidate> cands = {{"layers", "the per-layer plan (" + std::to_string(layers.size()) + " kernels)"}};
  for (int i : p.whole_models) cands.push_back({p.meta[size_t(i)].id, p.table[size_t(i)].name});
  auto run_with = [&](int i, Ctx& cc) {
    if (i == 0) {
      run_plan(layers, steps, cc);
    } else {
      p.table[size_t(p.whole_models[size_t(i - 1)])].run(cc, steps.data(), int(steps.size()));
    }
  };
  const tune::Decision d = decide_by_forward(p, c, key(p, "model.whole", sources), cands, run_with);
  p.decisions.push_back(d);
  if (d.chosen >= 1) p.kernels = whole_plan(size_t(d.chosen - 1));
}

// A decision between whole forwards: run_with(i, ctx) runs candidate i's forward on ctx's
// stream; they are compared on y and timed (graph replay unless HK_GRAPH=0). In place (y == x)
// every candidate starts from the input, which warm_up keeps aside.
tune::Decision CudaEngine::Impl::decide_by_forward(Plan& p, const Ctx& c, const tune::TuneKey& k,
                                                   const std::vector<tune::Candidate>& cands,
                                                   const std::function<void(int, Ctx&)>& run_with) {
  Ctx w = c;
  char* ref = nullptr;
  const tune::ChooserOptions opt = chooser_options();
  if (!chooser->answered(k, cands, opt)) ref = scratch(inner_scratch, buf_bytes(p, kY), c.stream);
  const size_t x_bytes = size_t(p.B) * size_t(S) * size_t(cfg.d_model) * sizeof(float);
  tune::Probe probe;
  probe.run = [&](int i) {
    if (c.y == c.x)
      HK_CUDA_CHECK(cudaMemcpyAsync(const_cast<float*>(c.x), alias_scratch.get(), x_bytes, cudaMemcpyDeviceToDevice,
                                    c.stream));
    run_with(i, w);
  };
  probe.keep_reference = [&] { copy_set(p, kY, c, ref, true); };
  probe.difference = [&] { return diff_set(p, kY, c, ref); };
  probe.time = [&](int i) {
    return timer->time([&](cudaStream_t st) {
      Ctx cc = c;
      cc.stream = st;
      run_with(i, cc);
    }, pin_graph != "0");
  };
  return chooser->decide(k, cands, probe, opt);
}

// The first forward of a plan on the capture stream, after the caller's pending work (it reads
// x, writes y) and the previous forward: a tuning engine chooses its plan here, on these buffers.
// With y == x the caller's x is kept aside and put back, so that the forward that follows
// (replay or eager) reads the input, not this warm-up's output.
void CudaEngine::Impl::warm_up(Plan& p, const Ctx& c, cudaStream_t caller_stream) {
  HK_CUDA_CHECK(cudaEventRecord(caller, caller_stream));
  HK_CUDA_CHECK(cudaStreamWaitEvent(capture_stream, caller, 0));
  wait_done(capture_stream);
  Ctx w = c;
  w.stream = capture_stream;
  const size_t x_bytes = size_t(p.B) * size_t(S) * size_t(cfg.d_model) * sizeof(float);
  const bool aliased = c.y == c.x;
  if (aliased) {
    char* keep = scratch(alias_scratch, x_bytes, capture_stream);
    HK_CUDA_CHECK(cudaMemcpyAsync(keep, c.x, x_bytes, cudaMemcpyDeviceToDevice, capture_stream));
  }
  if (!p.planned) {
    const auto t0 = std::chrono::steady_clock::now();
    const size_t before = p.decisions.size();
    // HK_CHAINS=persistent / attention_model where a whole-model kernel takes the model: it replaces
    // the per-layer plan outright (decide_whole_model), so none of that plan's decisions is measured.
    const bool whole_pinned = (pin_chains == "persistent" || pin_chains == "attention_model") && !p.whole_models.empty();
    if (whole_pinned) {
      p.planned = true;
    } else {
      choose_plan(p, w);
    }
    if (routes.tune && !whole_pinned) {
      if (aliased)  // the plan's own run overwrote x: the chain decision needs the input
        HK_CUDA_CHECK(cudaMemcpyAsync(const_cast<float*>(c.x), alias_scratch.get(), x_bytes,
                                      cudaMemcpyDeviceToDevice, capture_stream));
      decide_chains_in_forward(p, w);
      if (aliased)
        HK_CUDA_CHECK(cudaMemcpyAsync(const_cast<float*>(c.x), alias_scratch.get(), x_bytes,
                                      cudaMemcpyDeviceToDevice, capture_stream));
      decide_qkv_chain(p, w);
    }
    // HK_CHAINS=post_attn_qkv / attention_chain keeps its per-layer plan (no whole-model kernel in its place).
    if ((routes.tune && !pinned_chain_kernel()) || pin_chains == "persistent" || pin_chains == "attention_model") {
      if (aliased)  // the plan's own run overwrote x: the whole-model decision needs the input
        HK_CUDA_CHECK(cudaMemcpyAsync(const_cast<float*>(c.x), alias_scratch.get(), x_bytes,
                                      cudaMemcpyDeviceToDevice, capture_stream));
      decide_whole_model(p, w);
    }
    finish_plan(p);
    HK_CUDA_CHECK(cudaStreamSynchronize(capture_stream));
    seg_scratch = DeviceBuffer();
    inner_scratch = DeviceBuffer();
    p.report.warmup_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    for (size_t i = before; i < p.decisions.size(); ++i) {
      const tune::Decision& d = p.decisions[i];
      if (d.source == tune::Source::measured) {
        ++p.report.measured;
        p.report.measure_ms += d.tune_ms;
      } else if (d.source == tune::Source::cached) {
        ++p.report.cached;
      } else if (d.source != tune::Source::memo) {
        ++p.report.fixed;
      }
    }
  } else {
    record(p, w);
  }
  if (aliased) {
    HK_CUDA_CHECK(cudaMemcpyAsync(const_cast<float*>(c.x), alias_scratch.get(), x_bytes, cudaMemcpyDeviceToDevice,
                                  capture_stream));
    HK_CUDA_CHECK(cudaStreamSynchronize(capture_stream));
    alias_scratch = DeviceBuffer();
  }
  p.warmed = true;
  record_done(capture_stream);
}

cudaGraphExec_t CudaEngine::Impl::graph_for(Plan& p, const GraphKey& key, cudaStream_t caller_stream) {
  if (cudaGraphExec_t g = graphs.find(key)) return g;
  // The warm-up runs for real (cuBLASLt and cuDNN load their kernels, nothing lazy is left for
  // the capture).
  const Ctx c{capture_stream, static_cast<const float*>(key.x), static_cast<const int32_t*>(key.lengths),
              static_cast<float*>(const_cast<void*>(key.y))};
  if (!p.warmed) {
    warm_up(p, c, caller_stream);
  } else {
    HK_CUDA_CHECK(cudaEventRecord(caller, caller_stream));
    HK_CUDA_CHECK(cudaStreamWaitEvent(capture_stream, caller, 0));
    wait_done(capture_stream);
    record_done(capture_stream);
  }
  cudaGraphExec_t g = nullptr;
  const auto t_capture = std::chrono::steady_clock::now();
  struct CaptureTime {  // time counted whether the capture succeeds or not; graphs made only on success
    Plan& p;
    std::chrono::steady_clock::time_point t0;
    ~CaptureTime() {
      p.report.capture_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
  };
  flush_done();  // the cache may wait on `done` to evict a graph: it must cover the last forward
  try {
    CaptureTime timed{p, t_capture};
    g = graphs.capture(key, capture_stream, done, [&](cudaStream_t s) {
      Ctx cc = c;
      cc.stream = s;
      record(p, cc);
    });
    ++p.report.captures;
  } catch (const std::exception& e) {
    p.graph_note = std::string("capture failed, running eagerly: ") + e.what();
    return nullptr;
  }
  if (!p.graph_decided && routes.tune) {
    const auto t0 = std::chrono::steady_clock::now();
    // In place (y == x) the timed forwards overwrite the input: keep it and put it back.
    const size_t x_bytes = size_t(p.B) * size_t(S) * size_t(cfg.d_model) * sizeof(float);
    const bool aliased = c.x == c.y;
    if (aliased)
      HK_CUDA_CHECK(cudaMemcpyAsync(scratch(alias_scratch, x_bytes, capture_stream), c.x, x_bytes,
                                    cudaMemcpyDeviceToDevice, capture_stream));
    decide_graph(p, g, c);
    if (aliased) {
      HK_CUDA_CHECK(cudaMemcpyAsync(const_cast<float*>(c.x), alias_scratch.get(), x_bytes, cudaMemcpyDeviceToDevice,
                                    capture_stream));
      HK_CUDA_CHECK(cudaStreamSynchronize(capture_stream));
      alias_scratch = DeviceBuffer();
    }
    record_done(capture_stream);
    const tune::Decision& d = p.decisions.back();
    p.report.warmup_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (d.source == tune::Source::measured) {
      ++p.report.measured;
      p.report.measure_ms += d.tune_ms;
    } else if (d.source == tune::Source::cached) {
      ++p.report.cached;
    }
    if (!p.graph_note.empty()) return nullptr;
  }
  return g;
}

void CudaEngine::Impl::run(int B, const float* x, const int32_t* lengths, float* y, cudaStream_t s, int64_t tokens) {
  HK_CUDA_CHECK(cudaSetDevice(device));
  Plan& p = plan(B, rows_for(B, tokens));
  cudaGraphExec_t g = nullptr;
  if (routes.graphs && p.graph_note.empty()) g = graph_for(p, GraphKey{B, x, lengths, y, p.T}, s);
  if (!p.warmed) warm_up(p, Ctx{capture_stream, x, lengths, y}, s);  // eager engines tune here
  wait_done(s);
  if (g) {
    HK_CUDA_CHECK(cudaGraphLaunch(g, s));
  } else {
    record(p, Ctx{s, x, lengths, y});
  }
  record_done(s);
}

// A fixed synthetic input (MODEL.md's distribution, every position valid) in the host path's
// buffers, for planning without the caller's data (explain, prepare without x).
void CudaEngine::Impl::synthetic_host_input(int B, int64_t tokens) {
  // 16 distinct sequences repeated over the batch: generating a whole batch on the host costs
  // far more than the plan it stands in for (~0.3 s for 1024 sequences of 128 x 128).
  const int distinct = std::min(B, 16);
  const size_t seq = size_t(S) * size_t(cfg.d_model);
  const std::vector<float> x = synthetic_input(distinct, S, cfg.d_model, 0x7e57);
  std::vector<int32_t> len;
  if (tokens >= 0) {
    tokens = std::min<int64_t>(tokens, int64_t(B) * S);
    len.resize(size_t(B));
    for (int b = 0; b < B; ++b) len[size_t(b)] = int32_t(tokens / B + (b < tokens % B ? 1 : 0));
  }
  wait_done(stream);
  HK_CUDA_CHECK(cudaMemcpyAsync(buf.x_in, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
  for (size_t have = size_t(distinct); have < size_t(B); have *= 2)  // doubling device-to-device copies
    HK_CUDA_CHECK(cudaMemcpyAsync(buf.x_in + have * seq, buf.x_in, std::min(have, size_t(B) - have) * seq * sizeof(float),
                                  cudaMemcpyDeviceToDevice, stream));
  if (tokens >= 0)
    HK_CUDA_CHECK(cudaMemcpyAsync(buf.lengths_in, len.data(), len.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  stream));
  else
    HK_CUDA_CHECK(cudaMemcpyAsync(buf.lengths_in, buf.lengths_full, size_t(B) * sizeof(int32_t),
                                  cudaMemcpyDeviceToDevice, stream));
  HK_CUDA_CHECK(cudaStreamSynchronize(stream));
  record_done(stream);
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
    const size_t bytes = size_t(B) * size_t(S) * size_t(m.cfg.d_model) * sizeof(float);
    // Page-locked caller buffers (a streaming reader's) are copied from / to directly; others go
    // through the engine's pinned staging (pageable memory would make the copies synchronous),
    // allocated on the first call that needs it, sized for max_batch and kept.
    const bool x_pinned = is_page_locked(x), y_pinned = is_page_locked(y);
    if (!x_pinned && !m.x_stage.get()) m.x_stage = PinnedBuffer(full);
    if (!y_pinned && !m.y_stage.get()) m.y_stage = PinnedBuffer(full);
    if (!m.len_stage.get()) m.len_stage = PinnedBuffer(size_t(m.max_batch) * sizeof(int32_t));
    if (!x_pinned) std::memcpy(m.x_stage.get(), x, bytes);
    auto* len = static_cast<int32_t*>(m.len_stage.get());
    int64_t tokens = 0;
    for (int b = 0; b < B; ++b) tokens += len[b] = lengths ? lengths[b] : S;
    // The upload overwrites x_in / lengths_in: wait for whatever forward may still read them.
    m.wait_done(m.stream);
    HK_CUDA_CHECK(cudaMemcpyAsync(m.buf.x_in, x_pinned ? x : m.x_stage.get(), bytes, cudaMemcpyHostToDevice, m.stream));
    HK_CUDA_CHECK(cudaMemcpyAsync(m.buf.lengths_in, len, size_t(B) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  m.stream));
    float* out = m.next_output();
    m.run(B, m.buf.x_in, m.buf.lengths_in, out, m.stream, tokens);
    HK_CUDA_CHECK(cudaMemcpyAsync(y_pinned ? y : m.y_stage.get(), out, bytes, cudaMemcpyDeviceToHost, m.stream));
    // The packing kernel's overflow flag (only a device-path call with a wrong `tokens` sets it).
    if (!m.flag_stage.get()) m.flag_stage = PinnedBuffer(sizeof(int32_t));
    HK_CUDA_CHECK(cudaMemcpyAsync(m.flag_stage.get(), m.buf.pack_flag, sizeof(int32_t), cudaMemcpyDeviceToHost,
                                  m.stream));
    HK_CUDA_CHECK(cudaStreamSynchronize(m.stream));
    if (*static_cast<int32_t*>(m.flag_stage.get()) != 0) {
      HK_CUDA_CHECK(cudaMemset(m.buf.pack_flag, 0, sizeof(int32_t)));
      throw Error("cuda backend: a padding-free forward_device call was given fewer `tokens` than its lengths "
                  "sum to; its output was wrong");
    }
    if (!y_pinned) std::memcpy(y, m.y_stage.get(), bytes);
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

void CudaEngine::forward_device(const float* x, const int32_t* lengths, int B, float* y, cudaStream_t stream,
                                int64_t tokens) {
  Impl& m = *impl_;
  translate("forward_device", [&] {
    m.check_batch(B, "forward_device");
    if (B == 0) return;
    check_device_pointers(x, lengths, y);
    m.run(B, x, lengths ? lengths : m.buf.lengths_full, y, stream, lengths ? tokens : -1);
  });
}

const float* CudaEngine::forward_device(const float* x, const int32_t* lengths, int B, cudaStream_t stream,
                                        int64_t tokens) {
  Impl& m = *impl_;
  return translate("forward_device", [&]() -> const float* {
    m.check_batch(B, "forward_device");
    if (B == 0) return nullptr;
    check_device_pointers(x, lengths, m.buf.y[0]);
    float* y = m.next_output();
    m.run(B, x, lengths ? lengths : m.buf.lengths_full, y, stream, lengths ? tokens : -1);
    return y;
  });
}

int64_t CudaEngine::plan_rows(int B, int64_t tokens) const { return impl_->rows_for(B, tokens); }

void CudaEngine::prepare(int B, const float* x, const int32_t* lengths, float* y, int64_t tokens) {
  Impl& m = *impl_;
  translate("prepare", [&] {
    m.check_batch(B, "prepare");
    if (B == 0) return;
    HK_CUDA_CHECK(cudaSetDevice(m.device));
    // Without x the host path's synthetic input (all positions valid, or `tokens` of them) plans
    // the dense B (or the padding-free plan of that many tokens).
    const int64_t host_tokens = x ? -1 : tokens < 0 ? -1 : std::min<int64_t>(tokens, int64_t(B) * m.S);
    Plan& p = m.plan(B, m.rows_for(B, x && lengths ? tokens : host_tokens));
    std::vector<GraphKey> keys;
    if (!x && host_tokens >= 0) {
      // Lengths summing to `tokens` always (whether planned or not): the padding-free plan's rows
      // must hold them.
      m.synthetic_host_input(B, host_tokens);
      for (float* out : m.buf.y) keys.push_back({B, m.buf.x_in, m.buf.lengths_in, out, p.T});
    } else if (!x) {
      // The host path's buffers hold whatever the last host call left (or nothing yet): give
      // the warm-up valid lengths, and a tuning engine's measurements a synthetic input.
      if (!p.planned) {
        m.synthetic_host_input(B);
      } else {
        m.wait_done(m.stream);
        HK_CUDA_CHECK(cudaMemcpyAsync(m.buf.lengths_in, m.buf.lengths_full, size_t(m.max_batch) * sizeof(int32_t),
                                      cudaMemcpyDeviceToDevice, m.stream));
        m.record_done(m.stream);
      }
      for (float* out : m.buf.y) keys.push_back({B, m.buf.x_in, m.buf.lengths_in, out, p.T});
    } else {
      const int32_t* len = lengths ? lengths : m.buf.lengths_full;
      if (y) {
        keys.push_back({B, x, len, y, p.T});
      } else {
        for (float* out : m.buf.y) keys.push_back({B, x, len, out, p.T});
      }
    }
    if (!m.routes.graphs) {
      if (!p.warmed) {
        const GraphKey& k = keys.front();
        m.warm_up(p, Ctx{m.capture_stream, static_cast<const float*>(k.x), static_cast<const int32_t*>(k.lengths),
                         static_cast<float*>(const_cast<void*>(k.y))}, m.stream);
      }
    } else {
      for (const GraphKey& k : keys) {
        if (!p.graph_note.empty()) break;
        m.graph_for(p, k, m.stream);
      }
      if (!p.warmed) {  // capture failed before the warm-up could run (cannot happen today)
        const GraphKey& k = keys.front();
        m.warm_up(p, Ctx{m.capture_stream, static_cast<const float*>(k.x), static_cast<const int32_t*>(k.lengths),
                         static_cast<float*>(const_cast<void*>(k.y))}, m.stream);
      }
    }
    HK_CUDA_CHECK(cudaStreamSynchronize(m.capture_stream));
  });
}

std::string CudaEngine::stats() const {
  const Impl& m = *impl_;
  TuneReport sum;
  double first_build_ms = 0;  // the plan built first (one-time library set-up lands there)
  int first_order = -1;
  for (const auto& [key, p] : m.plans) {
    if (first_order < 0 || p->order < first_order) {
      first_order = p->order;
      first_build_ms = p->report.build_ms;
    }
    sum.build_ms += p->report.build_ms;
    sum.gemm_ms += p->report.gemm_ms;
    sum.warmup_ms += p->report.warmup_ms;
    sum.measure_ms += p->report.measure_ms;
    sum.capture_ms += p->report.capture_ms;
    sum.captures += p->report.captures;
    sum.measured += p->report.measured;
    sum.cached += p->report.cached;
  }
  char b[640];
  std::snprintf(b, sizeof b,
                "engine_ctor_ms=%.1f ctor_context_ms=%.1f ctor_props_ms=%.1f ctor_handles_ms=%.1f ctor_weights_ms=%.1f "
                "ctor_arena_ms=%.1f ctor_cache_ms=%.1f plans=%zu plan_build_ms=%.1f plan_build_first_ms=%.1f plan_gemm_ms=%.1f plan_warmup_ms=%.1f "
                "plan_measure_ms=%.1f graph_capture_ms=%.1f graphs=%d decisions_measured=%d decisions_cached=%d "
                "libraries=%s cublaslt_loaded=%d",
                m.ctor_ms, m.ctor_context_ms, m.ctor_props_ms, m.ctor_handles_ms, m.ctor_weights_ms, m.ctor_arena_ms,
                m.ctor_cache_ms, m.plans.size(),
                sum.build_ms, first_build_ms, sum.gemm_ms, sum.warmup_ms, sum.measure_ms, sum.capture_ms,
                sum.captures, sum.measured, sum.cached, m.own_only ? "own" : "all", lt::loaded() ? 1 : 0);
  return b;
}

void CudaEngine::warm_up(int B, int64_t tokens) { prepare(B, nullptr, nullptr, nullptr, tokens < 0 ? -1 : tokens); }

TuneReport CudaEngine::tune_report(int B) const {
  auto it = impl_->last_plan.find(B);
  if (it == impl_->last_plan.end()) return {};
  TuneReport r = it->second->report;
  r.planned = it->second->planned;
  return r;
}

std::string CudaEngine::explain(int B) const {
  Impl& m = *impl_;
  return translate("explain", [&] {
    if (B < 1 || B > m.max_batch)
      throw Error("cuda backend: explain: B = " + std::to_string(B) + " is outside 1..max_batch (" +
                  std::to_string(m.max_batch) + ")");
    HK_CUDA_CHECK(cudaSetDevice(m.device));
    Plan& p = m.plan(B, int64_t(B) * m.S);  // the synthetic input has every position valid
    if (!p.planned) {
      m.synthetic_host_input(B);
      m.warm_up(p, Ctx{m.capture_stream, m.buf.x_in, m.buf.lengths_in, m.buf.y[0]}, m.stream);
      HK_CUDA_CHECK(cudaStreamSynchronize(m.capture_stream));
    }
    return m.explain_plan(p, B);
  });
}

std::string CudaEngine::explain_last(int B) const {
  auto it = impl_->last_plan.find(B);
  if (it == impl_->last_plan.end() || !it->second->planned) return "";
  return impl_->explain_plan(*it->second, B);
}

std::string CudaEngine::Impl::explain_plan(const Plan& p, int B) const {
  auto uses = [&](const std::string& id) {
    for (const auto& k : p.kernels)
      if (p.meta[p.index_of(k.kernel)].id == id) return true;
    return false;
  };
  std::ostringstream o;
  o << "cuda backend on " << device_desc << ", precision " << to_string(precision) << ", B = " << B
    << ", S = " << S << " (" << p.T << " token rows)\n";
  if (routes.tune) {
    char b[200];
    std::snprintf(b, sizeof b, "tuning: on (%s); first forward %.1f ms: %d measured (%.1f ms), %d from the cache, %d fixed\n",
                  cache->persistent() ? ("cache " + cache->path()).c_str() : "no disk cache", p.report.warmup_ms,
                  p.report.measured, p.report.measure_ms, p.report.cached, p.report.fixed);
    o << b;
  } else {
    o << "tuning: off (every decision takes its default or its pin)\n";
  }
  bool chain_tanh = false;
#if HK_CUDA_HAVE_POST_ATTN_FUSED
  chain_tanh = uses("post_attn") && p.post_attn_config < p.post_attn_configs.size() &&
               p.post_attn_configs[p.post_attn_config].gelu_tanh != 0;
#endif
  o << "gelu: "
    << (uses("epilogue") ? "cuBLASLt tanh epilogue" + std::string(pin_gelu == "epilogue" ? " (HK_GELU=epilogue)" : " (measured)")
                         : "exact erf pass" + (p.gelu_note.empty() ? std::string() : " (" + p.gelu_note + ")"))
    << (chain_tanh ? "; tanh form inside the fused post-attention chain (measured)" : "") << "\n";
  std::string att = "flash";
  for (const char* id : {"flash.q64", "flash.q16", "flash.k2", "flash.k4", "flash.g4", "cudnn", "materialized",
                         "qkv_attention"})
    if (uses(id)) att = id;
  o << "attention: " << att << (att == "cudnn" && p.cudnn ? " (" + p.cudnn->plan_info(p.attn) + ")" : "")
    << (p.attention_note.empty() ? "" : " (" + p.attention_note + ")")
    << (p.materialized_note.empty() ? "" : " (materialized not used: " + p.materialized_note + ")") << "\n";
  for (const std::string& n : p.chain_notes) o << "chain " << n << "\n";
  if (!p.whole_model_note.empty()) o << p.whole_model_note << "\n";
  o << "libraries: " << libraries_note << "\n";
  if (p.packed)
    o << "padding-free: " << p.T << " packed rows for " << int64_t(B) * S << " positions"
      << (p.pack_x ? "" : "; the first layer's chain reads the residual from the input rows (no packed copy)") << "\n";
  o << "graphs: "
    << (!routes.graphs ? "off (HK_GRAPH=0)"
        : !p.graph_note.empty() ? "off for this B: " + p.graph_note
                                : std::string("on"))
    << "\n";
  o << describe_plan(p.kernels, steps);
  // A GEMM line for each GEMM step the plan runs as a kernel of its own (a node measured while
  // tuning but replaced by a chain says nothing about the plan).
  auto gemm_line = [&o, &p, this](const char* step, StepKind kind, const GemmNode& g) {
    if (!p.runs_alone(steps, kind)) return;
    if (g.use_mma >= 0 && (!g.built() || (!g.nk && !g.kn))) {  // the own kernel, no cuBLASLt descriptor made
      const GemmShape& s = g.shape;
      o << "gemm " << step << " [" << to_string(s.epilogue) << "] rows " << s.rows << " n " << s.n << " k " << s.k
        << ": [N,K] weights, " << small_gemm_name(s.rows, s.n, s.k, g.mma[size_t(g.use_mma)])
        << " (own kernel only)\n";
      return;
    }
    if (!g.built() || (!g.nk && !g.kn)) return;  // not made: no kernel of the plan used it
    const LtGemm& a = g.active();
    const GemmShape& s = a.shape();
    o << "gemm " << step << " [" << to_string(s.epilogue) << "] rows " << s.rows << " n " << s.n << " k " << s.k
      << ": ";
    if (g.use_mma >= 0) {
      o << "[N,K] weights, " << small_gemm_name(s.rows, s.n, s.k, g.mma[size_t(g.use_mma)]) << " (measured against "
        << a.candidates().size() << " cuBLASLt candidates)\n";
      return;
    }
    o << (g.use_kn ? "[K,N]" : "[N,K]") << " weights, " << a.base_count() << " candidates";
    if (int(a.candidates().size()) > a.base_count())
      o << " + " << (int(a.candidates().size()) - a.base_count()) << " around them";
    o << ", using #" << a.selected() << " (" << a.describe() << ")\n";
  };
  gemm_line("qkv_proj", StepKind::qkv_proj, p.qkv);
  gemm_line("out_proj", StepKind::out_proj, p.out);
  gemm_line("ffn_in", StepKind::ffn_in, uses("epilogue") ? p.ffn_in_tanh : p.ffn_in);
  gemm_line("ffn_out", StepKind::ffn_out, p.ffn_out);
  if (!p.decisions.empty()) {
    o << "decisions (candidate times in ms; the first candidate is the default):\n";
    for (const tune::Decision& d : p.decisions) o << "  " << d.describe() << "\n";
  }
  return o.str();
}

}  // namespace hk::cuda
