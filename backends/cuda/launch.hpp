// Kernel launches with programmatic dependent launch (PDL, sm_90+): a kernel launched through
// launch_pdl may start on the GPU before the previous kernel of its stream has finished, once
// every CTA of that kernel has executed griddepcontrol.launch_dependents (ptx.cuh:
// pdl_launch_dependents) or exited; it runs its prologue (shared-memory staging of weights,
// parameter loads, CTA rasterisation) in the shadow of the previous kernel's last wave and waits
// in pdl_wait for that kernel's completion before touching activations. Captured into CUDA
// graphs as programmatic edges, so the replayed forward gets the same overlap.
//
// Contract for a kernel launched with launch_pdl: it calls pdl_wait() before any access to
// memory that an earlier kernel of the stream writes or reads (activations, lengths, offsets,
// outputs); only its parameters and the model's weights may be read before. Kernels that do not
// follow the contract are launched the ordinary way (<<<>>>): they then wait for their
// predecessor as usual, whatever it was launched with.
//
// Off (ordinary launches) on devices before sm_90 and when HK_PDL=0 is set in the environment
// (read once per process through the knob registry: values other than 0 / 1 are an error).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common.cuh"

namespace hk::cuda {

// True when launch_pdl adds the PDL attribute on the current device.
bool pdl_enabled();
// True when `kernel`'s code on the current device was generated for sm_90 or newer (its PTX
// version): code JIT-compiled from older PTX has no griddepcontrol instructions (pdl_wait is
// then empty), so it must not be launched early. Cached per kernel.
bool pdl_compiled(const void* kernel);

namespace detail {
// cudaLaunchKernelEx with the PDL attribute (where pdl_enabled and the kernel's code has it) and,
// when `cluster` is set, the cluster dimension attribute.
template <class... KArgs, class... Args>
void launch_ex(void (*kernel)(KArgs...), dim3 grid, dim3 block, const dim3* cluster, size_t smem, cudaStream_t stream,
               Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster->x;
    attr[n].val.clusterDim.y = cluster->y;
    attr[n].val.clusterDim.z = cluster->z;
    ++n;
  }
  if (pdl_enabled() && pdl_compiled(reinterpret_cast<const void*>(kernel))) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  HK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
}  // namespace detail

template <class... KArgs, class... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  detail::launch_ex(kernel, grid, block, nullptr, smem, stream, std::forward<Args>(args)...);
}

// launch_pdl for a kernel whose CTAs form thread-block clusters of `cluster` CTAs (sm_90+; each
// grid dimension a multiple of the cluster's). The PDL attribute as launch_pdl adds it.
template <class... KArgs, class... Args>
void launch_pdl_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, dim3 cluster, size_t smem, cudaStream_t stream,
                        Args&&... args) {
  detail::launch_ex(kernel, grid, block, &cluster, smem, stream, std::forward<Args>(args)...);
}

}  // namespace hk::cuda
