// The Kokkos backend's engine, as the tests and benchmarks of the backend see it: the hk::Engine
// interface plus a float64 output (precision `reference` computes in float64 end to end, and a
// float32 output would hide the last eight digits) and the choice of kernel table.
#pragma once

#include <memory>

#include "hk/engine.hpp"

namespace hk::kokkos {

struct EngineTuning {
  // Fused chains (qkv_proj..attention, out_proj..ln2, ffn_out..ln1, ffn_out..final_ln) before
  // the single-step kernels; false plans single steps only (the same arithmetic, more passes).
  bool fuse = true;
};

class KokkosEngine : public Engine {
 public:
  // forward() with y as float64 [B, S, D].
  virtual void forward_f64(const float* x, const int32_t* lengths, int B, double* y) = 0;
};

// Validates the model and options like hk::make_engine; throws hk::Error.
std::unique_ptr<KokkosEngine> create_engine(const Model& model, const EngineOptions& options,
                                            const EngineTuning& tuning = {});

}  // namespace hk::kokkos
