// Device memory of one CUDA engine: every activation buffer a forward touches, carved from one
// allocation sized for max_batch * seq_len token rows at construction, so that no forward
// allocates. Also small RAII holders for other device and pinned host buffers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention.hpp"  // DType
#include "hk/config.hpp"

namespace hk::cuda {

// Byte offsets of the buffers (plan.hpp's names), each 256-byte aligned. Pure host code.
struct ActivationLayout {
  int64_t max_tokens = 0;
  DType act = DType::f16;  // h, qkv, o, f
  size_t x_in = 0;      // fp32 [T, D]  the host path's upload of x
  size_t x = 0;         // fp32 [T, D]  residual stream
  size_t h = 0;         // act  [T, D]
  size_t qkv = 0;       // act  [T, 3D]
  size_t o = 0;         // act  [T, D]
  size_t f = 0;         // act  [T, F]
  size_t y[2] = {0, 0}; // fp32 [T, D]  alternating outputs
  size_t lengths_in = 0;    // int32 [max_batch]  the host path's upload of lengths
  size_t lengths_full = 0;  // int32 [max_batch]  all S (lengths absent)
  size_t seq_start = 0;     // int32 [max_batch + 1]  packed layout: first row of each sequence, then T
  size_t row_dst = 0;       // int32 [T]  packed layout: the padded row of each packed row (-1: none)
  size_t pack_flag = 0;     // int32  set by the packing kernel when the valid tokens exceed the plan's rows
  size_t workspace = 0;     // cuBLASLt workspace
  size_t workspace_bytes = 0;
  size_t total = 0;
};
ActivationLayout activation_layout(const ModelConfig& config, int max_batch, int seq_len, Precision precision,
                                   size_t workspace_bytes);

struct Activations {
  float* x_in;
  float* x;
  void* h;
  void* qkv;
  void* o;
  void* f;
  float* y[2];
  int32_t* lengths_in;
  int32_t* lengths_full;
  int32_t* seq_start;
  int32_t* row_dst;
  int32_t* pack_flag;
  void* workspace;
};

// cudaMalloc (or cudaMallocHost when pinned) of `bytes`, or a CudaError naming `what`, the size
// and the free device memory; the failed call's error is cleared (nothing sticky is left behind).
void allocate(void** p, size_t bytes, bool pinned, const char* what);

class DeviceArena {
 public:
  // poison: fill every buffer with 0xFF bytes (NaN in fp16 and fp32) instead of zeros, so that a
  // kernel reading an element nobody wrote shows up in the output (tests set HK_CUDA_POISON=1).
  DeviceArena(const ActivationLayout& layout, int max_batch, int seq_len, bool poison);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  const Activations& buffers() const { return buf_; }
  size_t bytes() const { return layout_.total; }

 private:
  ActivationLayout layout_;
  void* base_ = nullptr;
  Activations buf_{};
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  void* get() const { return p_; }
  size_t bytes() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  void* get() const { return p_; }
  size_t bytes() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace hk::cuda
