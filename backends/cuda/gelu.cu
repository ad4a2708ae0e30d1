// Exact-erf GELU, in place (see gelu.cuh).
#include "gelu.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "common.cuh"

namespace hk::cuda {
namespace {

constexpr int kThreads = 256;
// Grid-stride loop: enough blocks to fill any current GPU several times over, no more.
constexpr int64_t kMaxBlocks = 8192;

__device__ __forceinline__ float gelu_erf(float z) {
  return 0.5f * z * (1.f + erff(z * 0.70710678118654752f));
}

// 16 bytes = 8 halves or 4 floats per vector; elements past the last full vector are scalar.
template <class T>
__global__ void __launch_bounds__(kThreads) gelu_erf_kernel(T* f, int64_t n) {
  constexpr int kVec = 16 / int(sizeof(T));
  const int64_t n_vec = n / kVec;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t start = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = start; i < n_vec; i += stride) {
    uint4 raw = reinterpret_cast<const uint4*>(f)[i];
    if constexpr (sizeof(T) == 2) {
      __half2* h = reinterpret_cast<__half2*>(&raw);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 z = __half22float2(h[j]);
        h[j] = __floats2half2_rn(gelu_erf(z.x), gelu_erf(z.y));
      }
    } else {
      float* z = reinterpret_cast<float*>(&raw);
#pragma unroll
      for (int j = 0; j < 4; ++j) z[j] = gelu_erf(z[j]);
    }
    reinterpret_cast<uint4*>(f)[i] = raw;
  }
  for (int64_t i = n_vec * kVec + start; i < n; i += stride) {
    if constexpr (sizeof(T) == 2) {
      f[i] = __float2half_rn(gelu_erf(__half2float(f[i])));
    } else {
      f[i] = gelu_erf(f[i]);
    }
  }
}

template <class T>
void launch(void* f, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (reinterpret_cast<uintptr_t>(f) % 16 != 0) throw CudaError("gelu_erf_inplace: buffer is not 16-byte aligned");
  const int64_t vec = 16 / int64_t(sizeof(T));
  const int64_t work = std::max<int64_t>(n / vec, 1);
  const int64_t blocks = std::min<int64_t>((work + kThreads - 1) / kThreads, kMaxBlocks);
  gelu_erf_kernel<T><<<unsigned(blocks), kThreads, 0, s>>>(static_cast<T*>(f), n);
  HK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gelu_erf_inplace(void* f, DType type, int64_t n, cudaStream_t stream) {
  if (type == DType::f16) {
    launch<__half>(f, n, stream);
  } else {
    launch<float>(f, n, stream);
  }
}

}  // namespace hk::cuda
