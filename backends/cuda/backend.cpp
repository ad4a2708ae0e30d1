#include "backend.hpp"

#include <cuda_runtime.h>

#include <string>

#include "engine.hpp"
#include "hk/error.hpp"

namespace hk::cuda {
namespace {

std::string runtime_version() {
  return std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
}

// Why no engine can be made here, or "" when some device is usable.
std::string probe() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (e == cudaErrorNoDevice) return "no CUDA device";
    if (e == cudaErrorInsufficientDriver)
      return "no CUDA device (no NVIDIA driver, or a driver older than the CUDA " + runtime_version() +
             " runtime this build uses)";
    return std::string("no CUDA device (") + cudaGetErrorString(e) + ")";
  }
  if (n == 0) return "no CUDA device";
  std::string seen;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    if (p.major >= 8) return "";
    seen += (seen.empty() ? "" : ", ") + std::string(p.name) + " sm_" + std::to_string(p.major) +
            std::to_string(p.minor);
  }
  return "no CUDA device of compute capability 8.0 or newer (found " + seen + ")";
}

class CudaBackend final : public Backend {
 public:
  std::string name() const override { return "cuda"; }
  std::string unavailable_reason() const override {
    static const std::string why = probe();
    return why;
  }
  // The primary context of `device`, so that the engine's constructor finds it. cuBLASLt is left
  // to the engine: a short job's engine runs on the own kernels and never loads it
  // (HK_LIBRARIES); a long job's loads it in its constructor, right after this context.
  void prepare(int device) const override {
    if (!unavailable_reason().empty()) return;
    if (cudaSetDevice(device) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) cudaGetLastError();
  }
  std::unique_ptr<Engine> create(const Model& model, const EngineOptions& options) const override {
    const std::string why = unavailable_reason();
    if (!why.empty()) throw Error("backend 'cuda' is not usable here: " + why);
    return std::make_unique<CudaEngine>(model, options);
  }
};

}  // namespace

const Backend& backend() {
  static const CudaBackend b;
  return b;
}

}  // namespace hk::cuda
