// How fast the SMs of one thread-block cluster take in a model's weights from L2: the question
// behind the whole-model column kernel at small batches (model_persistent.cu), where every CTA of
// a cluster streams every layer's weights (192 KB per layer at D = F = 128) and a CTA without work
// still needs ~3.3 us per layer for it (perf/RESULTS.md, twenty-fourth GPU run).
//
// Each CTA (16 warps, as the column kernel) takes in `layers` x 192 KB, `reps` times, in units of
// 32 KB (one weight matrix), a CTA barrier after each unit (the kernel's phase barrier), by:
//   ldg        every thread loads its 64 bytes of the unit with 16-byte loads into registers
//   bulk       thread 0 copies the unit into one of two shared-memory slots with one bulk copy
//              (TMA engine) completing on the slot's mbarrier, one unit ahead of its use
//   multicast  the same, but each of the cluster's C CTAs copies 1/C of the unit into every CTA's
//              slot (.multicast::cluster: one L2 read per byte for the whole cluster); a slot is
//              reused only after every CTA has released it (remote mbarrier arrivals)
//   cpasync    every thread copies its 64 bytes of the unit into shared memory with 16-byte
//              cp.async (consecutive chunks: 512 contiguous bytes per warp instruction), waits, and
//              reads them back after a CTA barrier
//   cpblocked  the same with the chunks in the order of the resident-weight kernels' copy into the
//              wgmma core-matrix layout (post_attn_fused.cu copy_blocked, the unit as [64][256]
//              halves: 8 rows x 64 bytes per warp instruction)
// Cluster counts: 1 and 8 clusters, and the whole chip (SMs / C clusters, argument 0), where every SM
// reads the same weights at once as a persistent kernel's CTAs do in their prologue.
// Reported: bytes each SM received per second and per clock (the SM clock from the device).
// Built for sm_90a only (.multicast::cluster is optimised for the arch-specific target).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/ptx.cuh"

namespace {

constexpr int kThreads = 512;
constexpr int kUnit = 32 * 1024;
constexpr int kUnitsPerLayer = 6;
constexpr int kLayerBytes = kUnit * kUnitsPerLayer;

enum Method : int { ldg = 0, bulk = 1, multicast = 2, cpasync = 3, cpblocked = 4 };

using namespace hk::cuda::ptx;

// Arrive on the mbarrier at the same offset in CTA `rank` of the cluster.
__device__ __forceinline__ void mbar_arrive_remote(uint32_t bar, uint32_t rank) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_map(bar, rank)) : "memory");
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void bulk_g2s_multicast(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                                   uint16_t mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;\n" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar), "h"(mask)
      : "memory");
}

// Dynamic shared memory: two slots of kUnit bytes, then full[2] and empty[2] mbarriers.
__global__ void __launch_bounds__(kThreads, 1)
    intake_kernel(const uint4* __restrict__ w, int layers, int reps, int method, int C, unsigned* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = int(threadIdx.x);
  const uint32_t slot0 = smem_u32(smem), bars = slot0 + 2 * kUnit;
  const uint32_t full[2] = {bars, bars + 8}, empty[2] = {bars + 16, bars + 24};
  const uint32_t rank = C > 1 ? cluster_rank() : 0u;
  const int units = reps * layers * kUnitsPerLayer;
  auto unit_src = [&](int u) {
    return reinterpret_cast<const char*>(w) + size_t(u % (layers * kUnitsPerLayer)) * kUnit;
  };
  unsigned acc = 0u;
  if (method == ldg) {
    for (int u = 0; u < units; ++u) {
      const uint4* p = reinterpret_cast<const uint4*>(unit_src(u));
#pragma unroll
      for (int i = 0; i < kUnit / 16 / kThreads; ++i) {
        const uint4 v = __ldg(p + tid + i * kThreads);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
      __syncthreads();
    }
  } else if (method == cpasync || method == cpblocked) {
    for (int u = 0; u < units; ++u) {
      const char* src = unit_src(u);
      const uint32_t slot = slot0 + uint32_t(u & 1) * kUnit;
#pragma unroll
      for (int k = 0; k < kUnit / 16 / kThreads; ++k) {
        const int i = tid + k * kThreads;
        // cpblocked: chunk i of the core-matrix layout holds row r, 16-byte column kc of [64][256] halves
        constexpr int kChunks = 256 / 8;
        const int r = (i / (8 * kChunks)) * 8 + (i & 7), kc = (i >> 3) % kChunks;
        const int from = method == cpasync ? i * 16 : r * 512 + kc * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(slot + uint32_t(i) * 16u), "l"(src + from)
                     : "memory");
      }
      asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
      __syncthreads();
      const uint4* p = reinterpret_cast<const uint4*>(smem + (u & 1) * kUnit);
#pragma unroll
      for (int i = 0; i < kUnit / 16 / kThreads; ++i) {
        const uint4 v = p[tid + i * kThreads];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
    }
  } else {
    if (tid == 0) {
      for (int s = 0; s < 2; ++s) {
        mbar_init(full[s], 1);
        mbar_init(empty[s], uint32_t(C));
      }
      fence_mbar_init_cluster();
    }
    if (C > 1) cluster_sync();
    else __syncthreads();
    const uint16_t mask = uint16_t((1u << C) - 1u);
    const uint32_t part = uint32_t(kUnit / C);
    // Unit u goes to slot u & 1; its issue waits for the slot's release of unit u - 2 (multicast:
    // by every CTA of the cluster, since the copies land in all of them).
    auto issue = [&](int u) {
      const int s = u & 1;
      if (method == multicast && u >= 2) mbar_wait(empty[s], uint32_t(((u >> 1) - 1) & 1));
      mbar_arrive_expect_tx(full[s], kUnit);
      if (method == bulk) {
        bulk_g2s(slot0 + uint32_t(s) * kUnit, unit_src(u), kUnit, full[s]);
      } else {
        bulk_g2s_multicast(slot0 + uint32_t(s) * kUnit + rank * part, unit_src(u) + rank * part, part, full[s],
                           mask);
      }
    };
    if (tid == 0) {
      issue(0);
      if (units > 1) issue(1);
    }
    for (int u = 0; u < units; ++u) {
      const int s = u & 1;
      mbar_wait(full[s], uint32_t((u >> 1) & 1));
      const uint4* p = reinterpret_cast<const uint4*>(smem + s * kUnit);
#pragma unroll
      for (int i = 0; i < kUnit / 16 / kThreads; ++i) {
        const uint4 v = p[tid + i * kThreads];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
      __syncthreads();  // every thread of this CTA done with slot s
      if (tid == 0) {
        if (method == multicast) {
          for (int r = 0; r < C; ++r) mbar_arrive_remote(empty[s], uint32_t(r));
        }
        if (u + 2 < units) issue(u + 2);
      }
    }
    if (C > 1) cluster_sync();  // no CTA exits while copies into it or arrivals on it are in flight
  }
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;  // keeps the loads
}

void BM_Intake(benchmark::State& state) {
  const int method = int(state.range(0)), C = int(state.range(1));
  int clusters = int(state.range(2));
  if (clusters == 0) {  // the whole chip: as many clusters of C as the SMs hold
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    clusters = std::max(1, sms / C);
  }
  const int layers = 4, reps = 40;
  static uint4* w = nullptr;
  static unsigned* sink = nullptr;
  if (!w) {
    std::vector<uint4> host(size_t(layers) * kLayerBytes / 16);
    for (size_t i = 0; i < host.size(); ++i)
      host[i] = make_uint4(unsigned(i), unsigned(i * 3), unsigned(i * 5), unsigned(i * 7));
    if (cudaMalloc(&w, host.size() * 16) != cudaSuccess || cudaMalloc(&sink, 4096 * sizeof(unsigned)) != cudaSuccess ||
        cudaMemcpy(w, host.data(), host.size() * 16, cudaMemcpyHostToDevice) != cudaSuccess) {
      state.SkipWithError("device memory");
      return;
    }
  }
  const size_t smem = 2 * kUnit + 32;
  cudaFuncSetAttribute(intake_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(C * clusters));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(C);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  auto launch = [&] { return cudaLaunchKernelEx(&cfg, intake_kernel, static_cast<const uint4*>(w), layers, reps, method, C, sink); };
  if (launch() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
    state.SkipWithError("launch failed");
    cudaGetLastError();
    return;
  }
  for (auto _ : state) {
    cudaEventRecord(e0);
    launch();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, e0, e1);
    state.SetIterationTime(ms * 1e-3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  int khz = 0;
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  const double bytes_per_sm = double(reps) * layers * kLayerBytes;
  state.counters["GB/s/SM"] =
      benchmark::Counter(bytes_per_sm * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["B/clk/SM"] =
      benchmark::Counter(bytes_per_sm / (double(khz) * 1e3), benchmark::Counter::kIsIterationInvariantRate);
  // Time per layer's 192 KB: total time / (iterations x reps x layers), in us.
  state.counters["us/layer"] = benchmark::Counter(double(reps) * layers * 1e-6,
                                                  benchmark::Counter::kIsIterationInvariantRate |
                                                      benchmark::Counter::kInvert);
  const char* names[] = {"ldg", "bulk", "multicast", "cpasync", "cpblocked"};
  state.SetLabel(std::string(names[method]) + " C=" +
                 std::to_string(C) + " clusters=" + std::to_string(clusters));
}

void args(benchmark::internal::Benchmark* b) {
  for (int clusters : {1, 8, 0})  // 0: the whole chip
    for (int C : {1, 2, 4, 8})
      for (int m : {int(ldg), int(bulk), int(multicast), int(cpasync), int(cpblocked)}) {
        if (m == multicast && C == 1) continue;
        if ((m == cpasync || m == cpblocked) && C > 1) continue;  // no cluster traffic: C = 1 says it all
        b->Args({m, C, clusters});
      }
}
BENCHMARK(BM_Intake)->Apply(args)->UseManualTime()->Iterations(20)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("hk_bench_intake: no CUDA device\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
