// The whole forward of MODEL.md in one persistent CUDA kernel for small models (fast precision:
// fp16 GEMM operands, fp32 accumulation, fp32 residual and LayerNorm statistics):
//   for each layer: h = LN1(x); q, k, v = h Wqkv^T + b; o = attention; x += o Wo^T + bo;
//                   h = LN2(x); x += GELU(h Wi^T + bi) Wf^T + bf
//   y = LN(x; final_norm), zeros on padded rows
// A CTA takes whole sequences: it reads x once, keeps the activations on chip for all L layers
// (the fp32 residual in the mma accumulator registers of the warp that owns its 16-row tile,
// h / q / k / v / o / f tiles in shared memory), streams every layer's weights from L2 through a
// two-stage cp.async buffer, and writes y once. Only the ceil(len / 16) row tiles of a sequence
// that hold valid tokens do any work; the other rows of y are written as zeros.
// Two kernels serve the same contract (PersistentKernel):
//   tiles    CTA = 8 warps; a warp owns one 16-row tile for the whole forward (its fp32 residual in
//            mma accumulator registers) and computes every product of its rows; several short
//            sequences share a CTA. Work per warp is that of its tile: good when the batch fills
//            the GPU with many tiles.
//   columns  CTA = 16 warps, one sequence per CTA; every product is split over the warps by
//            output columns across all the sequence's valid row tiles (B fragments straight from
//            L2 into registers), attention split into (head, query tile) tasks, LayerNorms row per
//            warp on an fp32 residual in shared memory. A short batch (case 2: one sequence of a
//            few dozen valid rows) still has 16 warps at work per sequence.
//   Shared memory of columns (own rows nl = 16 ceil(ceil(S / 16) / N) for N CTAs per sequence, all
//   rows = 16 ceil(S / 16)): nl ((D + 4) 4 + (D + 8) 2 + (max(D, F) + 8) 2) + (N > 1 ? 2 : 1) all
//   (2D + 8) 2 (+ 16 for two mbarriers when N > 1) bytes: 204,800 at D = F = 128, S = 128, N = 1
//   (170,512 at N = 4); the same D / head_dim / F / S limits. Launched with programmatic dependent
//   launch (it waits for the stream's earlier kernels before reading x). With N >= 4 the k / v
//   tiles travel by bulk copies (TMA engine) completing on the receivers' mbarriers.
// Host-compilable header: declarations only; the kernels and the launch layer are in
// model_persistent.cu.
//
// Limits (and where they come from):
//   D in {64, 128}      the residual row block lives in registers: D/2 fp32 per thread per
//                       16-row tile (64 at D = 128, next to a 64-register projection
//                       accumulator: 8 warps x 255 registers = one CTA per SM); one kernel
//                       instantiation per (D, head_dim)
//   head_dim in {8, 16, 32, 64, 128}, H * head_dim = D
//   F a multiple of 16, 16 <= F <= 128    the ffn_in accumulator (F/2 registers) next to the
//                       residual, and the Wi / Wf panels in one weight stage
//   1 <= S <= 128       one sequence = at most 8 row tiles of 16 = the CTA's 8 warps, all keys
//                       resident in shared memory
//   any L >= 1          weights are streamed layer by layer
//   shared memory (bytes; rows = 16 * tiles per pass <= 128; LDQ = max(D, F) + 8):
//     h, k, v  3 * rows * (D + 8) * 2          D=128, rows=128: 104,448
//     q/o/f    rows * LDQ * 2                                      34,816
//     weights  2 stages * (1,536 + 2 * max(D(D+8), F(D+8), D(F+8)))  72,704
//     ln1 of layer 0: 2 * D * 4                                     1,024
//   D = F = 128, S = 128: 212,992 B: fits the H200 (232,448 opt-in), not the A100 (166,912),
//   where only shorter sequences / narrower models are supported (supports() checks the device).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "hk/config.hpp"
#include "weights.hpp"

namespace hk::cuda {

// One layer's device pointers as the kernel reads them (a POD array in device memory, built from
// DeviceWeights: fp16 GEMM weights, q|k|v fused [3D, D] with a [3D] fp16 bias, fp32 residual
// biases and LayerNorm parameters).
struct PersistentLayer {
  const float* ln1_w;
  const float* ln1_b;
  const __half* w_qkv;   // [3D, D]
  const __half* b_qkv;   // [3D]
  const __half* w_o;     // [D, D]
  const float* b_o;      // [D]
  const float* ln2_w;
  const float* ln2_b;
  const __half* w_in;    // [F, D]
  const __half* b_in;    // [F]
  const __half* w_out;   // [D, F]
  const float* b_out;    // [D]
};

// columns_cN: the column kernel with each sequence split over a thread-block cluster of N CTAs
// (compute capability 9.0+): CTA rank c owns row tiles c, c + N, ...; k / v rows reach every CTA
// of the cluster through distributed shared memory.
enum class PersistentKernel { tiles, columns, columns_c2, columns_c4, columns_c8 };
constexpr PersistentKernel kPersistentKernels[] = {PersistentKernel::tiles, PersistentKernel::columns,
                                                   PersistentKernel::columns_c2, PersistentKernel::columns_c4,
                                                   PersistentKernel::columns_c8};
// CTAs that run one sequence: 1 (tiles, columns), 2, 4 or 8 (columns_cN).
constexpr int persistent_ctas_per_sequence(PersistentKernel k) {
  return k == PersistentKernel::columns_c2 ? 2
         : k == PersistentKernel::columns_c4 ? 4
         : k == PersistentKernel::columns_c8 ? 8
                                             : 1;
}

// The host table of the first `layers` layers of `weights` (fp16 weights required:
// Precision::fast). Throws std::invalid_argument for fp32 weights, std::out_of_range when
// `weights` holds fewer layers.
std::vector<PersistentLayer> persistent_layer_table(const DeviceWeights& weights, int layers);

// True when the kernel can run this model at sequence length S on the current device (limits
// above, shared memory within the device's opt-in limit). Also raises the kernel's dynamic
// shared-memory limit once per process, so calling it before a graph capture keeps the capture
// free of attribute changes.
bool model_persistent_supports(const ModelConfig& config, int S, PersistentKernel kind = PersistentKernel::tiles);

// The per-layer pointer table uploaded once (one cudaMalloc + a synchronous copy). `weights` must
// outlive this object. Throws std::invalid_argument when `weights` is not fp16 or its layer count
// differs from config.n_layers.
class PersistentModel {
 public:
  PersistentModel(const ModelConfig& config, const DeviceWeights& weights);
  ~PersistentModel();
  PersistentModel(const PersistentModel&) = delete;
  PersistentModel& operator=(const PersistentModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const PersistentLayer* device_layers() const { return layers_; }
  const float* final_w() const { return final_w_; }
  const float* final_b() const { return final_b_; }

 private:
  ModelConfig config_;
  PersistentLayer* layers_ = nullptr;  // device [L]
  const float* final_w_ = nullptr;
  const float* final_b_ = nullptr;
};

// The forward on `stream`: x [B, S, D] fp32, lengths [B] int32 (device; null = all S valid;
// values are clamped to 0..S), y [B, S, D] fp32; x and y 16-byte aligned device pointers, y may be
// x (each sequence's x rows are read before its y rows are written, by the same CTA). Launch only:
// no synchronisation, no allocation, graph-capturable (call supports() once before a capture).
// Throws std::invalid_argument when !model_persistent_supports(model.config(), S) or a pointer is
// null / misaligned. B == 0 launches nothing.
// trace (profiling; column kernels only, ignored by `tiles`): null, or a device buffer of
// persistent_ctas_per_sequence(kind) * kPersistentTraceWarps rows of persistent_trace_events(L)
// values, row 16 r + w = warp w of CTA rank r of sequence 0's cluster. Lane 0 of each warp writes
// its SM clock (clock64) at event 0 = the sequence's start, 1 + 9 l + p = layer l's event p (p: 0
// q|k|v product starts, 1 it ends, 2 k / v exchange done, 3 attention done, 4 out_proj starts,
// 5 LN2 starts, 6 ffn_in starts, 7 ffn_out starts, 8 next LN1 / final LayerNorm starts), and
// 1 + 9 L = the sequence's end. Events 0, 4 .. 8 follow a CTA barrier (equal over the warps).
constexpr int kPersistentTraceWarps = 16;
__host__ __device__ constexpr int persistent_trace_events(int layers) { return 2 + 9 * layers; }
void model_persistent_forward(const PersistentModel& model, int S, const float* x, const int32_t* lengths, int B,
                              float* y, cudaStream_t stream, PersistentKernel kind = PersistentKernel::tiles,
                              unsigned long long* trace = nullptr);

// Profiler name: "hk::model[cuda.persistent.d128]" / "...d64]" (tiles), "hk::model[cuda.persistent.cols.d128]" /
// "...cols.d64]" (columns), "...cols.c4.d128]" (columns_c4, ...); "" when D is not served.
const char* model_persistent_name(const ModelConfig& config, PersistentKernel kind = PersistentKernel::tiles);

}  // namespace hk::cuda
