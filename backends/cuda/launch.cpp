#include "launch.hpp"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "hk/tune/knobs.hpp"

namespace hk::cuda {

bool pdl_enabled() {
  // Through the knob registry like every other knob: a value other than 0 / 1 is an error.
  static const bool env_on = tune::knob_choice("HK_PDL", {"0", "1"}) != "0";
  if (!env_on) return false;
  // Per device: 0 not asked yet, 1 off, 2 on (compute capability 9.0 or newer).
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices] = {};
  int dev = 0;
  HK_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) return false;
  int v = known[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0;
    HK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    v = major >= 9 ? 2 : 1;
    known[dev].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

bool pdl_compiled(const void* kernel) {
  static std::mutex m;
  static std::unordered_map<const void*, bool> known;  // per kernel (one device per process in practice)
  {
    std::lock_guard<std::mutex> lock(m);
    if (auto it = known.find(kernel); it != known.end()) return it->second;
  }
  cudaFuncAttributes a{};
  HK_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
  const bool ok = a.ptxVersion >= 90;
  std::lock_guard<std::mutex> lock(m);
  known.emplace(kernel, ok);
  return ok;
}

}  // namespace hk::cuda
