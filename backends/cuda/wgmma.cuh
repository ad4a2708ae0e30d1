// Warpgroup tensor-core products (sm_90a: wgmma.mma_async) for kernels that keep the mma.sync
// accumulator layout. A warpgroup (4 consecutive warps, 128 threads) computes a 64 x N tile per
// k16 step; warp w of the group holds rows 16 w .. 16 w + 15 of it in exactly the m16n8 C layout
// of mma.sync (thread (g, t): rows g and g + 8, columns 8 j + 2 t, + 1 of every n8 block j), and
// supplies those rows' A fragment in the m16n8k16 A layout (ldmatrix x4 as for mma.sync). B is
// read by the tensor cores from shared memory through a matrix descriptor, once per warpgroup
// instead of once per warp with ldmatrix.
//
// B layout used here (K-major, no swizzle): the B tile [N][K] (an nn.Linear [out, in] weight) is
// stored as 8 x 8 core matrices of 128 contiguous bytes (8 rows n of 16 bytes = 8 k values),
// core matrix (n / 8, k / 8) at ((n / 8) * (K / 8) + k / 8) * 128 bytes: the descriptor's leading
// byte offset (between core matrices adjacent in K) is 128, its stride byte offset (adjacent in
// N) K * 16. A k16 step starts 256 bytes further. (PTX ISA, "Matrix Descriptor Format" of the
// asynchronous warpgroup-level matrix instructions.)
//
// Ordering rules of the instructions (PTX ISA, wgmma.fence): a wgmma.fence by the whole
// warpgroup between any register write (accumulators, A fragments) and the wgmma that reads it;
// shared memory written through the generic proxy (st.shared, cp.async) needs
// fence.proxy.async before the tensor cores read it; results are in the accumulators only after
// wgmma.wait_group. fence_operands keeps the compiler from moving accumulator reads and writes
// across those points.
//
// Compiled for sm_90a only (__CUDA_ARCH_FEAT_SM90_ALL: the arch-specific target); elsewhere every
// function traps, and the host never launches such a kernel there (HK_CUDA_HAVE_WGMMA and a
// compute capability 9.0 device).
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HK_WGMMA 1
#else
#define HK_WGMMA 0
#endif

namespace hk::cuda::wgmma {

// Descriptor of a K-major, non-swizzled B operand at shared address `addr` (16-byte aligned).
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr >> 4) & 0x3FFFu) | (uint64_t((lbo >> 4) & 0x3FFFu) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFFu) << 32);
}

__device__ __forceinline__ void fence() {
#if HK_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#if HK_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wait() {
#if HK_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Generic-proxy writes to shared memory (cp.async, st.shared) made visible to the async proxy.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if HK_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

template <int NT>
__device__ __forceinline__ void fence_operands(float (&d)[NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int k = 0; k < 4; ++k) asm volatile("" : "+f"(d[j][k])::"memory");
  }
}

// Keeps A fragments given to an in-flight wgmma alive (unchanged, in their registers) in the
// compiler's view up to this point: call after the wait that covers that wgmma.
template <int KS>
__device__ __forceinline__ void keep_fragments(uint32_t (&a)[KS][4]) {
#pragma unroll
  for (int k = 0; k < KS; ++k) {
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[k][i])::"memory");
  }
}

// d[N / 8][4] += A (this warp's 16 x 16 rows of the group's 64, registers) x B (16 x N, desc).
template <int N>
__device__ __forceinline__ void mma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc);

template <>
__device__ __forceinline__ void mma_rs<64>(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc) {
#if HK_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
      "}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                   "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
                   "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                   "+f"(d[7][2]), "+f"(d[7][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
#else
  (void)d;
  (void)a;
  (void)desc;
  __trap();
#endif
}

template <>
__device__ __forceinline__ void mma_rs<128>(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc) {
#if HK_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
      "}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                   "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
                   "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                   "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
                   "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
                   "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
                   "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),
                   "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
                   "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
#else
  (void)d;
  (void)a;
  (void)desc;
  __trap();
#endif
}

}  // namespace hk::cuda::wgmma
