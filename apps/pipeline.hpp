// hk_forward's streaming pipeline: a reader thread reads chunk k+1, the calling thread computes
// chunk k and a writer thread writes chunk k-1, through a fixed set of chunk buffers (two input,
// three with a GPU, and two output), so memory stays bounded whatever the file size. The HDF5 calls of the reader and
// the writer are serialised by hk::io's lock (libhdf5 is not thread-safe here): reads and writes
// alternate, and both overlap compute.
//
// The batch is cut into a global grid of chunks of `chunk` sequences that depends only on B and
// `chunk`; with several ranks, chunk k belongs to rank k % ranks (round robin: each collective
// write round covers neighbouring chunks). Every sequence is therefore computed in the same
// chunk, with the same neighbours, whatever the number of ranks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace hk::app {

struct ChunkGrid {
  int64_t B = 0, chunk = 1;
  int rank = 0, ranks = 1;

  int64_t chunks() const { return (B + chunk - 1) / chunk; }
  // Collective write rounds: every rank takes part in each, with a chunk or with none.
  int64_t rounds() const { return (chunks() + ranks - 1) / ranks; }
  // This rank's chunks: k = rank, rank + ranks, ...
  int64_t local_chunks() const { return chunks() > rank ? (chunks() - rank + ranks - 1) / ranks : 0; }
  int64_t global_index(int64_t i) const { return int64_t(rank) + i * ranks; }
  int64_t first_row(int64_t k) const { return k * chunk; }
  int64_t rows(int64_t k) const { return std::min(chunk, B - k * chunk); }
};

// Seconds each stage was busy, and what is done; passed to the progress callback.
struct PipelineStats {
  double read_s = 0, compute_s = 0, write_s = 0;
  double prepare_s = 0;  // the compute thread in `prepare` (e.g. waiting for the engine), while reading began
  double pin_s = 0;      // page-locking the chunk buffers (busy time of its thread: the first chunk's beside `prepare`, the rest after)
  int pinned = 0, pin_tried = 0;  // chunk buffers page-locked, of those tried (GPU runs)
  int64_t sequences_done = 0;  // computed and written by this rank
};

struct PipelineStages {
  // Called once on the calling thread as soon as the reader has started, before the writer and
  // the compute stage start: e.g. resolves the backend, creates the output file and starts the
  // engine's build. Returns the device to page-lock the chunk buffers for (-1: none), replacing
  // run_pipeline's `pin_device`. Its exception comes out of run_pipeline as it is (no `fatal`),
  // after the reader has stopped. Optional.
  std::function<int()> setup;
  // Called once on the compute thread before its first chunk, while the reader already fills
  // the first buffers: e.g. waits for an engine still being built. Optional.
  std::function<void()> prepare;
  // Fill x [nb, S, D] and lengths [nb] with sequences [b0, b0 + nb). Reader thread.
  std::function<void(int64_t b0, int64_t nb, float* x, int32_t* lengths)> read;
  // y [nb, S, D] from x and lengths. Calling thread.
  std::function<void(int64_t b0, int64_t nb, const float* x, const int32_t* lengths, float* y)> compute;
  // Write y rows [b0, b0 + nb), with the chunk's lengths (as the reader filled them); nb = 0
  // (y and lengths null) in the rounds where this rank has no chunk, for collective writes.
  // Writer thread.
  std::function<void(int64_t b0, int64_t nb, const float* y, const int32_t* lengths)> write;
  // After each chunk is written: progress. Writer thread.
  std::function<void(const PipelineStats&)> progress;
  // Polled between chunks; true stops the run with hk::Error("interrupted").
  std::function<bool()> interrupted;
  // When set, called (from the failing thread) with the first error instead of unwinding: an
  // MPI job whose peers may wait in a collective call ends there (it does not return).
  std::function<void(const std::string&)> fatal;
};

// Buffers: input_buffers(pin_device >= 0) x + 2 y chunk buffers of chunk * S * D floats and a lengths
// buffer per x buffer. `pin_device` -1:
// ordinary memory, touched at allocation; >= 0 (CUDA): allocated untouched and page-locked
// (registered for the device `setup` names, or this one without `setup`) on a thread of their own, in the order of first use: the first
// input and both output buffers while `prepare` runs, each further input buffer after it once
// the reader has filled it; a chunk is computed once its buffers are. Throws the first failure
// of any stage (after stopping the others). With `keep` set the buffers are handed over there
// instead of being released on return (releasing page-locked memory takes time the caller may
// rather spend after its commit).
PipelineStats run_pipeline(const ChunkGrid& grid, int S, int D, int pin_device, const PipelineStages& stages,
                           std::shared_ptr<void>* keep = nullptr);

// Input chunk buffers: 2, or 3 with a GPU (HK_INPUT_BUFFERS sets it, 2..8): while the CUDA driver
// starts and the context and the engine are made and warmed up (~0.28 s for a short job's engine
// on an H200) the reader reads about two chunks ahead of the compute, and keeps one more buffer
// of slack after that. Not more: the first fill of a buffer pays for its pages, on the reader's
// path, which sets the pace once the compute has started (measured: six buffers on 4 KiB pages
// made a short job 0.1 s longer; four on 2 MiB pages 0.1 s longer than three, perf/RESULTS.md).
int input_buffers(bool gpu);
// Bytes the pipeline holds per sequence of a chunk (its buffers).
inline double pipeline_bytes_per_sequence(int S, int D, bool gpu) {
  const double x_buffers = input_buffers(gpu);
  return (x_buffers + 2.0) * 4.0 * double(S) * D + (x_buffers + 2.0) * 4.0;  // x, y and their lengths
}

}  // namespace hk::app
