// CUDA graphs of the CUDA engine: one captured forward per (B, token rows, input, lengths,
// output) set, replayed per call. Capture bakes pointers into the graph, hence the key; a small LRU keeps
// the host path's two alternating outputs and a benchmark's fixed buffers resident.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>

namespace hk::cuda {

struct GraphKey {
  int batch = 0;
  const void* x = nullptr;
  const void* lengths = nullptr;
  const void* y = nullptr;
  int64_t rows = 0;  // token rows of the plan (B * S dense; fewer when padding-free)
  bool operator==(const GraphKey& o) const {
    return batch == o.batch && x == o.x && lengths == o.lengths && y == o.y && rows == o.rows;
  }
};

// Kernel-node parameters that do what a memset node with parameters `m` does (1-, 2- or 4-byte
// elements, 1D or 2D). Owns the argument storage params.kernelParams points at; cudaGraphAddKernelNode
// copies it, so the object only has to live until the node is added.
struct MemsetKernelArgs {
  explicit MemsetKernelArgs(const cudaMemsetParams& m);
  MemsetKernelArgs(const MemsetKernelArgs&) = delete;
  MemsetKernelArgs& operator=(const MemsetKernelArgs&) = delete;
  unsigned char* dst;
  size_t pitch;
  unsigned int value;
  unsigned int elem_size;
  size_t width;
  size_t height;
  void* args[6];
  cudaKernelNodeParams params{};
};

// Replaces every memset node of `graph` whose target is memory of the current device by a kernel
// node doing the same writes, with the same dependencies and dependents. cuBLASLt puts a 4-byte
// memset in front of some of its GEMM kernels; in a replayed graph a kernel that depends on a memset
// node starts ~3 us after it, one that depends on a kernel node ~0.5 us (the GPU timelines in
// perf/RESULTS.md). Memset nodes with non-default edges are left alone. Returns how many were replaced.
int memset_nodes_as_kernels(cudaGraph_t graph);

// Whether captured graphs get memset_nodes_as_kernels before instantiation (knob HK_GRAPH_MEMSET:
// kernel, the default, or node).
bool graph_memsets_as_kernels();

// Instantiates a captured graph (memset nodes rewritten first when graph_memsets_as_kernels()).
// The graph stays the caller's. Throws CudaError.
cudaGraphExec_t instantiate_graph(cudaGraph_t graph);

class GraphCache {
 public:
  explicit GraphCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}
  ~GraphCache() { clear(); }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // The instantiated graph of `key`, or null. A hit becomes the most recently used entry.
  cudaGraphExec_t find(const GraphKey& key);

  // Captures record(stream) on `stream` (a stream of ours, not the legacy default stream) and
  // instantiates it. Nothing runs. When the cache is full the least recently used graph is
  // destroyed after `idle` (an event recorded after the last launch) has completed.
  // Throws CudaError when capture or instantiation fails; the stream is left out of capture mode.
  cudaGraphExec_t capture(const GraphKey& key, cudaStream_t stream, cudaEvent_t idle,
                          const std::function<void(cudaStream_t)>& record);

  size_t size() const { return entries_.size(); }
  void clear();  // callers make sure no graph is still running

 private:
  struct Entry {
    GraphKey key;
    cudaGraphExec_t exec;
  };
  size_t capacity_;
  std::list<Entry> entries_;  // most recently used first
};

}  // namespace hk::cuda
