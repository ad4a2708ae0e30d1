// Kernel timing for the standalone GPU test programs: a CUDA graph of `launches` launches,
// replayed `reps` times between two events; the median time per launch in ms. The graph removes
// the host's share of each launch (configuration, argument checks: microseconds that one
// event-timed launch of a small problem would count). Informational figures, not assertions.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace hk::gputest {

inline void timing_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "graph timing: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// `launch()` enqueues one launch on `st` (a non-default stream); three untimed launches first.
template <class F>
double graph_ms_per_launch(cudaStream_t st, F&& launch, int launches = 20, int reps = 30) {
  for (int i = 0; i < 3; ++i) launch();
  timing_check(cudaStreamSynchronize(st), "warm-up");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  timing_check(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "begin capture");
  for (int i = 0; i < launches; ++i) launch();
  timing_check(cudaStreamEndCapture(st, &graph), "end capture");
  timing_check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  timing_check(cudaGraphLaunch(exec, st), "first replay");
  timing_check(cudaStreamSynchronize(st), "first replay");
  cudaEvent_t e0, e1;
  timing_check(cudaEventCreate(&e0), "event");
  timing_check(cudaEventCreate(&e1), "event");
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    timing_check(cudaEventRecord(e0, st), "record");
    timing_check(cudaGraphLaunch(exec, st), "replay");
    timing_check(cudaEventRecord(e1, st), "record");
    timing_check(cudaEventSynchronize(e1), "replay");
    float v = 0;
    timing_check(cudaEventElapsedTime(&v, e0, e1), "elapsed");
    ms.push_back(v / float(launches));
  }
  timing_check(cudaEventDestroy(e0), "event");
  timing_check(cudaEventDestroy(e1), "event");
  timing_check(cudaGraphExecDestroy(exec), "destroy");
  timing_check(cudaGraphDestroy(graph), "destroy");
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace hk::gputest
