// LayerNorm row kernels (see rownorm.cuh). One templated kernel covers the warp-per-row and the
// block-per-row layouts; a looping kernel covers rows too wide to keep in registers. A Mode
// parameter says where each row comes from and goes (plain, padded final, packed gather,
// packed scatter); the normalisation itself is shared.
#include "rownorm.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "common.cuh"
#include "launch.hpp"
#include "ptx.cuh"

namespace hk::cuda {
namespace {

// Launch tables, one line per choice:
//   warp per row: 4 rows per 128-thread block keep the SM's warp slots full with no block sync;
//     vec 4 covers D <= 32 * 4 * 8 = 1024 with at most 32 row floats per thread.
//   block per row (256 threads): D up to 256 * 32 = 8192 floats in registers.
//   beyond that the row is read from memory three times (rare: d_model > 8192).
constexpr int kWarp = 32;
constexpr int kWarpRowsPerBlock = 4;     // default rows (warps) per block of the warp-per-row kernel
constexpr int kMaxWarpRowsPerBlock = 8;  // the most a tuned launch may use
constexpr int kBlockThreads = 256;
constexpr int kMaxRowFloatsPerThread = 32;

// What a launch does with each of its rows (work items).
//   plain:         out[r] = LN(x[r])
//   final_padded:  out[r] = LN(x[r]) for valid rows of the padded layout, zeros for padded rows
//   pack:          the gather of pack_layer_norm (see rownorm.cuh and route() below)
//   final_packed:  out[row_dst[r]] = LN(x[r]) for row_dst[r] >= 0
enum class Mode { plain, final_padded, pack, final_packed };

struct RowNormArgs {
  const float* x = nullptr;
  void* out = nullptr;
  const float* w = nullptr;
  const float* b = nullptr;
  int64_t rows = 0;  // work items of the launch
  int D = 0;
  float eps = 0.f;
  const int32_t* lengths = nullptr;  // final_padded, pack: valid rows per sequence (null: all)
  int S = 1;                         // final_padded, pack: positions per sequence
  // pack
  const int32_t* seq_start = nullptr;
  int B = 0;
  int64_t padded_rows = 0;  // B * S
  int64_t Tcap = 0;
  float* x_packed = nullptr;
  void* o = nullptr;
  float* y = nullptr;
  int32_t* overflow = nullptr;
  int32_t* row_dst = nullptr;  // pack: written; final_packed: read
  int rows_per_block = 0;      // warp-per-row launches: rows (warps) per block, 0 = default
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

// Zeros one row of D elements; tid in [0, TPR) are the row's threads.
template <class T, int VEC, int TPR>
__device__ __forceinline__ void zero_row(T* p, int D, int tid) {
  const float z[VEC] = {};
  for (int c = tid * VEC; c < D; c += TPR * VEC) store_vec(p + c, z);
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

// Valid rows of sequence `seq`, clamped to [0, S] (the same rule as packed_offsets).
__device__ __forceinline__ int seq_length(const RowNormArgs& a, int64_t seq) {
  if (a.lengths == nullptr) return a.S;
  return min(max(a.lengths[seq], 0), a.S);
}

__device__ __forceinline__ bool row_is_padding(const RowNormArgs& a, int64_t row) {
  if (a.lengths == nullptr) return false;
  const int64_t seq = row / a.S;
  return row - seq * a.S >= seq_length(a, seq);
}

// Packed row t in [T, Tcap): zeros in every packed buffer, no source row.
template <class OutT, int VEC, int TPR>
__device__ __forceinline__ void zero_tail_row(const RowNormArgs& a, int64_t t, int tid) {
  if (a.x_packed != nullptr) zero_row<float, VEC, TPR>(a.x_packed + t * a.D, a.D, tid);
  zero_row<OutT, VEC, TPR>(static_cast<OutT*>(a.out) + t * a.D, a.D, tid);
  if (a.o != nullptr) zero_row<OutT, VEC, TPR>(static_cast<OutT*>(a.o) + t * a.D, a.D, tid);
  if (tid == 0) a.row_dst[t] = -1;
}

// Resolves work item `item`: returns false when the item is finished (padding written, nothing to
// normalise); else sets the source row, the destination row and (pack) the fp32 copy row.
// Uniform over the row's threads, so a block-per-row launch leaves or stays as a whole.
template <Mode M, class OutT, int VEC, int TPR>
__device__ __forceinline__ bool route(const RowNormArgs& a, int64_t item, int tid, const float*& src, OutT*& dst,
                                      float*& copy) {
  const int D = a.D;
  OutT* const out = static_cast<OutT*>(a.out);
  copy = nullptr;
  if constexpr (M == Mode::plain) {
    src = a.x + item * D;
    dst = out + item * D;
    return true;
  } else if constexpr (M == Mode::final_padded) {
    dst = out + item * D;
    if (row_is_padding(a, item)) {
      zero_row<OutT, VEC, TPR>(dst, D, tid);
      return false;
    }
    src = a.x + item * D;
    return true;
  } else if constexpr (M == Mode::final_packed) {
    const int32_t d = a.row_dst[item];
    if (d < 0) return false;
    src = a.x + item * D;
    dst = out + int64_t(d) * D;
    return true;
  } else {
    // Items [0, B*S) are the padded rows; items [B*S, Tcap) are tail rows (Tcap > B*S only).
    // The k-th padded row (k = its rank among padded rows) also zeros tail row T + k: together
    // the two ranges cover [T, Tcap) once, with no search of seq_start.
    if (item >= a.padded_rows) {
      zero_tail_row<OutT, VEC, TPR>(a, item, tid);
      return false;
    }
    const int64_t seq = item / a.S;
    const int s = int(item - seq * a.S);
    const int len = seq_length(a, seq);
    const int64_t first = a.seq_start[seq];
    if (s >= len) {
      if (a.y != nullptr) zero_row<float, VEC, TPR>(a.y + item * D, D, tid);
      // rank = padded rows before this sequence (seq * S - first) + s - len
      const int64_t t = int64_t(a.seq_start[a.B]) + (item - first - len);
      if (t < a.Tcap) zero_tail_row<OutT, VEC, TPR>(a, t, tid);
      return false;
    }
    const int64_t r = first + s;
    if (r >= a.Tcap) {
      if (tid == 0 && a.overflow != nullptr) *a.overflow = 1;
      return false;
    }
    if (tid == 0) a.row_dst[r] = int32_t(item);
    src = a.x + item * D;
    dst = out + r * D;
    copy = a.x_packed != nullptr ? a.x_packed + r * D : nullptr;
    return true;
  }
}

// The thread's slice of a row: columns (i * TPR + tid) * VEC, zeros past D.
template <int VEC, int NV, int TPR>
__device__ __forceinline__ void load_row(float (&v)[NV][VEC], const float* x, int D, int tid) {
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int col = (i * TPR + tid) * VEC;
    if (col < D) {
      load_vec(v[i], x + col);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[i][j] = 0.f;
    }
  }
}

// The slice back to a row (the packed fp32 copy).
template <int VEC, int NV, int TPR>
__device__ __forceinline__ void store_row(float* dst, const float (&v)[NV][VEC], int D, int tid) {
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int col = (i * TPR + tid) * VEC;
    if (col < D) store_vec(dst + col, v[i]);
  }
}

// out_row = LN(row; a.w, a.b) from the thread's slice v (load_row's layout): statistics of the
// row shifted by `shift` (its first element), mean first, then the centred sum of squares. (The
// launch arguments are read where used: passed as values they made ptxas spill at VEC 1, NV 32.)
template <class OutT, int VEC, int NV, int TPR>
__device__ __forceinline__ void normalize_row(float (&v)[NV][VEC], float shift, const RowNormArgs& a, OutT* out_row,
                                              int tid) {
  const int D = a.D;
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int col = (i * TPR + tid) * VEC;
    if (col < D) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        v[i][j] -= shift;
        sum += v[i][j];
      }
    }
  }
  const float mean = row_sum<TPR>(sum) / float(D);  // of the shifted row
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
      float wv[VEC], bv[VEC], o[VEC];
      load_vec(wv, a.w + col);
      load_vec(bv, a.b + col);
#pragma unroll
      for (int j = 0; j < VEC; ++j) o[j] = (v[i][j] - mean) * rstd * wv[j] + bv[j];
      store_vec(out_row + col, o);
    }
  }
}

template <class OutT, int VEC, int NV, int TPR, Mode M>
__global__ void __launch_bounds__(TPR == kWarp ? kWarp * kMaxWarpRowsPerBlock : TPR)
    row_norm_kernel(const RowNormArgs a) {
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();  // launch_pdl: every input comes from earlier work of the stream
  // Warp per row: as many rows per block as the launch has warps (a tuning choice).
  const int rows_per_block = TPR == kWarp ? int(blockDim.x) / kWarp : 1;
  const int tid = TPR == kWarp ? int(threadIdx.x & (kWarp - 1)) : int(threadIdx.x);
  const int64_t item = int64_t(blockIdx.x) * rows_per_block + (TPR == kWarp ? threadIdx.x / kWarp : 0);
  if (item >= a.rows) return;  // uniform per row: a whole warp (or block) leaves together
  const int D = a.D;
  const float* x;
  OutT* out;
  float* copy;
  if (!route<M, OutT, VEC, TPR>(a, item, tid, x, out, copy)) return;

  float v[NV][VEC];
  load_row<VEC, NV, TPR>(v, x, D, tid);
  if constexpr (M == Mode::pack) {
    if (copy != nullptr) store_row<VEC, NV, TPR>(copy, v, D, tid);
  }
  // The row's first element, read by every thread: a broadcast of a sector the row load fetches
  // anyway (no barrier; a warp shuffle of thread 0's copy made ptxas spill at VEC 1, NV 8).
  const float shift = x[0];
  normalize_row<OutT, VEC, NV, TPR>(v, shift, a, out, tid);
}

// The pack gather with kPackRows consecutive work items per warp (D <= 256, D % 4 == 0): the
// index loads of all its items (length, start of the sequence) issue together, then the x loads
// of its valid rows, then the rows are normalised. A warp per item pays the chain of dependent
// loads (length -> start -> x) for every row, which made the pass latency-bound at large B;
// here it is paid once per kPackRows rows, with their x loads in flight together. The same
// routing as route() (Mode::pack) and the same arithmetic as row_norm_kernel, so the same bits.
constexpr int kPackRows = 4;

template <class OutT, int NV>
__global__ void __launch_bounds__(kWarp * kMaxWarpRowsPerBlock) pack_rows_kernel(const RowNormArgs a) {
  constexpr int VEC = 4, TPR = kWarp;
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();  // launch_pdl: every input comes from earlier work of the stream
  const int lane = int(threadIdx.x & (kWarp - 1));
  const int64_t item0 = (int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp) * kPackRows;
  if (item0 >= a.rows) return;  // uniform per warp
  const int D = a.D;
  OutT* const out = static_cast<OutT*>(a.out);

  // Sequence and position of each item: one division for the warp's first item, then a step of
  // one position (the items are consecutive padded rows); per-item 64-bit divisions made this
  // pass issue-bound.
  int len[kPackRows];
  int64_t first[kPackRows];
  int pos[kPackRows];
  {
    int64_t seq = item0 / a.S;
    int s = int(item0 - seq * a.S);
#pragma unroll
    for (int r = 0; r < kPackRows; ++r) {
      pos[r] = s;
      len[r] = 0;
      first[r] = 0;
      if (item0 + r < a.padded_rows) {
        len[r] = seq_length(a, seq);
        first[r] = a.seq_start[seq];
      }
      if (++s == a.S) {
        s = 0;
        ++seq;
      }
    }
  }
  const int64_t T = a.seq_start[a.B];

  int64_t dst[kPackRows];  // packed row of each item, -1: nothing to normalise
  float v[kPackRows][NV][VEC];
#pragma unroll
  for (int r = 0; r < kPackRows; ++r) {
    const int64_t item = item0 + r;
    dst[r] = -1;
    if (item >= a.rows) continue;
    if (item >= a.padded_rows) {
      zero_tail_row<OutT, VEC, TPR>(a, item, lane);
      continue;
    }
    const int s = pos[r];
    if (s >= len[r]) {
      if (a.y != nullptr) zero_row<float, VEC, TPR>(a.y + item * D, D, lane);
      const int64_t t = T + (item - first[r] - len[r]);
      if (t < a.Tcap) zero_tail_row<OutT, VEC, TPR>(a, t, lane);
      continue;
    }
    const int64_t row = first[r] + s;
    if (row >= a.Tcap) {
      if (lane == 0 && a.overflow != nullptr) *a.overflow = 1;
      continue;
    }
    if (lane == 0) a.row_dst[row] = int32_t(item);
    dst[r] = row;
    load_row<VEC, NV, TPR>(v[r], a.x + item * D, D, lane);
  }

#pragma unroll
  for (int r = 0; r < kPackRows; ++r) {
    if (dst[r] < 0) continue;  // uniform per warp
    if (a.x_packed != nullptr) store_row<VEC, NV, TPR>(a.x_packed + dst[r] * D, v[r], D, lane);
    const float shift = __shfl_sync(0xffffffffu, v[r][0][0], 0);  // x[0] of the row (lane 0, col 0)
    normalize_row<OutT, VEC, NV, TPR>(v[r], shift, a, out + dst[r] * D, lane);
  }
}

// Rows wider than the register budget: one block per row, three passes over the row in memory
// (mostly L1/L2 hits after the first).
template <class OutT, Mode M>
__global__ void __launch_bounds__(kBlockThreads) row_norm_loop_kernel(const RowNormArgs a) {
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();  // launch_pdl: every input comes from earlier work of the stream
  const int64_t item = blockIdx.x;
  const int D = a.D;
  const int tid = int(threadIdx.x);
  const float* x;
  OutT* out;
  float* copy;
  if (!route<M, OutT, 1, kBlockThreads>(a, item, tid, x, out, copy)) return;
  const float shift = x[0];
  float sum = 0.f;
  for (int c = tid; c < D; c += kBlockThreads) {
    const float xv = x[c];
    if constexpr (M == Mode::pack) {
      if (copy != nullptr) copy[c] = xv;
    }
    sum += xv - shift;
  }
  const float mean = row_sum<kBlockThreads>(sum) / float(D);  // of the shifted row
  float sq = 0.f;
  for (int c = tid; c < D; c += kBlockThreads) {
    const float d = (x[c] - shift) - mean;
    sq += d * d;
  }
  const float rstd = rsqrtf(row_sum<kBlockThreads>(sq) / float(D) + a.eps);
  for (int c = tid; c < D; c += kBlockThreads) {
    const float o = ((x[c] - shift) - mean) * rstd * a.w[c] + a.b[c];
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

template <class OutT, int VEC, int NV, int TPR, Mode M>
void launch_rows(const RowNormArgs& a, cudaStream_t s) {
  static_assert(NV * VEC <= kMaxRowFloatsPerThread, "row slice would not fit the register budget");
  if constexpr (TPR == kWarp) {
    const int rpb = a.rows_per_block > 0 ? a.rows_per_block : kWarpRowsPerBlock;
    const int64_t blocks = (a.rows + rpb - 1) / rpb;
    launch_pdl(row_norm_kernel<OutT, VEC, NV, TPR, M>, dim3(grid_for(blocks)), dim3(kWarp * rpb), 0, s, a);
  } else {
    launch_pdl(row_norm_kernel<OutT, VEC, NV, TPR, M>, dim3(grid_for(a.rows)), dim3(TPR), 0, s, a);
  }
  HK_CUDA_CHECK_LAUNCH();
}

// The single place that turns choose_row_norm_launch() into a template instantiation.
template <class OutT, Mode M>
void dispatch(const RowNormArgs& a, cudaStream_t s) {
  if (a.rows <= 0) return;
  if (a.D < 1) throw CudaError("row kernel: D < 1");
  const RowNormLaunch l = choose_row_norm_launch(a.D);
  if constexpr (M == Mode::pack) {
    if (l.threads_per_row == kWarp && l.vec == 4 && l.per_thread <= 2) {
      const int rpb = a.rows_per_block > 0 ? a.rows_per_block : kWarpRowsPerBlock;
      const int64_t warps = (a.rows + kPackRows - 1) / kPackRows;
      const dim3 grid(grid_for((warps + rpb - 1) / rpb)), block(kWarp * rpb);
      if (l.per_thread == 1) {
        launch_pdl(pack_rows_kernel<OutT, 1>, grid, block, 0, s, a);
      } else {
        launch_pdl(pack_rows_kernel<OutT, 2>, grid, block, 0, s, a);
      }
      HK_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  if (l.threads_per_row == 0) {
    launch_pdl(row_norm_loop_kernel<OutT, M>, dim3(grid_for(a.rows)), dim3(kBlockThreads), 0, s, a);
    HK_CUDA_CHECK_LAUNCH();
    return;
  }
  if (l.threads_per_row == kWarp) {
    if (l.vec == 4) {
      switch (l.per_thread) {
        case 1: return launch_rows<OutT, 4, 1, kWarp, M>(a, s);
        case 2: return launch_rows<OutT, 4, 2, kWarp, M>(a, s);
        case 4: return launch_rows<OutT, 4, 4, kWarp, M>(a, s);
        case 8: return launch_rows<OutT, 4, 8, kWarp, M>(a, s);
      }
    } else {
      switch (l.per_thread) {
        case 8: return launch_rows<OutT, 1, 8, kWarp, M>(a, s);
        case 32: return launch_rows<OutT, 1, 32, kWarp, M>(a, s);
      }
    }
  } else if (l.threads_per_row == kBlockThreads) {
    if (l.vec == 4) {
      switch (l.per_thread) {
        case 2: return launch_rows<OutT, 4, 2, kBlockThreads, M>(a, s);
        case 4: return launch_rows<OutT, 4, 4, kBlockThreads, M>(a, s);
        case 8: return launch_rows<OutT, 4, 8, kBlockThreads, M>(a, s);
      }
    } else if (l.per_thread == 32) {
      return launch_rows<OutT, 1, 32, kBlockThreads, M>(a, s);
    }
  }
  throw CudaError("row kernel: no instantiation for D = " + std::to_string(a.D));
}

// ---- packed offsets: one CTA scans the lengths in tiles --------------------------------------
// 1024 threads x 8 lengths per tile: B = 10000 is two tiles (a few microseconds, mostly the
// first load's latency); B in the millions loops (~1 us per 8192 sequences).
constexpr int kScanThreads = 1024;
constexpr int kScanItems = 8;
constexpr int kScanTile = kScanThreads * kScanItems;

__global__ void __launch_bounds__(kScanThreads)
    packed_offsets_kernel(const int32_t* lengths, int B, int S, int32_t* seq_start) {
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();  // launch_pdl: the lengths come from earlier work of the stream
  __shared__ int32_t tile[kScanTile];
  __shared__ int32_t warp_total[kScanThreads / kWarp];
  const int tid = int(threadIdx.x), lane = tid & (kWarp - 1), wid = tid / kWarp;
  int32_t carry = 0;  // rows of all previous tiles
  for (int64_t base = 0; base < B; base += kScanTile) {
    // Coalesced loads into the tile, then each thread scans kScanItems consecutive lengths.
#pragma unroll
    for (int k = 0; k < kScanItems; ++k) {
      const int i = k * kScanThreads + tid;
      const int64_t idx = base + i;
      int32_t len = 0;
      if (idx < B) len = lengths == nullptr ? S : min(max(lengths[idx], 0), S);
      tile[i] = len;
    }
    __syncthreads();
    int32_t mine[kScanItems];
    int32_t total = 0;
#pragma unroll
    for (int k = 0; k < kScanItems; ++k) {
      mine[k] = total;  // exclusive within the thread
      total += tile[tid * kScanItems + k];
    }
    int32_t inc = total;  // inclusive scan of the thread totals over the warp
#pragma unroll
    for (int o = 1; o < kWarp; o <<= 1) {
      const int32_t n = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += n;
    }
    if (lane == kWarp - 1) warp_total[wid] = inc;
    __syncthreads();
    if (wid == 0) {
      int32_t w = warp_total[lane];
#pragma unroll
      for (int o = 1; o < kWarp; o <<= 1) {
        const int32_t n = __shfl_up_sync(0xffffffffu, w, o);
        if (lane >= o) w += n;
      }
      warp_total[lane] = w;  // inclusive over warps
    }
    __syncthreads();
    const int32_t before = carry + (wid > 0 ? warp_total[wid - 1] : 0) + inc - total;
#pragma unroll
    for (int k = 0; k < kScanItems; ++k) tile[tid * kScanItems + k] = before + mine[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kScanItems; ++k) {
      const int i = k * kScanThreads + tid;
      if (base + i < B) seq_start[base + i] = tile[i];
    }
    carry += warp_total[kScanThreads / kWarp - 1];
    __syncthreads();  // tile and warp_total are refilled by the next iteration
  }
  if (tid == 0) seq_start[B] = carry;
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
                int64_t rows, int D, float eps, cudaStream_t stream, int rows_per_block) {
  if (rows_per_block != 0 && (rows_per_block < 1 || rows_per_block > kMaxWarpRowsPerBlock))
    throw CudaError("layer_norm: rows_per_block " + std::to_string(rows_per_block) + " outside 1.." +
                    std::to_string(kMaxWarpRowsPerBlock));
  RowNormArgs a;
  a.rows_per_block = rows_per_block;
  a.x = x;
  a.out = out;
  a.w = w;
  a.b = b;
  a.rows = rows;
  a.D = D;
  a.eps = eps;
  if (out_type == DType::f16) {
    dispatch<__half, Mode::plain>(a, stream);
  } else {
    dispatch<float, Mode::plain>(a, stream);
  }
}

void final_layer_norm(const float* x, float* y, const float* w, const float* b, int64_t rows,
                      int D, float eps, const int32_t* lengths, int S, cudaStream_t stream) {
  RowNormArgs a;
  a.x = x;
  a.out = y;
  a.w = w;
  a.b = b;
  a.rows = rows;
  a.D = D;
  a.eps = eps;
  a.lengths = lengths;
  a.S = S;
  if (lengths != nullptr && S < 1) throw CudaError("final_layer_norm: S < 1 with lengths");
  dispatch<float, Mode::final_padded>(a, stream);
}

void packed_offsets(const int32_t* lengths, int B, int S, int32_t* seq_start, cudaStream_t stream) {
  if (B < 0 || S < 0) throw CudaError("packed_offsets: negative B or S");
  if (seq_start == nullptr) throw CudaError("packed_offsets: null seq_start");
  launch_pdl(packed_offsets_kernel, dim3(1), dim3(kScanThreads), 0, stream, lengths, B, S, seq_start);
  HK_CUDA_CHECK_LAUNCH();
}

void pack_layer_norm(const PackParams& p, cudaStream_t stream) {
  if (p.B < 0 || p.S < 0 || p.D < 1 || p.Tcap < 0 || (p.B > 0 && p.S < 1)) {
    throw CudaError("pack_layer_norm: bad shape (B, S >= 0, D >= 1, Tcap >= 0)");
  }
  if (!p.x || !p.seq_start || !p.h || !p.row_dst || !p.w || !p.b) {
    throw CudaError("pack_layer_norm: null pointer");
  }
  if (p.Tcap > INT32_MAX || int64_t(p.B) * p.S > INT32_MAX) {
    throw CudaError("pack_layer_norm: B * S or Tcap beyond int32 row indices");
  }
  RowNormArgs a;
  a.x = p.x;
  a.out = p.h;
  a.w = p.w;
  a.b = p.b;
  a.D = p.D;
  a.eps = p.eps;
  a.lengths = p.lengths;
  a.S = p.S;
  a.seq_start = p.seq_start;
  a.B = p.B;
  a.padded_rows = int64_t(p.B) * p.S;
  a.Tcap = p.Tcap;
  a.x_packed = p.x_packed;
  a.o = p.o;
  a.y = p.y;
  a.overflow = p.overflow;
  a.row_dst = p.row_dst;
  a.rows = std::max<int64_t>(a.padded_rows, p.Tcap);
  if (p.act == DType::f16) {
    dispatch<__half, Mode::pack>(a, stream);
  } else {
    dispatch<float, Mode::pack>(a, stream);
  }
}

void final_layer_norm_packed(const float* x_packed, float* y, const int32_t* row_dst, int64_t Tcap, int D,
                             const float* w, const float* b, float eps, cudaStream_t stream) {
  if (Tcap > 0 && (!x_packed || !y || !row_dst || !w || !b)) throw CudaError("final_layer_norm_packed: null pointer");
  RowNormArgs a;
  a.x = x_packed;
  a.out = y;
  a.w = w;
  a.b = b;
  a.rows = Tcap;
  a.D = D;
  a.eps = eps;
  a.row_dst = const_cast<int32_t*>(row_dst);  // read only in this mode
  dispatch<float, Mode::final_packed>(a, stream);
}

}  // namespace hk::cuda
