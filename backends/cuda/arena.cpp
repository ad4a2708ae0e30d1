#include "arena.hpp"

#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common.cuh"
#include "weights.hpp"  // kTensorAlign

namespace hk::cuda {

ActivationLayout activation_layout(const ModelConfig& c, int max_batch, int seq_len, Precision precision,
                                   size_t workspace_bytes) {
  ActivationLayout l;
  l.max_tokens = int64_t(max_batch) * seq_len;
  l.act = precision == Precision::fast ? DType::f16 : DType::f32;
  const size_t T = size_t(l.max_tokens), D = size_t(c.d_model), F = size_t(c.ffn_dim);
  const size_t act = l.act == DType::f16 ? 2 : 4;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t off = at;
    at = (at + bytes + kTensorAlign - 1) / kTensorAlign * kTensorAlign;
    return off;
  };
  l.x_in = take(T * D * 4);
  l.x = take(T * D * 4);
  l.h = take(T * D * act);
  l.qkv = take(T * 3 * D * act);
  l.o = take(T * D * act);
  l.f = take(T * F * act);
  l.y[0] = take(T * D * 4);
  l.y[1] = take(T * D * 4);
  l.lengths_in = take(size_t(max_batch) * 4);
  l.lengths_full = take(size_t(max_batch) * 4);
  l.seq_start = take((size_t(max_batch) + 1) * 4);
  l.row_dst = take(T * 4);
  l.pack_flag = take(4);
  l.workspace_bytes = workspace_bytes;
  l.workspace = take(workspace_bytes);
  l.total = at;
  return l;
}

namespace {
std::string gib(size_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GiB", double(bytes) / double(size_t(1) << 30));
  return b;
}
}  // namespace

// cudaMalloc / cudaMallocHost with a one-line error naming what could not be allocated; a failed
// allocation's error is cleared so that later CUDA calls of the process do not report it again.
void allocate(void** p, size_t bytes, bool pinned, const char* what) {
  const cudaError_t e = pinned ? cudaMallocHost(p, bytes) : cudaMalloc(p, bytes);
  if (e == cudaSuccess) return;
  cudaGetLastError();
  *p = nullptr;
  std::string msg = std::string(what) + ": cannot allocate " + gib(bytes) + (pinned ? " of pinned host memory" : " on the device") +
                    " (" + cudaGetErrorString(e);
  size_t free_b = 0, total_b = 0;
  if (!pinned && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) msg += "; " + gib(free_b) + " free of " + gib(total_b);
  cudaGetLastError();
  throw CudaError(msg + ")");
}

DeviceArena::DeviceArena(const ActivationLayout& layout, int max_batch, int seq_len, bool poison)
    : layout_(layout) {
  const std::string what = "activation arena for " + std::to_string(max_batch) + " x " + std::to_string(seq_len) + " tokens";
  allocate(&base_, layout.total, false, what.c_str());
  try {
    HK_CUDA_CHECK(cudaMemset(base_, poison ? 0xFF : 0, layout.total));
    // The packing kernel's overflow flag is state, not data: it starts cleared whatever the fill.
    HK_CUDA_CHECK(cudaMemset(static_cast<unsigned char*>(base_) + layout.pack_flag, 0, 4));
    std::vector<int32_t> full(size_t(max_batch), seq_len);
    auto* b = static_cast<unsigned char*>(base_);
    HK_CUDA_CHECK(cudaMemcpy(b + layout.lengths_full, full.data(), full.size() * 4, cudaMemcpyHostToDevice));
    buf_.x_in = reinterpret_cast<float*>(b + layout.x_in);
    buf_.x = reinterpret_cast<float*>(b + layout.x);
    buf_.h = b + layout.h;
    buf_.qkv = b + layout.qkv;
    buf_.o = b + layout.o;
    buf_.f = b + layout.f;
    buf_.y[0] = reinterpret_cast<float*>(b + layout.y[0]);
    buf_.y[1] = reinterpret_cast<float*>(b + layout.y[1]);
    buf_.lengths_in = reinterpret_cast<int32_t*>(b + layout.lengths_in);
    buf_.lengths_full = reinterpret_cast<int32_t*>(b + layout.lengths_full);
    buf_.seq_start = reinterpret_cast<int32_t*>(b + layout.seq_start);
    buf_.row_dst = reinterpret_cast<int32_t*>(b + layout.row_dst);
    buf_.pack_flag = reinterpret_cast<int32_t*>(b + layout.pack_flag);
    buf_.workspace = b + layout.workspace;
  } catch (...) {
    cudaFree(base_);
    throw;
  }
}

DeviceArena::~DeviceArena() { cudaFree(base_); }

DeviceBuffer::DeviceBuffer(size_t bytes) : n_(bytes) {
  if (bytes) allocate(&p_, bytes, false, "device buffer");
}
DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(p_, o.p_);
  std::swap(n_, o.n_);
  return *this;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : n_(bytes) {
  if (bytes) allocate(&p_, bytes, true, "pinned staging buffer");
}
PinnedBuffer::~PinnedBuffer() {
  if (p_) cudaFreeHost(p_);
}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  std::swap(p_, o.p_);
  std::swap(n_, o.n_);
  return *this;
}

}  // namespace hk::cuda
