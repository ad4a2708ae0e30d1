// The kernel that stands in for a captured memset node (graph.hpp, memset_nodes_as_kernels).
#include <cuda_runtime.h>

#include <algorithm>

#include "graph.hpp"

namespace hk::cuda {
namespace {

// Writes `value` to width x height elements of elem_size bytes (1, 2 or 4) starting at dst, rows
// `pitch` bytes apart: what cudaMemset2DAsync(dst, pitch, value, width * elem_size, height) does.
__global__ void memset_node_kernel(unsigned char* dst, size_t pitch, unsigned int value, unsigned int elem_size,
                                   size_t width, size_t height) {
  const size_t n = width * height;
  const size_t step = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const size_t r = i / width;
    unsigned char* p = dst + r * pitch + (i - r * width) * elem_size;
    if (elem_size == 4) {
      *reinterpret_cast<unsigned int*>(p) = value;
    } else if (elem_size == 2) {
      *reinterpret_cast<unsigned short*>(p) = static_cast<unsigned short>(value);
    } else {
      *p = static_cast<unsigned char>(value);
    }
  }
}

}  // namespace

MemsetKernelArgs::MemsetKernelArgs(const cudaMemsetParams& m)
    : dst(static_cast<unsigned char*>(m.dst)),
      pitch(m.height > 1 ? m.pitch : 0),
      value(m.value),
      elem_size(m.elementSize),
      width(m.width),
      height(m.height < 1 ? 1 : m.height) {
  args[0] = &dst;
  args[1] = &pitch;
  args[2] = &value;
  args[3] = &elem_size;
  args[4] = &width;
  args[5] = &height;
  const size_t n = width * height;
  const unsigned threads = n < 256 ? unsigned((n + 31) / 32 * 32) : 256u;
  params.func = reinterpret_cast<void*>(&memset_node_kernel);
  params.blockDim = dim3(threads < 32 ? 32u : threads);
  params.gridDim = dim3(unsigned(std::min<size_t>((n + 255) / 256, 1024)));
  if (params.gridDim.x < 1) params.gridDim.x = 1;
  params.sharedMemBytes = 0;
  params.kernelParams = args;
  params.extra = nullptr;
}

}  // namespace hk::cuda
