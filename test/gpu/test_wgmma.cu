// GPU test of the warpgroup MMA helpers (backends/cuda/wgmma.cuh) and their B layout contract:
// one warpgroup computes C = C0 + A B^T for a 64 x K fp16 A (each warp's 16 rows loaded with
// ldmatrix, as the fused chain does), a [N, K] fp16 B (nn.Linear [out, in]) staged in the
// core-matrix layout the header describes (128-byte 8 x 8 blocks, leading byte offset 128,
// stride byte offset 16 K, 256 bytes per k16 step) and an fp32 C0 in the mma.sync C layout, for
// N = 64 and 128 and K = 16 .. 256, also with B's rows read in two batches of k steps. Compared
// with a float64 product of the same fp16 values: |err| <= 1e-3 (1 + |ref|). The output is
// poisoned (NaN) first, so an element the kernel does not write fails. Standalone program: exits
// 0 when all pass, 1 on a failure, 77 without a compute capability 9.0 device or sm_90a code.
#include "wgmma.cuh"
#include "ptx.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

#define CHECK_CUDA(expr)                                                                           \
  do {                                                                                             \
    const cudaError_t err_ = (expr);                                                               \
    if (err_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", #expr, __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

using namespace hk::cuda;

__global__ void probe_kernel(int* has_wgmma) { *has_wgmma = HK_WGMMA; }

// One CTA of 128 threads. A row stride K + 8 halves (ldmatrix rows in distinct bank groups).
template <int N, int K, int KB>
__global__ void product_kernel(const __half* a, const __half* b, const float* c0, float* c) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int SA = K + 8;
  __half* sa = reinterpret_cast<__half*>(smem);
  __half* sb = sa + 64 * SA;  // 128 (K + 8) bytes further: 128-byte aligned
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  for (int i = tid; i < 64 * K; i += 128) sa[(i / K) * SA + i % K] = a[i];
  // B [N][K] -> core matrix (n / 8, k / 8) at ((n / 8) (K / 8) + k / 8) * 64 halves, row n % 8.
  for (int i = tid; i < N * K; i += 128) {
    const int n = i / K, k = i % K;
    sb[((n / 8) * (K / 8) + k / 8) * 64 + (n % 8) * 8 + k % 8] = b[i];
  }
  wgmma::fence_proxy_async_shared();
  __syncthreads();
  float acc[N / 8][4];
  const int r0 = 16 * warp + g;
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    const int col = 8 * j + 2 * t;
    acc[j][0] = c0[r0 * N + col];
    acc[j][1] = c0[r0 * N + col + 1];
    acc[j][2] = c0[(r0 + 8) * N + col];
    acc[j][3] = c0[(r0 + 8) * N + col + 1];
  }
  const uint32_t a_addr = ptx::smem_u32(sa) +
                          uint32_t(((16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8) * SA + (lane >> 4) * 8) * 2);
  const uint32_t b_addr = ptx::smem_u32(sb);
#pragma unroll
  for (int k0 = 0; k0 < K / 16; k0 += KB) {
    uint32_t af[KB][4];
#pragma unroll
    for (int ks = 0; ks < KB; ++ks) ptx::ldsm_x4(af[ks], a_addr + (k0 + ks) * 32);
    wgmma::fence_operands(acc);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < KB; ++ks) {
      wgmma::mma_rs<N>(acc, af[ks], wgmma::desc_kmajor(b_addr + (k0 + ks) * 256, 128, uint32_t(K) * 16u));
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(acc);
  }
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    const int col = 8 * j + 2 * t;
    c[r0 * N + col] = acc[j][0];
    c[r0 * N + col + 1] = acc[j][1];
    c[(r0 + 8) * N + col] = acc[j][2];
    c[(r0 + 8) * N + col + 1] = acc[j][3];
  }
}

template <int N, int K, int KB>
bool run(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<__half> a(64 * K), b(size_t(N) * K);
  std::vector<float> c0(64 * N), c(64 * N);
  for (auto& v : a) v = __float2half(nd(rng));
  for (auto& v : b) v = __float2half(nd(rng) * 0.25f);
  for (auto& v : c0) v = nd(rng);
  __half *da, *db;
  float *dc0, *dc;
  CHECK_CUDA(cudaMalloc(&da, a.size() * 2));
  CHECK_CUDA(cudaMalloc(&db, b.size() * 2));
  CHECK_CUDA(cudaMalloc(&dc0, c0.size() * 4));
  CHECK_CUDA(cudaMalloc(&dc, c.size() * 4));
  CHECK_CUDA(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dc0, c0.data(), c0.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(dc, 0xFF, c.size() * 4));  // NaN
  const size_t smem = size_t(64) * (K + 8) * 2 + size_t(N) * K * 2;
  CHECK_CUDA(cudaFuncSetAttribute(product_kernel<N, K, KB>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  product_kernel<N, K, KB><<<1, 128, smem>>>(da, db, dc0, dc);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(c.data(), dc, c.size() * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(da));
  CHECK_CUDA(cudaFree(db));
  CHECK_CUDA(cudaFree(dc0));
  CHECK_CUDA(cudaFree(dc));
  double worst = 0.0;
  long bad = 0;
  for (int m = 0; m < 64; ++m) {
    for (int n = 0; n < N; ++n) {
      double ref = c0[m * N + n];
      for (int k = 0; k < K; ++k) ref += double(__half2float(a[m * K + k])) * double(__half2float(b[size_t(n) * K + k]));
      const double err = std::fabs(double(c[m * N + n]) - ref);
      const double ratio = err / (1e-3 * (1.0 + std::fabs(ref)));
      if (!(ratio <= 1.0)) ++bad;  // NaN (unwritten) counts
      if (ratio > worst || std::isnan(ratio)) worst = std::isnan(ratio) ? INFINITY : ratio;
    }
  }
  const bool ok = bad == 0;
  std::printf("m64 n%-4d k%-4d batch %-2d  worst err/tol %-9.3g bad %-5ld %s\n", N, K, KB, worst, bad,
              ok ? "PASS" : "FAIL");
  return ok;
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9 || prop.minor != 0) {
    std::printf("SKIP: wgmma needs compute capability 9.0 (this device: %d.%d)\n", prop.major, prop.minor);
    return 77;
  }
  int* dflag;
  int flag = 0;
  CHECK_CUDA(cudaMalloc(&dflag, sizeof(int)));
  probe_kernel<<<1, 1>>>(dflag);
  CHECK_CUDA(cudaMemcpy(&flag, dflag, sizeof(int), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(dflag));
  if (!flag) {
    std::printf("SKIP: this build has no sm_90a code (the wgmma helpers trap)\n");
    return 77;
  }
  std::printf("%s: warpgroup MMA (wgmma.mma_async, A in registers, B core-matrix layout)\n", prop.name);
  bool ok = true;
  ok = run<64, 16, 1>(1) && ok;
  ok = run<64, 64, 4>(2) && ok;
  ok = run<64, 128, 8>(3) && ok;
  ok = run<128, 64, 4>(4) && ok;
  ok = run<128, 128, 8>(5) && ok;
  ok = run<128, 128, 4>(6) && ok;
  ok = run<128, 256, 4>(7) && ok;
  ok = run<64, 256, 16>(8) && ok;
  std::printf("%s\n", ok ? "ALL PASS" : "FAILURES");
  return ok ? 0 : 1;
}
