// LayerNorm row kernels (see rownorm.cuh). One templated kernel covers the warp-per-row and the
// block-per-row layouts; a looping kernel covers rows too wide to keep in registers.
#include "rownorm.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <climits>

#include "common.cuh"

namespace hk::cuda {
namespace {

// Launch tables, one line per choice:
//   warp per row: 4 rows per 128-thread block keep the SM's warp slots full with no block sync;
//     vec 4 covers D <= 32 * 4 * 8 = 1024 with at most 32 row floats per thread.
//   block per row (256 threads): D up to 256 * 32 = 8192 floats in registers.
//   beyond that the row is read from memory three times (rare: d_model > 8192).
constexpr int kWarp = 32;
constexpr int kWarpRowsPerBlock = 4;
constexpr int kBlockThreads = 256;
constexpr int kMaxRowFloatsPerThread = 32;

struct RowNormArgs {
  const float* x;
  void* out;
  const float* w;
  const float* b;
  int64_t rows;
  int D;
  float eps;
  const int32_t* lengths;  // final only: padded rows are zeroed
  int S;                   // final only: positions per sequence
};

template <int VEC>
__device__ __forceinline__ void load_vec(float (&v)[VEC], const float* p) {
  if constexpr (VEC == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = p[j];
  }
}

template <int VEC>
__device__ __forceinline__ void store_vec(float* p, const float (&v)[VEC]) {
  if constexpr (VEC == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) p[j] = v[j];
  }
}

template <int VEC>
__device__ __forceinline__ void store_vec(__half* p, const float (&v)[VEC]) {
  if constexpr (VEC == 4) {
    // 4 halves = one 8-byte store; rows of D % 4 == 0 halves are 8-byte aligned.
    __half2 lo = __floats2half2_rn(v[0], v[1]);
    __half2 hi = __floats2half2_rn(v[2], v[3]);
    uint2 t;
    t.x = *reinterpret_cast<unsigned*>(&lo);
    t.y = *reinterpret_cast<unsigned*>(&hi);
    *reinterpret_cast<uint2*>(p) = t;
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) p[j] = __float2half_rn(v[j]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the threads of one row. TPR == 32: the warp; else the whole block (one row).
template <int TPR>
__device__ __forceinline__ float row_sum(float v) {
  v = warp_sum(v);
  if constexpr (TPR == kWarp) {
    return v;
  } else {
    __shared__ float part[TPR / kWarp];
    __syncthreads();  // the previous reduction's readers are done with `part`
    if ((threadIdx.x & (kWarp - 1)) == 0) part[threadIdx.x / kWarp] = v;
    __syncthreads();
    float t = 0.f;
#pragma unroll
    for (int i = 0; i < TPR / kWarp; ++i) t += part[i];
    return t;
  }
}

__device__ __forceinline__ bool row_is_padding(const RowNormArgs& a, int64_t row) {
  if (a.lengths == nullptr) return false;
  const int64_t seq = row / a.S;
  return row - seq * a.S >= a.lengths[seq];
}

template <class OutT, int VEC, int NV, int TPR, bool FINAL>
__global__ void __launch_bounds__(TPR == kWarp ? kWarp * kWarpRowsPerBlock : TPR)
    row_norm_kernel(const RowNormArgs a) {
  constexpr int kRowsPerBlock = TPR == kWarp ? kWarpRowsPerBlock : 1;
  const int tid = TPR == kWarp ? int(threadIdx.x & (kWarp - 1)) : int(threadIdx.x);
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (TPR == kWarp ? threadIdx.x / kWarp : 0);
  if (row >= a.rows) return;  // uniform per row: a whole warp (or block) leaves together
  const int D = a.D;
  OutT* out = static_cast<OutT*>(a.out) + row * D;

  if constexpr (FINAL) {
    if (row_is_padding(a, row)) {
      float z[VEC] = {};
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int col = (i * TPR + tid) * VEC;
        if (col < D) store_vec(out + col, z);
      }
      return;
    }
  }

  const float* x = a.x + row * D;
  float v[NV][VEC];
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int col = (i * TPR + tid) * VEC;
    if (col < D) {
      load_vec(v[i], x + col);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[i][j] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum += v[i][j];
  }
  const float mean = row_sum<TPR>(sum) / float(D);

  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int col = (i * TPR + tid) * VEC;
    if (col < D) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float d = v[i][j] - mean;
        sq += d * d;
      }
    }
  }
  const float rstd = rsqrtf(row_sum<TPR>(sq) / float(D) + a.eps);

#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int col = (i * TPR + tid) * VEC;
    if (col < D) {
      float w[VEC], b[VEC], o[VEC];
      load_vec(w, a.w + col);
      load_vec(b, a.b + col);
#pragma unroll
      for (int j = 0; j < VEC; ++j) o[j] = (v[i][j] - mean) * rstd * w[j] + b[j];
      store_vec(out + col, o);
    }
  }
}

// Rows wider than the register budget: one block per row, three passes over the row in memory
// (mostly L1/L2 hits after the first).
template <class OutT, bool FINAL>
__global__ void __launch_bounds__(kBlockThreads) row_norm_loop_kernel(const RowNormArgs a) {
  const int64_t row = blockIdx.x;
  const int D = a.D;
  OutT* out = static_cast<OutT*>(a.out) + row * D;
  if constexpr (FINAL) {
    if (row_is_padding(a, row)) {
      for (int c = threadIdx.x; c < D; c += kBlockThreads) out[c] = OutT(0.f);
      return;
    }
  }
  const float* x = a.x + row * D;
  float sum = 0.f;
  for (int c = threadIdx.x; c < D; c += kBlockThreads) sum += x[c];
  const float mean = row_sum<kBlockThreads>(sum) / float(D);
  float sq = 0.f;
  for (int c = threadIdx.x; c < D; c += kBlockThreads) {
    const float d = x[c] - mean;
    sq += d * d;
  }
  const float rstd = rsqrtf(row_sum<kBlockThreads>(sq) / float(D) + a.eps);
  for (int c = threadIdx.x; c < D; c += kBlockThreads) {
    const float o = (x[c] - mean) * rstd * a.w[c] + a.b[c];
    if constexpr (sizeof(OutT) == 2) {
      out[c] = __float2half_rn(o);
    } else {
      out[c] = o;
    }
  }
}

unsigned grid_for(int64_t blocks) {
  if (blocks > INT_MAX) throw CudaError("row kernel: too many rows for one launch");
  return unsigned(blocks);
}

template <class OutT, int VEC, int NV, int TPR, bool FINAL>
void launch_rows(const RowNormArgs& a, cudaStream_t s) {
  static_assert(NV * VEC <= kMaxRowFloatsPerThread, "row slice would not fit the register budget");
  if constexpr (TPR == kWarp) {
    const int64_t blocks = (a.rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock;
    row_norm_kernel<OutT, VEC, NV, TPR, FINAL><<<grid_for(blocks), kWarp * kWarpRowsPerBlock, 0, s>>>(a);
  } else {
    row_norm_kernel<OutT, VEC, NV, TPR, FINAL><<<grid_for(a.rows), TPR, 0, s>>>(a);
  }
  HK_CUDA_CHECK_LAUNCH();
}

// The single place that turns choose_row_norm_launch() into a template instantiation.
template <class OutT, bool FINAL>
void dispatch(const RowNormArgs& a, cudaStream_t s) {
  if (a.rows <= 0) return;
  const RowNormLaunch l = choose_row_norm_launch(a.D);
  if (l.threads_per_row == 0) {
    row_norm_loop_kernel<OutT, FINAL><<<grid_for(a.rows), kBlockThreads, 0, s>>>(a);
    HK_CUDA_CHECK_LAUNCH();
    return;
  }
  if (l.threads_per_row == kWarp) {
    if (l.vec == 4) {
      switch (l.per_thread) {
        case 1: return launch_rows<OutT, 4, 1, kWarp, FINAL>(a, s);
        case 2: return launch_rows<OutT, 4, 2, kWarp, FINAL>(a, s);
        case 4: return launch_rows<OutT, 4, 4, kWarp, FINAL>(a, s);
        case 8: return launch_rows<OutT, 4, 8, kWarp, FINAL>(a, s);
      }
    } else {
      switch (l.per_thread) {
        case 8: return launch_rows<OutT, 1, 8, kWarp, FINAL>(a, s);
        case 32: return launch_rows<OutT, 1, 32, kWarp, FINAL>(a, s);
      }
    }
  } else if (l.threads_per_row == kBlockThreads) {
    if (l.vec == 4) {
      switch (l.per_thread) {
        case 2: return launch_rows<OutT, 4, 2, kBlockThreads, FINAL>(a, s);
        case 4: return launch_rows<OutT, 4, 4, kBlockThreads, FINAL>(a, s);
        case 8: return launch_rows<OutT, 4, 8, kBlockThreads, FINAL>(a, s);
      }
    } else if (l.per_thread == 32) {
      return launch_rows<OutT, 1, 32, kBlockThreads, FINAL>(a, s);
    }
  }
  throw CudaError("row kernel: no instantiation for D = " + std::to_string(a.D));
}

}  // namespace

RowNormLaunch choose_row_norm_launch(int D) {
  RowNormLaunch l;
  l.vec = (D % 4 == 0) ? 4 : 1;
  const int chunks = (D + l.vec - 1) / l.vec;
  auto pow2_at_least = [](int n, int lo) {
    int p = lo;
    while (p < n) p *= 2;
    return p;
  };
  if (l.vec == 4) {
    if (chunks <= kWarp * 8) {
      l.threads_per_row = kWarp;
      l.per_thread = pow2_at_least((chunks + kWarp - 1) / kWarp, 1);
    } else if (chunks <= kBlockThreads * 8) {
      l.threads_per_row = kBlockThreads;
      l.per_thread = pow2_at_least((chunks + kBlockThreads - 1) / kBlockThreads, 2);
    } else {
      l.threads_per_row = 0;
    }
  } else {
    // D % 4 != 0 is rare (odd head counts times odd head_dim): fewer instantiations, scalar loads.
    if (D <= kWarp * 8) {
      l.threads_per_row = kWarp;
      l.per_thread = 8;
    } else if (D <= kWarp * 32) {
      l.threads_per_row = kWarp;
      l.per_thread = 32;
    } else if (D <= kBlockThreads * 32) {
      l.threads_per_row = kBlockThreads;
      l.per_thread = 32;
    } else {
      l.threads_per_row = 0;
    }
  }
  if (l.threads_per_row == 0) l.per_thread = 0;
  return l;
}

const char* row_norm_variant(int D) {
  switch (choose_row_norm_launch(D).threads_per_row) {
    case kWarp: return "cuda.warp";
    case kBlockThreads: return "cuda.block";
    default: return "cuda.block_loop";
  }
}

void layer_norm(const float* x, void* out, DType out_type, const float* w, const float* b,
                int64_t rows, int D, float eps, cudaStream_t stream) {
  const RowNormArgs a{x, out, w, b, rows, D, eps, nullptr, 0};
  if (out_type == DType::f16) {
    dispatch<__half, false>(a, stream);
  } else {
    dispatch<float, false>(a, stream);
  }
}

void final_layer_norm(const float* x, float* y, const float* w, const float* b, int64_t rows,
                      int D, float eps, const int32_t* lengths, int S, cudaStream_t stream) {
  const RowNormArgs a{x, y, w, b, rows, D, eps, lengths, S};
  dispatch<float, true>(a, stream);
}

}  // namespace hk::cuda
