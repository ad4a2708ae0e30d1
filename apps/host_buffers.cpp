#include "host_buffers.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#include "hk/build_config.hpp"
#include "hk/error.hpp"

#if HK_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#endif

namespace hk::app {

HostBlock::HostBlock(size_t bytes, Touch touch) : bytes_(bytes) {
  if (bytes == 0) return;
  // Page-aligned: cudaHostRegister pins whole pages, and no other object shares them.
  p_ = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (!p_) throw std::bad_alloc();
  if (touch == Touch::now) std::memset(p_, 0, bytes);
}

bool HostBlock::pin(int device) {
  if (!p_ || registered_) return registered_;
#if HK_HAVE_CUDA
  if (cudaSetDevice(device) == cudaSuccess && cudaHostRegister(p_, bytes_, cudaHostRegisterPortable) == cudaSuccess) {
    registered_ = true;
  } else {
    cudaGetLastError();  // stays ordinary memory: the engine then stages the copies itself
  }
#else
  (void)device;
#endif
  return registered_;
}

HostBlock::~HostBlock() { release(); }

HostBlock& HostBlock::operator=(HostBlock&& o) noexcept {
  if (this != &o) {
    release();
    p_ = o.p_;
    bytes_ = o.bytes_;
    registered_ = o.registered_;
    o.p_ = nullptr;
  }
  return *this;
}

void HostBlock::release() noexcept {
  if (!p_) return;
#if HK_HAVE_CUDA
  if (registered_) cudaHostUnregister(p_);
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
  m.device = device;
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

#if HK_HAVE_CUDA
namespace {
// The few NVML entry points used, declared here (their C ABI is stable since NVML 5; the header
// is not part of the CUDA toolkit's runtime packages). Return 0 = NVML_SUCCESS.
struct NvmlMemory {
  unsigned long long total, free, used;
};
using NvmlDevice = void*;
using NvmlInit = int (*)();
using NvmlByBusId = int (*)(const char*, NvmlDevice*);
using NvmlMemoryInfo = int (*)(NvmlDevice, NvmlMemory*);
using NvmlShutdown = int (*)();
}  // namespace
#endif

DeviceMemory device_memory_nvml(int device) {
  DeviceMemory m;
#if HK_HAVE_CUDA
  m.device_count = cuda_device_count();
  m.device = device;
  char bus[32] = {0};
  if (device < 0 || device >= m.device_count || cudaDeviceGetPCIBusId(bus, int(sizeof bus), device) != cudaSuccess) {
    cudaGetLastError();
    return m;
  }
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return m;
  const auto init = reinterpret_cast<NvmlInit>(::dlsym(lib, "nvmlInit_v2"));
  const auto by_bus = reinterpret_cast<NvmlByBusId>(::dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  const auto info = reinterpret_cast<NvmlMemoryInfo>(::dlsym(lib, "nvmlDeviceGetMemoryInfo"));
  const auto shutdown = reinterpret_cast<NvmlShutdown>(::dlsym(lib, "nvmlShutdown"));
  if (init && by_bus && info && shutdown && init() == 0) {
    NvmlDevice d = nullptr;
    NvmlMemory mem{};
    // NVML answers for the whole GPU: a MIG instance (or anything else whose memory CUDA sees
    // differently) must ask CUDA instead.
    cudaDeviceProp prop{};
    const bool same_device = cudaGetDeviceProperties(&prop, device) == cudaSuccess;
    if (same_device && by_bus(bus, &d) == 0 && info(d, &mem) == 0 && mem.total > 0 &&
        double(mem.total) <= 1.02 * double(prop.totalGlobalMem) + double(64 << 20)) {
      m.free = size_t(mem.free);
      m.total = size_t(mem.total);
      m.known = true;
    }
    shutdown();
  }
  ::dlclose(lib);
#else
  (void)device;
#endif
  return m;
}

}  // namespace hk::app
