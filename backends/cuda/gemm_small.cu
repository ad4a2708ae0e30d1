// fp16 GEMM + bias for short inner dimensions, launched with programmatic dependent launch
// (see gemm_small.cuh).
#include "gemm_small.cuh"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "common.cuh"
#include "launch.hpp"
#include "ptx.cuh"

namespace hk::cuda {
namespace {

using namespace ptx;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRowsPerCta = 16 * kWarps;
constexpr int kTileWidths[] = {128, 64, 32};  // widest first

// Shared memory of one CTA: w tile [bn][k + 8], two a tiles [64][k + 8] (halves), bias [bn]
// (floats).
size_t smem_bytes(int bn, int k) {
  return size_t(bn + 2 * kRowsPerCta) * size_t(k + 8) * sizeof(__half) + size_t(bn) * sizeof(float);
}

// A CTA keeps one bn-column weight tile and walks row tiles blockIdx.x, + gridDim.x, ... (a
// persistent grid where the rows are many): the next row tile's a is loaded (cp.async) into the
// other buffer while this one is multiplied, so the weight tile is staged once per CTA and the
// loads overlap the tensor-core work.
template <int BN>
__global__ void __launch_bounds__(kThreads) small_gemm_kernel(SmallGemmParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int k = p.k, ld = k + 8, kchunks = k / 8;
  __half* sW = reinterpret_cast<__half*>(smem);
  __half* sA0 = sW + BN * ld;
  float* sBias = reinterpret_cast<float*>(sA0 + 2 * kRowsPerCta * ld);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int col0 = blockIdx.y * BN;
  const int64_t tiles = (p.rows + kRowsPerCta - 1) / kRowsPerCta;

  // The weight tile and the bias do not depend on earlier kernels: staged before the wait.
  for (int idx = tid; idx < BN * kchunks; idx += kThreads) {
    const int r = idx / kchunks, c = idx - r * kchunks;
    cp_async_16(smem_u32(sW + r * ld + c * 8), p.w + int64_t(col0 + r) * k + c * 8, 16);
  }
  for (int c = tid; c < BN; c += kThreads) sBias[c] = __half2float(p.bias[col0 + c]);
  pdl_launch_dependents();
  pdl_wait();  // launch_pdl: a comes from the previous kernel

  // Row tile t into buffer b; rows past the end are zero-filled (never read from memory).
  auto load_a = [&](int64_t t, int b) {
    const int64_t row0 = t * kRowsPerCta;
    const int nrows = int(min(int64_t(kRowsPerCta), p.rows - row0));
    __half* dst = sA0 + b * kRowsPerCta * ld;
    for (int idx = tid; idx < kRowsPerCta * kchunks; idx += kThreads) {
      const int r = idx / kchunks, c = idx - r * kchunks;
      const bool ok = r < nrows;
      cp_async_16(smem_u32(dst + r * ld + c * 8), ok ? p.a + (row0 + r) * k + c * 8 : p.a, ok ? 16 : 0);
    }
    cp_async_commit();
  };
  int64_t t = blockIdx.x;
  if (t < tiles) load_a(t, 0);
  const int r = lane >> 2, cq = (lane & 3) * 2;
  const uint32_t w_addr = smem_u32(sW + ((lane & 7) + ((lane >> 4) << 3)) * ld + ((lane >> 3) & 1) * 8);
  for (int b = 0; t < tiles; t += gridDim.x, b ^= 1) {
    const int64_t next = t + gridDim.x;
    if (next < tiles) {
      load_a(next, b ^ 1);  // the other buffer: freed by the barrier at the end of the last pass
      cp_async_wait<1>();
    } else {
      cp_async_wait_all();
    }
    __syncthreads();  // this tile's a (and, first time, w and the bias) visible to every warp

    const int64_t row0 = t * kRowsPerCta;
    const int nrows = int(min(int64_t(kRowsPerCta), p.rows - row0));
    __half* sA = sA0 + b * kRowsPerCta * ld;
    if (warp * 16 < nrows) {
      // Fragments of mma.m16n8k16: A rows of this warp (ldmatrix x4: rows 0-15, k 0-7 / 8-15); B
      // from the [n][k] tile, two n8 tiles per ldmatrix x4.
      float acc[BN / 8][4];
#pragma unroll
      for (int i = 0; i < BN / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
      const uint32_t a_addr = smem_u32(sA + (warp * 16 + (lane & 15)) * ld + (lane >> 4) * 8);
#pragma unroll 1
      for (int kk = 0; kk < k; kk += 16) {
        uint32_t a[4];
        ldsm_x4(a, a_addr + kk * 2);
#pragma unroll
        for (int j = 0; j < BN / 16; ++j) {
          uint32_t b0, b1, b2, b3;
          ldsm_x4(b0, b1, b2, b3, w_addr + (j * 16 * ld + kk) * 2);
          mma_16816(acc[2 * j], a, b0, b1);
          mma_16816(acc[2 * j + 1], a, b2, b3);
        }
      }
      // c = fp16(acc + bias), staged in this warp's own a rows (only this warp reads them;
      // BN <= ld), then 16-byte stores of whole row segments.
      __syncwarp();
      __half* sC = sA + warp * 16 * ld;
#pragma unroll
      for (int i = 0; i < BN / 8; ++i) {
        const int col = i * 8 + cq;
        const float b0 = sBias[col], b1 = sBias[col + 1];
        *reinterpret_cast<uint32_t*>(sC + r * ld + col) = pack_half2(acc[i][0] + b0, acc[i][1] + b1);
        *reinterpret_cast<uint32_t*>(sC + (r + 8) * ld + col) = pack_half2(acc[i][2] + b0, acc[i][3] + b1);
      }
      __syncwarp();
      constexpr int kChunks = BN / 8;
      const int wrows = min(16, nrows - warp * 16);
      for (int idx = lane; idx < 16 * kChunks; idx += 32) {
        const int rr = idx / kChunks, cc = idx - rr * kChunks;
        if (rr < wrows) {
          *reinterpret_cast<uint4*>(p.c + (row0 + warp * 16 + rr) * p.n + col0 + cc * 8) =
              *reinterpret_cast<const uint4*>(sC + rr * ld + cc * 8);
        }
      }
    }
    __syncthreads();  // every warp done with buffer b before the next pass loads into it
  }
}

template <int BN>
void raise_smem_limit() {
  static const bool done = [] {
    HK_CUDA_CHECK(cudaFuncSetAttribute(small_gemm_kernel<BN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       device_limits().smem_optin));
    return true;
  }();
  (void)done;
}

bool shape_ok(int n, int k) { return k >= 32 && k <= 256 && k % 16 == 0 && n >= 32 && n % 32 == 0; }

// A tile width a launch may use: divides n, fits the staging (bn <= k + 8) and shared memory.
bool width_ok(int bn, int n, int k) {
  return n % bn == 0 && bn <= k + 8 && smem_bytes(bn, k) <= size_t(device_limits().smem_optin);
}

// Automatic: the widest tile whose grid still covers every SM once; else the narrowest (most CTAs).
int auto_width(int64_t rows, int n, int k) {
  const int64_t tiles = (rows + kRowsPerCta - 1) / kRowsPerCta;
  int narrowest = 0;
  for (int bn : kTileWidths) {
    if (!width_ok(bn, n, k)) continue;
    if (tiles * (n / bn) >= device_limits().sms) return bn;
    narrowest = bn;
  }
  return narrowest;
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

}  // namespace

bool small_gemm_supports(int n, int k) {
  if (!shape_ok(n, k) || !width_ok(32, n, k)) return false;
  raise_smem_limit<128>();
  raise_smem_limit<64>();
  raise_smem_limit<32>();
  return true;
}

int small_gemm_bn(int64_t rows, int n, int k, SmallGemmConfig config) {
  if (!small_gemm_supports(n, k)) return 0;
  if (config.bn == 0) return auto_width(rows, n, k);
  for (int bn : kTileWidths)
    if (bn == config.bn) return width_ok(bn, n, k) ? bn : 0;
  return 0;
}

std::vector<SmallGemmConfig> small_gemm_candidates(int64_t rows, int n, int k) {
  std::vector<SmallGemmConfig> out;
  const int first = small_gemm_bn(rows, n, k);
  if (first == 0) return out;
  out.push_back({first});
  for (int bn : kTileWidths)
    if (bn != first && width_ok(bn, n, k)) out.push_back({bn});
  return out;
}

std::string small_gemm_name(int64_t rows, int n, int k, SmallGemmConfig config) {
  const int bn = small_gemm_bn(rows, n, k, config);
  return bn == 0 ? std::string() : "hk::gemm[cuda.mma.bias.bn" + std::to_string(bn) + "]";
}

void small_gemm_bias(const SmallGemmParams& p, cudaStream_t stream, SmallGemmConfig config) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("hk::gemm[cuda.mma.bias]: " + what); };
  if (!small_gemm_supports(p.n, p.k)) {
    fail("unsupported shape n " + std::to_string(p.n) + ", k " + std::to_string(p.k) +
         " (k a multiple of 16 in [32, 256], n a multiple of 32)");
  }
  if (p.rows < 0 || p.rows > INT32_MAX) fail("row count outside [0, 2^31)");
  const int bn = small_gemm_bn(p.rows, p.n, p.k, config);
  if (bn == 0) fail("tile width " + std::to_string(config.bn) + " unusable for this shape");
  if (!p.a || !p.w || !p.bias || !p.c) fail("null pointer");
  if (!aligned16(p.a) || !aligned16(p.w) || !aligned16(p.c)) fail("a, w and c must be 16-byte aligned");
  if (p.rows == 0) return;
  const size_t smem = smem_bytes(bn, p.k);
  // One wave: every column tile gets an equal share of the CTAs the SMs hold at once (at least
  // one), each walking its row tiles; fewer row tiles than that: one CTA per row tile.
  auto launch = [&](auto kernel) {
    int per_sm = 0;
    HK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    const int64_t tiles = (p.rows + kRowsPerCta - 1) / kRowsPerCta;
    const int64_t wave = std::max<int64_t>(1, int64_t(std::max(per_sm, 1)) * device_limits().sms / (p.n / bn));
    const dim3 grid(unsigned(std::min(tiles, wave)), unsigned(p.n / bn));
    launch_pdl(kernel, grid, dim3(kThreads), smem, stream, p);
  };
  switch (bn) {
    case 128: launch(small_gemm_kernel<128>); break;
    case 64: launch(small_gemm_kernel<64>); break;
    default: launch(small_gemm_kernel<32>); break;
  }
}

}  // namespace hk::cuda
