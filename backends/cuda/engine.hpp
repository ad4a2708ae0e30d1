// The CUDA backend's engine (public header: host compilers only need the CUDA runtime API).
//
// Per model: weights uploaded once (fp16 for `fast`, fp32 for `fp32`; q/k/v fused), one device
// arena sized for max_batch * seq_len tokens, one cuBLASLt handle (none for an engine on its own
// kernels only: HK_LIBRARIES below). Per batch size B (planned on
// first use or by prepare(B)): cuBLASLt descriptors and algorithms, the attention route, the
// kernel plan of hk/plan.hpp, and CUDA graphs of the whole forward, replayed per call.
//
// Measured dispatch (src/hk/tune): with Routes::tune, every route decision (the kernel covering
// each step or chain of steps, the attention route and tile, the bias+GELU route, each GEMM's
// weight layout and cuBLASLt algorithm, graph replay vs eager launch) times its candidates on
// the caller's buffers during the first forward of a batch size, rejects candidates whose
// outputs differ from the default's by more than 2e-3, and keeps the fastest; winners are
// memoised per engine and stored in the tune cache. Without tuning every decision takes its
// default (the first candidate): the untuned engine.
//
// Environment knobs, read when the engine is made (docs/KNOBS.md lists them all):
//   HK_TUNE=1|0            measured dispatch (routes_from_environment: on unless 0)
//   HK_TUNE_CACHE=DIR|off, HK_TUNE_REMEASURE=1, HK_TUNE_VERBOSE=1
//   HK_ATTENTION=auto|flash|flash.q64|flash.q16|flash.k2|flash.k4|flash.g4|cudnn|materialized   pins the attention route
//   HK_GELU=auto|erf|epilogue   pins ffn_in's GELU (epilogue: cuBLASLt's tanh form, fast only)
//   HK_GEMM_LAYOUT=auto|nk|kn, HK_GEMM_ALGO=auto|0..7   pin GEMM layout / algorithm
//   HK_QKV_GEMM=auto|cublaslt|mma   the QKV projection's GEMM: cuBLASLt or the own mma kernel
//   HK_CHAINS=auto|off|persistent|post_attn_qkv|attention_chain|attention_model fused chain kernels considered or not, or pinned
//   HK_LIBRARIES=auto|all|own   own kernels only (no cuBLASLt, no cuDNN; the QKV GEMM the mma
//                          kernel, the post-attention steps the fused chain, also untuned): pinned,
//                          or under auto for a short job (EngineOptions::job_tokens, docs/KNOBS.md)
//   HK_GRAPH=auto|1|0      graph replay measured against eager, or pinned on / off
//   HK_PACK=auto|1|0       padding-free execution (see below): by the size rule, always, never
//   HK_CUDA_POISON=1       fill the arena with NaN at construction (tests: unwritten reads show)
//
// Padding-free execution: when the number of valid tokens T = sum(lengths) is known on the host
// (the host path computes it; forward_device takes it as `tokens`), the forward runs on the valid
// tokens only: the first LayerNorm packs them (row seq_start[b] + s), GEMMs and row kernels run
// on Tcap rows, attention takes the packed layout, and the final LayerNorm scatters back to
// [B, S, D] (padded rows written as zeros). Tcap is T rounded up to a bucket of
// max(256, B*S/32 rounded up to a multiple of 256) rows (packing.hpp), so a new `lengths` vector
// reuses the plan and graphs of its bucket (at most ~32 buckets per B, each planned and captured
// on first use; the zero-filled rows between T and Tcap cost at most one bucket: 1/32 of the
// dense work for B*S >= 8192, up to 1/16 at 4096). `auto` packs when Tcap is at
// most 85% of B*S and B*S >= 4096 rows; below that the dense plan is kept (the packing kernel's
// extra launch would outweigh the saving).
//
// Not thread-safe: one call at a time per engine. Calls on different streams are ordered by
// the engine itself (each forward waits for the previous one: they share the arena).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "hk/engine.hpp"

namespace hk::cuda {

struct Routes {
  bool gelu_epilogue = false;  // HK_GELU=epilogue: pins the tanh epilogue
  bool prefer_cudnn = false;   // HK_ATTENTION=cudnn: pins cuDNN (flash where cuDNN lacks the shape)
  bool graphs = true;          // false (HK_GRAPH=0): eager launches, pinned
  bool poison = false;         // HK_CUDA_POISON
  bool tune = false;           // measured dispatch; a default-constructed Routes is the untuned engine
  std::string tune_cache_dir;  // "" : decisions kept in memory only
  bool tune_verbose = false;   // HK_TUNE_VERBOSE
  bool tune_remeasure = false; // HK_TUNE_REMEASURE
  // Further pins by decision family -> candidate id: "attention" (flash, flash.q64, flash.q16,
  // cudnn, materialized), "gelu" (erf, epilogue), "gemm_layout" (nk, kn), "gemm_algo" (0..7),
  // "gemm_neighbours" (cluster, tiles), "qkv_gemm" (cublaslt, mma), "chains" (off, persistent, post_attn_qkv), "graph" (1, 0), "pack" (1, 0),
  // "libraries" (all, own). The booleans above pin too.
  std::map<std::string, std::string> pins;
};
// Parses the knobs above; throws hk::Error naming the variable on a value it does not know.
// tune = HK_TUNE != 0, tune_cache_dir = the default location (hk::tune::TuneCache).
Routes routes_from_environment();

// What tuning cost for one batch size.
struct TuneReport {
  bool planned = false;    // the plan of this B exists (its first forward ran)
  double warmup_ms = 0;    // wall time of the first forward's planning + tuning + warm-up
  double measure_ms = 0;   // of which measuring candidates
  int measured = 0;        // decisions measured now
  int cached = 0;          // decisions answered by the tune cache
  int fixed = 0;           // decisions without measurement (single candidate, pinned, untuned)
  double build_ms = 0;     // building the plan (descriptors, cuBLASLt algorithm queries, routes)
  double gemm_ms = 0;      // making the cuBLASLt GEMM descriptors (on a node's first use: part of
                           // build_ms untuned, of warmup_ms in a tuning engine's first forward)
  double capture_ms = 0;   // capturing and instantiating its graphs
  int captures = 0;
};

class CudaEngine : public Engine {
 public:
  // Throws hk::Error when the device is unusable, the precision is `reference`, or memory runs out.
  CudaEngine(const Model& model, const EngineOptions& options);
  CudaEngine(const Model& model, const EngineOptions& options, const Routes& routes);
  ~CudaEngine() override;
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  std::string backend() const override;
  std::string device() const override;
  Precision precision() const override;
  // prepare(B, nullptr, nullptr, nullptr, tokens): the host path's plan and graphs for a batch
  // holding `tokens` valid positions.
  void warm_up(int B, int64_t tokens) override;
  // Summed over every plan made so far: plans, build_ms (and of it the GEMM descriptors' share;
  // the first plan's build on its own), warmup_ms (planning decisions and the first run),
  // measure_ms, capture_ms, captures, measured / cached decisions.
  std::string stats() const override;
  // Host arrays: x, lengths staged through pinned buffers (allocated on the first call), the
  // forward run on the engine's stream, y copied back; returns when y is written.
  void forward(const float* x, const int32_t* lengths, int B, float* y) override;
  // The plan of B (its decisions and, where measured, every candidate's time). Plans B first
  // if needed; a tuning engine then tunes on a synthetic input (fixed seed, all positions valid).
  std::string explain(int B) const override;

  // Device-resident forward, asynchronous on `stream`: x [B, S, D] fp32, lengths [B] int32 (or
  // null: all valid), y [B, S, D] fp32, all device pointers, x and y 16-byte aligned. x is never
  // written (y may be x). Graph mode caches one graph per pointer set: reuse buffers.
  // `tokens`: the sum of lengths when the caller knows it (>= 0), which allows padding-free
  // execution; -1: unknown (dense plan). A wrong count gives a wrong result: the packing kernel
  // never writes beyond its rows, and raises a flag the next host-path forward reports.
  void forward_device(const float* x, const int32_t* lengths, int B, float* y, cudaStream_t stream,
                      int64_t tokens = -1);
  // Same, into one of two engine-owned output buffers used alternately: the returned pointer
  // stays valid (and unchanged) until the second forward call after this one.
  const float* forward_device(const float* x, const int32_t* lengths, int B, cudaStream_t stream,
                              int64_t tokens = -1);

  // Plans B now (descriptors, algorithms, attention preparation); in graph mode also warms up
  // (one real forward: y is overwritten) and captures the graphs of
  //   x null:            the host path forward() (both alternating outputs), on a synthetic
  //                      input: every position valid, or `tokens` >= 0 valid positions in all
  //                      (the plan of a padding-free batch of that many tokens)
  //   x set, y null:     forward_device(x, lengths, B, stream) (both engine-owned outputs)
  //   x and y set:       forward_device(x, lengths, B, y, stream)
  // Keeps setup out of timed loops. Synchronous.
  void prepare(int B, const float* x = nullptr, const int32_t* lengths = nullptr, float* y = nullptr,
               int64_t tokens = -1);

  // Of the plan of B used last (dense or padding-free).
  TuneReport tune_report(int B) const;
  // explain() of the plan of B used last (dense or padding-free), without planning anything;
  // "" when B has not run.
  std::string explain_last(int B) const;
  // Token rows the plan of (B, tokens) runs on: B * S (dense) or the padding-free bucket.
  int64_t plan_rows(int B, int64_t tokens) const;

  int max_batch() const;
  int seq_len() const;
  const ModelConfig& config() const;
  const Routes& routes() const;
  cudaStream_t stream() const;  // the engine's own stream (host path, captures)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hk::cuda
