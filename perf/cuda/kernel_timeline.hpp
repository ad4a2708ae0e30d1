// Kernel timeline of replayed forwards through CUPTI's activity API (concurrent-kernel records:
// start / end of every kernel on the GPU's clock, also for kernels launched from CUDA graphs and
// with programmatic dependent launch, whose prologues overlap their predecessors).
//
// CUPTI is loaded at run time (dlopen of libcupti.so.13, then libcupti.so; HK_CUPTI_LIB names a
// file instead), so the benchmark starts and runs without it; `available()` says whether the
// library and its entry points were found. One tracer per process (CUPTI's callbacks are global).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hk::perf {

// A kernel, or a memset / memcpy of the stream (name "memset N B" / "memcpy N B", grid 0).
struct KernelRecord {
  std::string name;  // demangled, namespaces and template arguments shortened
  uint64_t start_ns = 0, end_ns = 0;
  int grid = 0, block = 0;       // blocks and threads per block (x * y * z)
  int cluster = 0;               // CTAs per cluster (0: no cluster launch)
  int registers = 0;
  int dynamic_smem = 0, static_smem = 0;
};

class KernelTimeline {
 public:
  KernelTimeline();
  ~KernelTimeline();
  KernelTimeline(const KernelTimeline&) = delete;
  KernelTimeline& operator=(const KernelTimeline&) = delete;

  // Whether CUPTI was loaded; why not, if it was not.
  bool available() const { return ok_; }
  const std::string& error() const { return error_; }

  // Starts recording every kernel (once; tracing then stays on: whether kernels of CUDA graphs
  // instantiated before tracing began are recorded is not promised, so start before building the
  // engines). now_ns() is CUPTI's clock, the one the records use. collect(t0, t1) waits for the
  // device, flushes CUPTI's buffers and returns the kernels that started in [t0, t1], in start
  // order, forgetting every record older than t1. Throws std::runtime_error when a CUPTI call
  // fails or records were dropped.
  void start();
  uint64_t now_ns() const;
  std::vector<KernelRecord> collect(uint64_t t0, uint64_t t1);

 private:
  bool ok_ = false;
  std::string error_;
  void* lib_ = nullptr;
};

// Records in start order cut into consecutive forwards of counts[0], counts[1], ... kernels.
// Throws std::runtime_error when the counts do not add up to the records.
std::vector<std::vector<KernelRecord>> split_forwards(const std::vector<KernelRecord>& records,
                                                      const std::vector<size_t>& counts);

// Forwards summarised as markdown: the forwards are grouped by their kernel sequence (input sets
// of different token counts can run different plans), and for each group a table gives per kernel
// its median duration, its median start and end relative to the forward's first kernel start, and
// its median advance (how far its end lies past the latest earlier end, 0 if not at all: the time it
// adds to the forward's span; the first kernel's advance is its duration; a forward's advances add up
// to its span), then the group's median span (medians of an even count: the mean of the middle two). Throws
// std::runtime_error when there is no forward or a forward has no kernel.
std::string timeline_tables(const std::vector<std::vector<KernelRecord>>& forwards);

}  // namespace hk::perf
