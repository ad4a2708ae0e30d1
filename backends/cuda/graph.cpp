#include "graph.hpp"

#include <cuda_runtime.h>

#include "common.cuh"

namespace hk::cuda {

cudaGraphExec_t GraphCache::find(const GraphKey& key) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->key == key) {
      entries_.splice(entries_.begin(), entries_, it);
      return entries_.front().exec;
    }
  }
  return nullptr;
}

cudaGraphExec_t GraphCache::capture(const GraphKey& key, cudaStream_t stream, cudaEvent_t idle,
                                    const std::function<void(cudaStream_t)>& record) {
  // Thread-local mode: other threads of the process may keep using CUDA during the capture.
  HK_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    record(stream);
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream, &broken);
    if (broken) cudaGraphDestroy(broken);
    cudaGetLastError();  // the failed capture's sticky-free error
    throw;
  }
  cudaGraph_t graph = nullptr;
  HK_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  HK_CUDA_CHECK(inst);

  if (entries_.size() >= capacity_) {
    HK_CUDA_CHECK(cudaEventSynchronize(idle));
    cudaGraphExecDestroy(entries_.back().exec);
    entries_.pop_back();
  }
  entries_.push_front({key, exec});
  return exec;
}

void GraphCache::clear() {
  for (auto& e : entries_) cudaGraphExecDestroy(e.exec);
  entries_.clear();
}

}  // namespace hk::cuda
