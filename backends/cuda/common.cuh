// Shared helpers of the CUDA backend: error checking and small device utilities.
// Included by every .cu of backends/cuda; nothing here allocates or launches.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace hk::cuda {

// Thrown for any failing CUDA runtime / library call; the message names the call site.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) {
    throw CudaError(std::string("CUDA error in ") + what + " (" + file + ":" + std::to_string(line) +
                    "): " + cudaGetErrorString(e));
  }
}

// The current device's SM count and opt-in shared memory per block, read on every call (the
// current device may differ between calls; the queries are host-side attribute reads).
struct DeviceLimits {
  int sms = 0;
  int smem_optin = 0;
};
inline DeviceLimits device_limits() {
  int dev = 0;
  DeviceLimits l;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice", __FILE__, __LINE__);
  check_cuda(cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute", __FILE__,
             __LINE__);
  check_cuda(cudaDeviceGetAttribute(&l.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
             "cudaDeviceGetAttribute", __FILE__, __LINE__);
  return l;
}

}  // namespace hk::cuda

#define HK_CUDA_CHECK(expr) ::hk::cuda::check_cuda((expr), #expr, __FILE__, __LINE__)
// After a kernel launch: catches bad launch configurations immediately.
#define HK_CUDA_CHECK_LAUNCH() ::hk::cuda::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
