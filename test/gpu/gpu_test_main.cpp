// main() of the GoogleTest GPU programs: exit 77 (CTest: skipped) with the reason when no CUDA
// device of compute capability 8.0 or newer is present; otherwise run every test.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "device count 0");
    return 77;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess || p.major < 8) {
    std::printf("SKIPPED: device 0 (%s) is not sm_80 or newer\n", p.name);
    return 77;
  }
  std::printf("device 0: %s, sm_%d%d, %d SMs\n", p.name, p.major, p.minor, p.multiProcessorCount);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
