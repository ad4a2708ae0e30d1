#include "host_buffers.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#include "hk/build_config.hpp"
#include "hk/error.hpp"

#if HK_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace hk::app {

HostBlock::HostBlock(size_t bytes, bool pinned) : bytes_(bytes) {
  if (bytes == 0) return;
#if HK_HAVE_CUDA
  if (pinned) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) == cudaSuccess) {
      p_ = p;
      pinned_ = true;
    } else {
      cudaGetLastError();  // fall back to pageable memory: slower copies, same results
    }
  }
#else
  (void)pinned;
#endif
  if (!p_) {
    p_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p_) throw std::bad_alloc();
  }
  std::memset(p_, 0, bytes);
}

HostBlock::~HostBlock() { release(); }

HostBlock& HostBlock::operator=(HostBlock&& o) noexcept {
  if (this != &o) {
    release();
    p_ = o.p_;
    bytes_ = o.bytes_;
    pinned_ = o.pinned_;
    o.p_ = nullptr;
  }
  return *this;
}

void HostBlock::release() noexcept {
  if (!p_) return;
#if HK_HAVE_CUDA
  if (pinned_) {
    cudaFreeHost(p_);
    p_ = nullptr;
    return;
  }
#endif
  std::free(p_);
  p_ = nullptr;
}

int cuda_device_count() {
#if HK_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

DeviceMemory device_memory(int device) {
  DeviceMemory m;
#if HK_HAVE_CUDA
  m.device_count = cuda_device_count();
  if (device < 0 || device >= m.device_count) return m;
  if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&m.free, &m.total) != cudaSuccess) {
    cudaGetLastError();
    return m;
  }
  m.known = true;
#else
  (void)device;
#endif
  return m;
}

}  // namespace hk::app
