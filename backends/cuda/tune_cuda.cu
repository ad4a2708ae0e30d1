// The numeric guard's reduction (tune_cuda.hpp): max |a - b| / max(1, |b|) over the valid rows of
// two device buffers, one pass, one atomic per block.
#include <cuda_fp16.h>

#include <cstdint>

#include "common.cuh"
#include "tune_cuda.hpp"

namespace hk::cuda {
namespace {

template <class T>
__device__ float load(const T* p, int64_t i);
template <>
__device__ float load<float>(const float* p, int64_t i) {
  return p[i];
}
template <>
__device__ float load<__half>(const __half* p, int64_t i) {
  return __half2float(p[i]);
}

__device__ float pair_diff(float x, float y) {
  if (isfinite(x) && isfinite(y)) return fabsf(x - y) / fmaxf(1.f, fabsf(y));
  const bool same = (isnan(x) && isnan(y)) || (isinf(x) && x == y);
  return same ? 0.f : INFINITY;
}

// One block per row chunk: blockIdx.y strides rows, threads stride columns. Non-negative floats
// order like their bit patterns, so an unsigned atomicMax keeps the maximum.
template <class T>
__global__ void max_abs_diff_kernel(const T* a, const T* b, int64_t rows, int cols, int64_t stride,
                                    const int32_t* lengths, int S, unsigned* out) {
  float m = 0.f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    if (lengths && (r % S) >= lengths[r / S]) continue;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      const int64_t i = r * stride + c;
      m = fmaxf(m, pair_diff(load(a, i), load(b, i)));
    }
  }
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ float warp_max[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < int(blockDim.x >> 5) ? warp_max[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) atomicMax(out, __float_as_uint(m));
  }
}

}  // namespace

double max_abs_diff(const void* a, const void* b, DType type, int64_t rows, int cols, int64_t row_stride,
                    const int32_t* lengths, int S, float* result, cudaStream_t stream) {
  HK_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(float), stream));
  if (rows > 0 && cols > 0) {
    const int threads = 256;
    const unsigned blocks = unsigned(rows < 8192 ? rows : 8192);
    auto* out = reinterpret_cast<unsigned*>(result);
    if (type == DType::f16) {
      max_abs_diff_kernel<__half><<<blocks, threads, 0, stream>>>(static_cast<const __half*>(a),
                                                                  static_cast<const __half*>(b), rows, cols,
                                                                  row_stride, lengths, S, out);
    } else {
      max_abs_diff_kernel<float><<<blocks, threads, 0, stream>>>(static_cast<const float*>(a),
                                                                 static_cast<const float*>(b), rows, cols,
                                                                 row_stride, lengths, S, out);
    }
    HK_CUDA_CHECK_LAUNCH();
  }
  float h = 0;
  HK_CUDA_CHECK(cudaMemcpyAsync(&h, result, sizeof(float), cudaMemcpyDeviceToHost, stream));
  HK_CUDA_CHECK(cudaStreamSynchronize(stream));
  return double(h);
}

}  // namespace hk::cuda
