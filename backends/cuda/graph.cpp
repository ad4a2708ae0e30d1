#include "graph.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

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

namespace {

// One of hk's kernels (namespace hk or the anonymous namespace of its sources), by the mangled
// name the runtime knows; library kernels launched through the driver have none here.
bool own_kernel(cudaGraphNode_t n) {
  cudaGraphNodeType t{};
  if (cudaGraphNodeGetType(n, &t) != cudaSuccess || t != cudaGraphNodeTypeKernel) return false;
  cudaKernelNodeParams kp{};
  if (cudaGraphKernelNodeGetParams(n, &kp) != cudaSuccess || kp.func == nullptr) {
    cudaGetLastError();
    return false;
  }
  const char* name = nullptr;
  if (cudaFuncGetName(&name, kp.func) != cudaSuccess || name == nullptr) {
    cudaGetLastError();
    return false;
  }
  return std::strncmp(name, "_ZN2hk", 6) == 0 || std::strncmp(name, "_ZN12_GLOBAL__N_1", 17) == 0;
}

std::vector<cudaGraphNode_t> deps_of(cudaGraphNode_t n, std::vector<cudaGraphEdgeData>* edges = nullptr) {
  size_t k = 0;
  HK_CUDA_CHECK(cudaGraphNodeGetDependencies(n, nullptr, nullptr, &k));
  std::vector<cudaGraphNode_t> d(k);
  std::vector<cudaGraphEdgeData> e(k);
  if (k) HK_CUDA_CHECK(cudaGraphNodeGetDependencies(n, d.data(), e.data(), &k));
  if (edges) *edges = e;
  return d;
}

std::vector<cudaGraphNode_t> dependents_of(cudaGraphNode_t n) {
  size_t k = 0;
  HK_CUDA_CHECK(cudaGraphNodeGetDependentNodes(n, nullptr, nullptr, &k));
  std::vector<cudaGraphNode_t> d(k);
  if (k) HK_CUDA_CHECK(cudaGraphNodeGetDependentNodes(n, d.data(), nullptr, &k));
  return d;
}

}  // namespace

int hoist_workspace_memsets(cudaGraph_t graph, DeviceRange ws) {
  if (ws.base == nullptr || ws.bytes == 0) return 0;
  size_t n = 0;
  HK_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) HK_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  const auto lo = reinterpret_cast<uintptr_t>(ws.base), hi = lo + ws.bytes;
  int moved = 0;
  for (cudaGraphNode_t m : nodes) {
    cudaGraphNodeType t{};
    HK_CUDA_CHECK(cudaGraphNodeGetType(m, &t));
    if (t != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams mp{};
    HK_CUDA_CHECK(cudaGraphMemsetNodeGetParams(m, &mp));
    const auto dst = reinterpret_cast<uintptr_t>(mp.dst);
    const size_t row_bytes = size_t(mp.width) * mp.elementSize;
    const size_t span = mp.height > 1 ? mp.pitch * (mp.height - 1) + row_bytes : row_bytes;
    if (dst < lo || dst + span > hi) continue;  // not (only) the workspace
    std::vector<cudaGraphEdgeData> in_edges;
    const std::vector<cudaGraphNode_t> preds = deps_of(m, &in_edges);
    const std::vector<cudaGraphNode_t> succs = dependents_of(m);
    if (preds.size() != 1 || succs.size() != 1 || !own_kernel(preds[0])) continue;
    // Up over hk's own kernels to the nearest node that is not one (or to the graph's start).
    cudaGraphNode_t at = preds[0];
    bool to_root = false;
    for (;;) {
      const std::vector<cudaGraphNode_t> up = deps_of(at);
      if (up.empty()) {
        to_root = true;
        break;
      }
      if (up.size() != 1) break;  // a join: stop below it, at `at`'s single predecessor set
      at = up[0];
      if (!own_kernel(at)) break;
    }
    if (!to_root && own_kernel(at)) continue;  // stopped at a join of own kernels: leave it
    const cudaGraphNode_t p = preds[0], g = succs[0];
    cudaGraphEdgeData plain{};  // a full dependency (default port and type)
    HK_CUDA_CHECK(cudaGraphRemoveDependencies(graph, &p, &m, &in_edges[0], 1));
    if (!to_root) HK_CUDA_CHECK(cudaGraphAddDependencies(graph, &at, &m, &plain, 1));
    HK_CUDA_CHECK(cudaGraphAddDependencies(graph, &p, &g, &plain, 1));
    ++moved;
  }
  return moved;
}

cudaGraphExec_t GraphCache::capture(const GraphKey& key, cudaStream_t stream, cudaEvent_t idle,
                                    const std::function<void(cudaStream_t)>& record, Range hoist) {
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
  try {
    hoist_workspace_memsets(graph, hoist);
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
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
