#include "graph.hpp"

#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"
#include "hk/tune/knobs.hpp"

namespace hk::cuda {

namespace {

bool default_edges(const std::vector<cudaGraphEdgeData>& edges) {
  for (const cudaGraphEdgeData& e : edges)
    if (e.type != cudaGraphDependencyTypeDefault || e.from_port != 0 || e.to_port != 0) return false;
  return true;
}

}  // namespace

int memset_nodes_as_kernels(cudaGraph_t graph) {
  size_t n = 0;
  HK_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) HK_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  int device = 0;
  HK_CUDA_CHECK(cudaGetDevice(&device));
  int replaced = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    HK_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams m{};
    HK_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &m));
    if (m.elementSize != 1 && m.elementSize != 2 && m.elementSize != 4) continue;
    if (m.width == 0 || m.height == 0) continue;
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, m.dst) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    if (attr.type != cudaMemoryTypeDevice || attr.device != device) continue;

    size_t nd = 0, nn = 0;
    HK_CUDA_CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &nd));
    HK_CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &nn));
    std::vector<cudaGraphNode_t> deps(nd), next(nn);
    std::vector<cudaGraphEdgeData> dep_edges(nd), next_edges(nn);
    if (nd) HK_CUDA_CHECK(cudaGraphNodeGetDependencies(node, deps.data(), dep_edges.data(), &nd));
    if (nn) HK_CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, next.data(), next_edges.data(), &nn));
    if (!default_edges(dep_edges) || !default_edges(next_edges)) continue;

    const MemsetKernelArgs k(m);
    cudaGraphNode_t kernel = nullptr;
    HK_CUDA_CHECK(cudaGraphAddKernelNode(&kernel, graph, deps.data(), nd, &k.params));
    HK_CUDA_CHECK(cudaGraphDestroyNode(node));
    for (cudaGraphNode_t d : next) HK_CUDA_CHECK(cudaGraphAddDependencies(graph, &kernel, &d, nullptr, 1));
    ++replaced;
  }
  return replaced;
}

bool graph_memsets_as_kernels() {
  static const bool on = tune::knob_choice("HK_GRAPH_MEMSET", {"kernel", "node"}) != "node";
  return on;
}

cudaGraphExec_t instantiate_graph(cudaGraph_t graph) {
  if (graph_memsets_as_kernels()) memset_nodes_as_kernels(graph);
  cudaGraphExec_t exec = nullptr;
  HK_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  return exec;
}

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
  try {
    exec = instantiate_graph(graph);
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  cudaGraphDestroy(graph);

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
