// The CUDA side of measured dispatch (src/hk/tune/chooser.hpp): the device's identity for
// tune-cache keys, timing of a candidate's launches, and the numeric guard's comparison.
//
// Timing: a candidate's launches are captured once into a CUDA graph and the graph is replayed,
// each replay between two CUDA events, so that candidates which launch differently (one fused
// kernel vs five, a cuBLASLt algorithm with a split-K reduction) are compared on device time and
// not on host launch overhead; the median is reported. Eager timing exists for engines that run
// without graphs (HK_GRAPH=0), where launch overhead is part of the real cost.
// Host-compilable header; the comparison kernel lives in tune_cuda.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "attention.hpp"  // DType
#include "hk/tune/tune_cache.hpp"

namespace hk::cuda {

// Name, SM count, compute capability, driver and runtime versions, cuBLASLt and cuDNN versions
// (libraries = false: "none", for an engine that runs its own kernels only and loads neither).
hk::tune::DeviceIdentity device_identity(int device, bool libraries = true);

class CandidateTimer {
 public:
  // `stream`: a non-blocking stream of the caller; every measurement runs (and synchronises) on it.
  explicit CandidateTimer(cudaStream_t stream);
  ~CandidateTimer();
  CandidateTimer(const CandidateTimer&) = delete;
  CandidateTimer& operator=(const CandidateTimer&) = delete;

  // Median milliseconds of one execution of record(stream). graph: captured once, replayed;
  // otherwise launched eagerly. One untimed execution first, then enough repetitions to fill
  // about target_ms (between min_reps and max_reps). Throws CudaError (capture failure, a
  // launch error); the stream is left usable.
  double time(const std::function<void(cudaStream_t)>& record, bool graph);

  double target_ms = 3.0;
  int min_reps = 5;
  int max_reps = 200;

 private:
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  void ensure_events(size_t n);
};

// The numeric guard's distance of a candidate's output `a` from the reference `b`:
//   max |a[r, c] - b[r, c]| / max(1, |b[r, c]|)
// over rows r < rows that are valid (r % S < lengths[r / S]; lengths null: every row) and
// columns c < cols; element (r, c) at r * row_stride + c, of type `type`. Absolute for values up
// to 1, relative above: one fp16 rounding step of a LayerNorm output near 4 is already 3.9e-3, so
// a purely absolute 2e-3 would reject routes that differ only in the last stored bit.
// A non-finite element where the other is not (or infinities of opposite sign) counts as +inf;
// equal non-finite values count as 0. `result` is 4 bytes of device scratch. Enqueued on
// `stream`, then synchronised; returns the value.
double max_abs_diff(const void* a, const void* b, DType type, int64_t rows, int cols, int64_t row_stride,
                    const int32_t* lengths, int S, float* result, cudaStream_t stream);

// Host reference of the same reduction over host arrays (tests compare the kernel with it).
double max_abs_diff_host(const void* a, const void* b, DType type, int64_t rows, int cols, int64_t row_stride,
                         const int32_t* lengths, int S);

}  // namespace hk::cuda
