// The op interface: the forward pass as a fixed sequence of steps over named buffers, and
// backends as tables of kernels, each covering one step or a chain of consecutive steps.
//
// Buffers (one set per forward call, T = token rows):
//   x    residual stream, fp32 [T, D]     (starts as the input)
//   h    normalised activations [T, D]    (backend's activation type)
//   qkv  fused projections [T, 3D]        (q | k | v, head h at columns h*hd of each third)
//   o    attention output [T, D]          ([B, S, H, hd] order)
//   f    FFN hidden [T, F]
//   y    output, fp32 [T, D]
// Steps per layer l, then the tail (MODEL.md):
//   ln1       h   = LN(x; layers.l.norm1)
//   qkv_proj  qkv = h [Wq; Wk; Wv]^T + [bq; bk; bv]
//   attention o   = softmax(mask(q k^T / sqrt(hd))) v        (padding from lengths, causal)
//   out_proj  x   = x + o Wo^T + bo
//   ln2       h   = LN(x; layers.l.norm2)
//   ffn_in    f   = GELU(h Wi^T + bi)                        (exact erf GELU)
//   ffn_out   x   = x + f Wf^T + bf
//   final_ln  y   = LN(x; final_norm), rows s >= lengths[b] zero
// A kernel that covers a chain (say out_proj .. next ln1) may keep the intermediates on chip:
// only the buffers read after the chain must hold their values. The planner asks each kernel
// how many steps it covers at a position; the first kernel in the backend's table that covers
// any wins (tables list fused chains before single steps), so a backend replaces any single op
// or any chain without touching the others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "hk/config.hpp"
#include "hk/error.hpp"

namespace hk {

enum class StepKind : uint8_t { ln1, qkv_proj, attention, out_proj, ln2, ffn_in, ffn_out, final_ln };

struct Step {
  StepKind kind;
  int layer;  // -1 for final_ln
};

const char* to_string(StepKind k);
std::vector<Step> forward_steps(int n_layers);

// What a kernel may depend on when it decides whether it covers a step.
struct Shape {
  int batch = 0;    // B of this call
  int seq_len = 0;  // S
  ModelConfig config;
  Precision precision = Precision::fast;
  int64_t tokens() const { return int64_t(batch) * seq_len; }
};

template <class Ctx>
struct Kernel {
  std::string name;  // profiler-visible, e.g. "hk::layer_norm[kokkos]"
  // Number of consecutive steps starting at steps[at] this kernel executes for `shape`; 0 = none.
  std::function<int(const std::vector<Step>& steps, size_t at, const Shape& shape)> covers;
  std::function<void(Ctx& ctx, const Step* first, int count)> run;
};

template <class Ctx>
struct PlannedKernel {
  const Kernel<Ctx>* kernel;
  size_t first;
  int count;
};

// Steps[at..] begin with exactly `kinds` (one chain); returns its length or 0.
int match_chain(const std::vector<Step>& steps, size_t at, std::initializer_list<StepKind> kinds);

// A kernel covering exactly one step of `kind` whenever `supported(shape)` holds.
template <class Ctx>
Kernel<Ctx> single_step_kernel(std::string name, StepKind kind,
                               std::function<void(Ctx&, const Step&)> run,
                               std::function<bool(const Shape&)> supported = nullptr) {
  Kernel<Ctx> k;
  k.name = std::move(name);
  k.covers = [kind, supported](const std::vector<Step>& steps, size_t at, const Shape& s) {
    return (steps[at].kind == kind && (!supported || supported(s))) ? 1 : 0;
  };
  k.run = [run](Ctx& ctx, const Step* first, int) { run(ctx, *first); };
  return k;
}

template <class Ctx>
std::vector<PlannedKernel<Ctx>> make_plan(const std::vector<Step>& steps,
                                          const std::vector<Kernel<Ctx>>& table,
                                          const Shape& shape) {
  std::vector<PlannedKernel<Ctx>> plan;
  for (size_t at = 0; at < steps.size();) {
    const Kernel<Ctx>* chosen = nullptr;
    int n = 0;
    for (const auto& k : table) {
      n = k.covers(steps, at, shape);
      if (n > 0) {
        chosen = &k;
        break;
      }
    }
    if (!chosen)
      throw Error(std::string("no kernel covers step ") + to_string(steps[at].kind) +
                  " of layer " + std::to_string(steps[at].layer) + " for this shape");
    if (at + size_t(n) > steps.size()) throw Error("kernel " + chosen->name + " overruns the plan");
    plan.push_back({chosen, at, n});
    at += size_t(n);
  }
  return plan;
}

template <class Ctx>
void run_plan(const std::vector<PlannedKernel<Ctx>>& plan, const std::vector<Step>& steps, Ctx& ctx) {
  for (const auto& p : plan) p.kernel->run(ctx, &steps[p.first], p.count);
}

// One line per planned kernel: "layer 0  ln1            hk::layer_norm[kokkos]".
template <class Ctx>
std::string describe_plan(const std::vector<PlannedKernel<Ctx>>& plan, const std::vector<Step>& steps) {
  std::string out;
  for (const auto& p : plan) {
    const Step& s = steps[p.first];
    std::string what = to_string(s.kind);
    if (p.count > 1) what += ".." + std::string(to_string(steps[p.first + p.count - 1].kind));
    out += (s.layer >= 0 ? "layer " + std::to_string(s.layer) : std::string("tail   ")) + "  " + what +
           std::string(what.size() < 22 ? 22 - what.size() : 1, ' ') + p.kernel->name + "\n";
  }
  return out;
}

}  // namespace hk
