// Elementwise GELU of the CUDA backend's ffn_in split route: exact erf GELU applied in place to
// the bias-added GEMM output (cuBLASLt's own GELU epilogue is the tanh approximation).
// Host-compilable header; the kernel is static in gelu.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention.hpp"  // DType

namespace hk::cuda {

// f[i] = 0.5 f[i] (1 + erf(f[i] / sqrt 2)) for i < n, in fp32, stored back as `type`.
// f is a flat array (a [rows, F] activation of any F); 16-byte vectors with a scalar tail.
void gelu_erf_inplace(void* f, DType type, int64_t n, cudaStream_t stream);

}  // namespace hk::cuda
