// fp16 GEMM with a bias epilogue for short inner dimensions: c = fp16(a w^T + bias), fp32
// accumulation, one rounding at the end (the semantics of cuBLASLt's bias epilogue with fp16 D).
// The engine offers it as one more algorithm of the QKV projection (K = D <= 256): where rows are
// few, the cuBLASLt launch and its operand staging sit on the critical path between the fused
// kernels, whereas this kernel is launched with programmatic dependent launch (launch.hpp) and
// stages its weight tile and bias in shared memory before it waits for the previous kernel.
//
// One CTA of 4 warps holds a BN x K weight tile in shared memory and computes 64 x BN tiles of c,
// one row tile after another (a persistent grid of one wave where rows are many), the next row
// tile's a loaded into a second buffer while the current one is multiplied; warp w owns rows
// 16w..16w+15 and all BN columns (mma.sync m16n8k16 from ldmatrix fragments); c goes out through
// the warp's own a rows as 16-byte stores. Rows past `rows` are zero-filled and never stored.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hk::cuda {

struct SmallGemmParams {
  const __half* a = nullptr;     // [rows, k] row-major, 16-byte aligned
  const __half* w = nullptr;     // [n, k] row-major ([N, K] weight layout), 16-byte aligned
  const __half* bias = nullptr;  // [n]
  __half* c = nullptr;           // [rows, n], 16-byte aligned; must not overlap a
  int64_t rows = 0;              // 0 <= rows < 2^31
  int n = 0;
  int k = 0;
};

// Columns per CTA (32, 64 or 128; at most k); 0 = automatic.
struct SmallGemmConfig {
  int bn = 0;
};

// k a multiple of 16 in [32, 256], n a positive multiple of 32, and the smallest tile fits the
// current device's opt-in shared memory. Raises the kernels' shared-memory limits once per
// process (current device): call it before a graph capture.
bool small_gemm_supports(int n, int k);
// The automatic configuration first, then every other tile width that applies (each distinct).
std::vector<SmallGemmConfig> small_gemm_candidates(int64_t rows, int n, int k);
// The tile width a launch with `config` uses (automatic resolved).
int small_gemm_bn(int64_t rows, int n, int k, SmallGemmConfig config = {});
// "hk::gemm[cuda.mma.bias.bn64]"; "" if unsupported.
std::string small_gemm_name(int64_t rows, int n, int k, SmallGemmConfig config = {});
// Launch only (graph-capturable, no allocation); rows == 0 launches nothing. Throws
// std::invalid_argument for unsupported shapes, null or misaligned pointers, an unusable config.
void small_gemm_bias(const SmallGemmParams& p, cudaStream_t stream, SmallGemmConfig config = {});

}  // namespace hk::cuda
