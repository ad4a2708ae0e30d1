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
