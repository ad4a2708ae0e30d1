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

// Shared memory of one CTA: w tile [bn][k + 8], a tile [64][k + 8] (halves), bias [bn] (floats).
size_t smem_bytes(int bn, int k) {
  return size_t(bn + kRowsPerCta) * size_t(k + 8) * sizeof(__half) + size_t(bn) * sizeof(float);
}

template <int BN>
__global__ void __launch_bounds__(kThreads) small_gemm_kernel(SmallGemmParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int k = p.k, ld = k + 8, kchunks = k / 8;
  __half* sW = reinterpret_cast<__half*>(smem);
  __half* sA = sW + BN * ld;
  float* sBias = reinterpret_cast<float*>(sA + kRowsPerCta * ld);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t row0 = int64_t(blockIdx.x) * kRowsPerCta;
  const int col0 = blockIdx.y * BN;

  // The weight tile and the bias do not depend on earlier kernels: staged before the wait.
  for (int idx = tid; idx < BN * kchunks; idx += kThreads) {
    const int r = idx / kchunks, c = idx - r * kchunks;
    cp_async_16(smem_u32(sW + r * ld + c * 8), p.w + int64_t(col0 + r) * k + c * 8, 16);
  }
  for (int c = tid; c < BN; c += kThreads) sBias[c] = __half2float(p.bias[col0 + c]);
  pdl_launch_dependents();
  pdl_wait();  // launch_pdl: a comes from the previous kernel
  const int nrows = int(min(int64_t(kRowsPerCta), p.rows - row0));
  for (int idx = tid; idx < kRowsPerCta * kchunks; idx += kThreads) {
    const int r = idx / kchunks, c = idx - r * kchunks;
    const bool ok = r < nrows;  // rows past the end are zero-filled
    cp_async_16(smem_u32(sA + r * ld + c * 8), ok ? p.a + (row0 + r) * k + c * 8 : p.a, ok ? 16 : 0);
  }
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  if (warp * 16 >= nrows) return;  // no barrier follows

  // Fragments of mma.m16n8k16: A rows of this warp (ldmatrix x4: rows 0-15, k 0-7 / 8-15); B from
  // the [n][k] tile, two n8 tiles per ldmatrix x4.
  float acc[BN / 8][4];
#pragma unroll
  for (int t = 0; t < BN / 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  const uint32_t a_addr = smem_u32(sA + (warp * 16 + (lane & 15)) * ld + (lane >> 4) * 8);
  const uint32_t w_addr = smem_u32(sW + ((lane & 7) + ((lane >> 4) << 3)) * ld + ((lane >> 3) & 1) * 8);
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

  // c = fp16(acc + bias), staged in this warp's own a rows (only this warp reads them; BN <= ld),
  // then 16-byte stores of whole row segments.
  __syncwarp();
  __half* sC = sA + warp * 16 * ld;
  const int r = lane >> 2, cq = (lane & 3) * 2;
#pragma unroll
  for (int t = 0; t < BN / 8; ++t) {
    const int col = t * 8 + cq;
    const float b0 = sBias[col], b1 = sBias[col + 1];
    *reinterpret_cast<uint32_t*>(sC + r * ld + col) = pack_half2(acc[t][0] + b0, acc[t][1] + b1);
    *reinterpret_cast<uint32_t*>(sC + (r + 8) * ld + col) = pack_half2(acc[t][2] + b0, acc[t][3] + b1);
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
  const dim3 grid(unsigned((p.rows + kRowsPerCta - 1) / kRowsPerCta), unsigned(p.n / bn));
  const size_t smem = smem_bytes(bn, p.k);
  switch (bn) {
    case 128: launch_pdl(small_gemm_kernel<128>, grid, dim3(kThreads), smem, stream, p); break;
    case 64: launch_pdl(small_gemm_kernel<64>, grid, dim3(kThreads), smem, stream, p); break;
    default: launch_pdl(small_gemm_kernel<32>, grid, dim3(kThreads), smem, stream, p); break;
  }
}

}  // namespace hk::cuda
