// Measured dispatch on the device (see tune_cuda.hpp): identity and timing. Host code only.
#include "tune_cuda.hpp"

#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "cublaslt_api.hpp"
#include "graph.hpp"
#include "attention_route.hpp"
#include "common.cuh"

namespace hk::cuda {
namespace {

std::string version_text(int v) {  // 13000 -> "13.0"
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

}  // namespace

hk::tune::DeviceIdentity device_identity(int device, bool libraries) {
  cudaDeviceProp p{};
  HK_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  hk::tune::DeviceIdentity id;
  id.name = p.name;
  id.sm_count = p.multiProcessorCount;
  id.arch = "sm_" + std::to_string(p.major) + std::to_string(p.minor);
  int drv = 0, rt = 0;
  HK_CUDA_CHECK(cudaDriverGetVersion(&drv));
  HK_CUDA_CHECK(cudaRuntimeGetVersion(&rt));
  id.driver = version_text(drv);
  id.runtime = version_text(rt);
  if (!libraries) {  // an engine on its own kernels only: asking the versions would load cuBLASLt
    id.libraries = "none";
    return id;
  }
  id.libraries = "cublasLt " + std::to_string(lt::api().GetVersion());
  if (const int cudnn = CudnnRoute::runtime_version()) id.libraries += " cudnn " + std::to_string(cudnn);
  return id;
}

CandidateTimer::CandidateTimer(cudaStream_t stream) : stream_(stream) {}

CandidateTimer::~CandidateTimer() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void CandidateTimer::ensure_events(size_t n) {
  while (events_.size() < n) {
    cudaEvent_t e = nullptr;
    HK_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
}

double CandidateTimer::time(const std::function<void(cudaStream_t)>& record, bool graph) {
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    HK_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t g = nullptr;
    try {
      record(stream_);
    } catch (...) {
      cudaStreamEndCapture(stream_, &g);
      if (g) cudaGraphDestroy(g);
      cudaGetLastError();
      throw;
    }
    HK_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    try {
      exec = instantiate_graph(g);  // as the forward's graphs are (memset nodes as kernels)
    } catch (...) {
      cudaGraphDestroy(g);
      throw;
    }
    cudaGraphDestroy(g);
  }
  auto once = [&] {
    if (exec) {
      HK_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    } else {
      record(stream_);
    }
  };
  try {
    ensure_events(2);
    once();  // untimed: first-touch costs (module loads, cache state) stay out of the median
    HK_CUDA_CHECK(cudaEventRecord(events_[0], stream_));
    once();
    HK_CUDA_CHECK(cudaEventRecord(events_[1], stream_));
    HK_CUDA_CHECK(cudaEventSynchronize(events_[1]));
    float est = 0;
    HK_CUDA_CHECK(cudaEventElapsedTime(&est, events_[0], events_[1]));
    const int reps = std::clamp(int(target_ms / std::max(est, 1e-3f)), min_reps, max_reps);
    ensure_events(2 * size_t(reps));
    for (int r = 0; r < reps; ++r) {
      HK_CUDA_CHECK(cudaEventRecord(events_[2 * size_t(r)], stream_));
      once();
      HK_CUDA_CHECK(cudaEventRecord(events_[2 * size_t(r) + 1], stream_));
    }
    HK_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<float> ms(static_cast<size_t>(reps));
    for (int r = 0; r < reps; ++r)
      HK_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(r)], events_[2 * size_t(r)], events_[2 * size_t(r) + 1]));
    std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
    if (exec) cudaGraphExecDestroy(exec);
    return double(ms[size_t(reps / 2)]);
  } catch (...) {
    cudaStreamSynchronize(stream_);
    if (exec) cudaGraphExecDestroy(exec);
    throw;
  }
}

double max_abs_diff_host(const void* a, const void* b, DType type, int64_t rows, int cols, int64_t row_stride,
                         const int32_t* lengths, int S) {
  double m = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (lengths && S > 0 && (r % S) >= lengths[r / S]) continue;
    for (int c = 0; c < cols; ++c) {
      const int64_t i = r * row_stride + c;
      double x, y;
      if (type == DType::f16) {
        x = double(__half2float(static_cast<const __half*>(a)[i]));
        y = double(__half2float(static_cast<const __half*>(b)[i]));
      } else {
        x = double(static_cast<const float*>(a)[i]);
        y = double(static_cast<const float*>(b)[i]);
      }
      double d;
      if (std::isfinite(x) && std::isfinite(y)) {
        d = std::fabs(x - y) / std::max(1.0, std::fabs(y));
      } else {
        const bool same = (std::isnan(x) && std::isnan(y)) || (std::isinf(x) && x == y);
        d = same ? 0.0 : INFINITY;
      }
      m = std::max(m, d);
    }
  }
  return m;
}

}  // namespace hk::cuda
