#include "host_buffers.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <new>

#include "hk/build_config.hpp"
#include "hk/error.hpp"
#include "hk/tune/knobs.hpp"

#if HK_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#endif

namespace hk::app {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
bool huge_pages_wanted() {
  static const bool on = hk::tune::knob_choice("HK_HOST_HUGEPAGES", {"1", "0"}) != "0";
  return on;
}
// The kernel gives advised regions huge pages ("[always]" or "[madvise]" selected).
bool huge_pages_allowed() {
  static const bool allowed = [] {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string mode;
    std::getline(f, mode);
    return mode.find("[always]") != std::string::npos || mode.find("[madvise]") != std::string::npos;
  }();
  return allowed;
}
}  // namespace

HostBlock::HostBlock(size_t bytes, Touch touch) : bytes_(bytes) {
  if (bytes == 0) return;
  // Page-aligned: cudaHostRegister pins whole pages, and no other object shares them. Blocks of
  // 2 MiB and more on transparent huge pages where allowed (HK_HOST_HUGEPAGES): a 64 MiB chunk
  // buffer then takes 32 page faults on its first fill instead of 16384.
  const bool huge = bytes >= kHugePage && huge_pages_wanted();
  const size_t align = huge ? kHugePage : 4096;
  const size_t size = (bytes + align - 1) / align * align;
  p_ = std::aligned_alloc(align, size);
  if (!p_) throw std::bad_alloc();
  if (huge) huge_ = ::madvise(p_, size, MADV_HUGEPAGE) == 0 && huge_pages_allowed();  // advice only
  if (touch == Touch::now) std::memset(p_, 0, bytes);
}

void HostBlock::touch() {
  if (p_) std::memset(p_, 0, bytes_);
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
    huge_ = o.huge_;
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

// NVML (the driver's management library) loaded and initialised for the object's lifetime;
// ok() false when it is missing or does not start. Asks nothing of CUDA.
class Nvml {
 public:
  Nvml() : lib_(::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) {
    if (!lib_) return;
    const auto init = sym<int (*)()>("nvmlInit_v2");
    shutdown_ = sym<int (*)()>("nvmlShutdown");
    ok_ = init && shutdown_ && init() == 0;
  }
  ~Nvml() {
    if (ok_) shutdown_();
    if (lib_) ::dlclose(lib_);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;
  bool ok() const { return ok_; }
  // An entry point, or null.
  template <class F>
  F sym(const char* name) const {
    return lib_ ? reinterpret_cast<F>(::dlsym(lib_, name)) : nullptr;
  }

 private:
  void* lib_ = nullptr;
  int (*shutdown_)() = nullptr;
  bool ok_ = false;
};
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
  const Nvml nvml;
  const auto by_bus = nvml.sym<int (*)(const char*, NvmlDevice*)>("nvmlDeviceGetHandleByPciBusId_v2");
  const auto info = nvml.sym<int (*)(NvmlDevice, NvmlMemory*)>("nvmlDeviceGetMemoryInfo");
  if (nvml.ok() && by_bus && info) {
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
  }
#else
  (void)device;
#endif
  return m;
}

std::vector<std::string> node_gpus() {
#if HK_HAVE_CUDA
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::vector<std::string> out;
    std::string s = v, item;
    for (size_t i = 0; i <= s.size(); ++i) {
      if (i < s.size() && s[i] != ',') {
        if (s[i] != ' ') item += s[i];
        continue;
      }
      const bool index = !item.empty() && item.find_first_not_of("0123456789") == std::string::npos;
      if (!index && item.rfind("GPU-", 0) != 0 && item.rfind("MIG-", 0) != 0) return {};  // CUDA would stop here
      out.push_back(item);
      item.clear();
    }
    return out;
  }
  const Nvml nvml;
  const auto count = nvml.sym<int (*)(unsigned*)>("nvmlDeviceGetCount_v2");
  const auto by_index = nvml.sym<int (*)(unsigned, NvmlDevice*)>("nvmlDeviceGetHandleByIndex_v2");
  const auto mig = nvml.sym<int (*)(NvmlDevice, unsigned*, unsigned*)>("nvmlDeviceGetMigMode");
  std::vector<std::string> out;
  unsigned n = 0;
  bool known = nvml.ok() && count && by_index && count(&n) == 0;
  for (unsigned i = 0; known && i < n; ++i) {
    NvmlDevice d = nullptr;
    unsigned current = 0, pending = 0;
    if (by_index(i, &d) != 0) known = false;
    // A GPU in MIG mode: CUDA numbers its instances, not the GPU (mig absent: NVML older than MIG).
    else if (mig && mig(d, &current, &pending) == 0 && current != 0) known = false;
  }
  for (unsigned i = 0; known && i < n; ++i) out.push_back(std::to_string(i));
  return out;
#else
  return {};
#endif
}

int nvidia_gpu_count() {
  std::error_code ec;
  int n = 0;
  for (std::filesystem::directory_iterator it("/proc/driver/nvidia/gpus", ec), end; !ec && it != end; it.increment(ec))
    ++n;
  return n;
}

bool restrict_to_gpu(const std::string& gpu) {
#if HK_HAVE_CUDA
  return !gpu.empty() && ::setenv("CUDA_VISIBLE_DEVICES", gpu.c_str(), 1) == 0;
#else
  (void)gpu;
  return false;
#endif
}

}  // namespace hk::app
