// The CUDA backend's engine (public header: host compilers only need the CUDA runtime API).
//
// Per model: weights uploaded once (fp16 for `fast`, fp32 for `fp32`; q/k/v fused), one device
// arena sized for max_batch * seq_len tokens, one cuBLASLt handle. Per batch size B (planned on
// first use or by prepare(B)): cuBLASLt descriptors and algorithms, the attention route, the
// kernel plan of hk/plan.hpp, and CUDA graphs of the whole forward, replayed per call.
//
// Environment knobs, read when the engine is made:
//   HK_GELU=erf|epilogue   ffn_in's GELU: exact erf in its own pass (default) or cuBLASLt's
//                          tanh-approximation epilogue (`fast` only; fp32 always uses erf)
//   HK_ATTENTION=flash|cudnn  attention route; cudnn falls back to flash for shapes it lacks
//   HK_GRAPH=1|0           capture and replay CUDA graphs (default) or launch eagerly
//   HK_CUDA_POISON=1       fill the arena with NaN at construction (tests: unwritten reads show)
//
// Not thread-safe: one call at a time per engine. Calls on different streams are ordered by
// the engine itself (each forward waits for the previous one: they share the arena).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "hk/engine.hpp"

namespace hk::cuda {

struct Routes {
  bool gelu_epilogue = false;  // HK_GELU=epilogue
  bool prefer_cudnn = false;   // HK_ATTENTION=cudnn
  bool graphs = true;          // HK_GRAPH
  bool poison = false;         // HK_CUDA_POISON
};
// Parses the knobs above; throws hk::Error naming the variable on a value it does not know.
Routes routes_from_environment();

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
  // Host arrays: x, lengths staged through pinned buffers (allocated on the first call), the
  // forward run on the engine's stream, y copied back; returns when y is written.
  void forward(const float* x, const int32_t* lengths, int B, float* y) override;
  std::string explain(int B) const override;

  // Device-resident forward, asynchronous on `stream`: x [B, S, D] fp32, lengths [B] int32 (or
  // null: all valid), y [B, S, D] fp32, all device pointers, x and y 16-byte aligned. x is never
  // written (y may be x). Graph mode caches one graph per pointer set: reuse buffers.
  void forward_device(const float* x, const int32_t* lengths, int B, float* y, cudaStream_t stream);
  // Same, into one of two engine-owned output buffers used alternately: the returned pointer
  // stays valid (and unchanged) until the second forward call after this one.
  const float* forward_device(const float* x, const int32_t* lengths, int B, cudaStream_t stream);

  // Plans B now (descriptors, algorithms, attention preparation); in graph mode also warms up
  // (one real forward: y is overwritten) and captures the graphs of
  //   x null:            the host path forward() (both alternating outputs)
  //   x set, y null:     forward_device(x, lengths, B, stream) (both engine-owned outputs)
  //   x and y set:       forward_device(x, lengths, B, y, stream)
  // Keeps setup out of timed loops. Synchronous.
  void prepare(int B, const float* x = nullptr, const int32_t* lengths = nullptr, float* y = nullptr);

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
