// Inline PTX wrappers shared by the tensor-core kernels (flash attention, fused QKV+attention,
// fused post-attention chain): shared-memory addresses, cp.async, ldmatrix, mma.sync (sm_80+).
// Device-only; include from .cu files.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace hk::cuda::ptx {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy of `src_bytes` (0 or 16) bytes; the rest of the 16 are zero-filled, and
// with 0 nothing is read from global memory.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// volatile: a caller may read the same address again after a barrier with new contents.
__device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t& r0, uint32_t& r1, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2_t(uint32_t& r0, uint32_t& r1, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

// D = A(16x16, row) * B(16x8, col) + D, fp16 in, fp32 accumulate.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The B fragment of a 16 x 8 block of fp16 ones (both halves 1.0): mma_16816(l, P, kHalf2Ones,
// kHalf2Ones) adds P's 16 columns into every column of l, so l[0] / l[2] hold whole row sums of
// rows g / g + 8 (no quad reduction). Softmax row sums this way cost one mma per 16 keys instead
// of one add per probability, and sum P as rounded to fp16 for the P V product.
constexpr uint32_t kHalf2Ones = 0x3C003C00u;

// D = A(16x8, row) * B(8x8, col) + D: a k = 8 product (head_dim 8) without a zero-padded half.
__device__ __forceinline__ void mma_1688(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(b0));
}

// Programmatic dependent launch (launch.hpp: launch_pdl). pdl_wait: block until the grids this
// one depends on in its stream have completed and their memory is visible; every kernel launched
// with launch_pdl calls it before its first access to memory that an earlier kernel of the
// stream writes or reads (only parameters and the model's weights may be read before it).
// pdl_launch_dependents: lets the stream's next kernel start launching (its CTAs then run up to
// their own pdl_wait) once every CTA of this grid has called it or exited. Both are no-ops when
// the kernel was launched without the attribute, and compile to nothing before sm_90.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Thread-block clusters (sm_90+; launch.hpp: launch_pdl_cluster). cluster_sync: every thread of
// every CTA of the cluster arrives (release) and waits (acquire), so shared-memory writes made
// before it are visible to the other CTAs after it. cluster_map: the address of the same shared
// variable in the CTA of cluster rank `rank` (shared::cluster window); ld_cluster_* /
// st_cluster_*: loads from / stores to such an address. Compile to a trap before sm_90 (a cluster kernel is never launched there).
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
// The two halves of cluster_sync, for work between them: arrive (release: this thread's memory
// accesses before it, shared and global, are performed for the cluster) and wait (acquire).
// Every thread of every CTA calls each once per phase, in this order.
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
// An arrive without release semantics: for a CTA whose only point is that its earlier reads
// are complete (e.g. cp.async data already waited for), so that the others may then overwrite
// what it read; it orders none of its memory accesses for them.
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ uint32_t cluster_map(uint32_t smem_addr, uint32_t rank) {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_addr), "r"(rank));
#else
  __trap();
#endif
  return r;
}
__device__ __forceinline__ float ld_cluster_f32(uint32_t addr) {
  float v = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
#else
  __trap();
#endif
  return v;
}
__device__ __forceinline__ float4 ld_cluster_f32x4(uint32_t addr) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
#else
  __trap();
#endif
  return v;
}

__device__ __forceinline__ void st_cluster_u32(uint32_t addr, uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
#else
  __trap();
#endif
}
// HK_SM90(body): the body on sm_90 and later, a trap before (kernels using the helpers below are
// never launched on earlier devices).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define HK_SM90(...) __VA_ARGS__
#else
#define HK_SM90(...) __trap()
#endif
// mbarrier and bulk-copy (Hopper TMA engine) helpers for exchanges inside a cluster: a CTA copies a
// block of its shared memory into another CTA's with cp.async.bulk, completing bytes on that
// CTA's mbarrier, whose threads wait for the phase (expect_tx set by one of them). Traps before sm_90.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  HK_SM90(asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory"));
}
// Makes mbarrier initialisations visible to the cluster (before the cluster barrier that
// precedes their first remote use).
__device__ __forceinline__ void fence_mbar_init_cluster() {
  HK_SM90(asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"));
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  HK_SM90(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory"));
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  HK_SM90({
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
  });
}
// Orders this thread's earlier generic-proxy shared-memory writes before later async-proxy
// (bulk copy) reads of them.
__device__ __forceinline__ void fence_proxy_async_shared() {
  HK_SM90(asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"));
}
// `bytes` (a multiple of 16; 16-byte aligned addresses) from this CTA's shared memory at src to
// dst (a shared::cluster address from cluster_map), completing them on the mbarrier at bar (the
// destination CTA's, shared::cluster).
__device__ __forceinline__ void bulk_copy_to_cluster(uint32_t dst, uint32_t src, uint32_t bytes, uint32_t bar) {
  HK_SM90({
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "r"(src), "r"(bytes), "r"(bar)
               : "memory");
  });
}
// This CTA's rank in its cluster (0 outside clusters; a trap before sm_90).
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#else
  __trap();
#endif
  return r;
}

// Sums of a and b over the 4 lanes of the caller's quad (the lanes holding one row pair of an
// mma C fragment), left in every lane of the quad.
__device__ __forceinline__ void quad_sum(float& a, float& b) {
  a += __shfl_xor_sync(0xffffffffu, a, 1);
  b += __shfl_xor_sync(0xffffffffu, b, 1);
  a += __shfl_xor_sync(0xffffffffu, a, 2);
  b += __shfl_xor_sync(0xffffffffu, b, 2);
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// 8- and 16-byte global stores as one instruction each. Written as float2 / uint4 assignments,
// some of the post-attention chain's stores reached the PTX as 4-byte ones (st.global.f32 pairs,
// st.global.u32 quadruples): each warp store of the mma C layout touches 8 rows, so every split
// multiplied its L1 tag requests (ncu source counters, case 6). The pointer must be aligned to the
// store's width.
__device__ __forceinline__ void st_global_f32x2(float* p, float a, float b) {
  asm volatile("st.global.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void st_global_b32x4(void* p, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

}  // namespace hk::cuda::ptx
