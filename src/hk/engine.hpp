// The public entry point: an Engine runs the forward pass of one model on one backend, for
// batches of up to `max_batch` sequences of `seq_len` positions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hk/config.hpp"
#include "hk/model.hpp"

namespace hk {

struct EngineOptions {
  std::string backend = "auto";  // "auto" (cuda when a GPU is usable, else kokkos), "kokkos", "cuda"
  Precision precision = Precision::fast;
  int max_batch = 1;  // largest B of one forward() call: buffers are sized for it once
  int seq_len = 1;    // S
  int device = 0;     // GPU ordinal for the cuda backend
  // Token positions (sequences x seq_len, padding included) of the whole job this engine belongs
  // to, over all its forward() calls and, under MPI, over all ranks (so that every rank decides
  // alike); 0 = unknown or long-lived. A backend may run a short job on its own kernels only, when
  // a vendor library's one-time set-up would cost more than it saves over the job (the cuda
  // backend: cuBLASLt, HK_LIBRARIES in docs/KNOBS.md).
  int64_t job_tokens = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string backend() const = 0;  // "kokkos", "cuda"
  virtual std::string device() const = 0;   // human-readable device description
  virtual Precision precision() const = 0;
  // y[b, s, :] for b < B (B <= max_batch). x [B, S, D] and y [B, S, D] are host float32 arrays;
  // lengths [B] (each 0..S) or null for all positions valid. Throws hk::Error on bad arguments.
  virtual void forward(const float* x, const int32_t* lengths, int B, float* y) = 0;
  // The kernel plan for a batch of B sequences, one line per kernel.
  virtual std::string explain(int B) const = 0;
  // Optional: pays ahead what the first forward() of B sequences holding `tokens` valid positions
  // in all would pay once (planning, library set-up, graph capture), on synthetic data, e.g. on
  // another thread while the input is read. Results are unaffected. Default: nothing.
  virtual void warm_up(int B, int64_t tokens) { (void)B, (void)tokens; }
  // Backend-specific figures of this engine's own set-up work, as "key=value ..." for a
  // statistics line (e.g. hk_forward --stats); "" when there are none.
  virtual std::string stats() const { return ""; }
};

// A backend: a named factory of engines.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Empty when this backend can run here; otherwise why not ("built without CUDA", "no GPU").
  virtual std::string unavailable_reason() const = 0;
  virtual std::unique_ptr<Engine> create(const Model& model, const EngineOptions& options) const = 0;
  // Optional: the one-time start-up of `device` that create() would otherwise pay (the driver
  // context), done ahead, e.g. on another thread while the input is read. Libraries an engine
  // may not need are left to the engine. Thread-safe, idempotent; failures are left for create()
  // to report. Default: nothing.
  virtual void prepare(int device) const { (void)device; }
};

// Every backend compiled into this build, in preference order for "auto".
std::vector<const Backend*> backends();
// The backend `name` ("auto": the first usable one) would run on; throws hk::Error when it is
// unknown or not usable here (the message make_engine gives).
const Backend& select_backend(const std::string& name);
std::unique_ptr<Engine> make_engine(const Model& model, const EngineOptions& options);

}  // namespace hk
