// hk_forward's sizing: the chunk grid of a job (from the file, the model, the options and the
// backend planned before the CUDA driver answers) and the engine batch (sequences per engine
// forward, from the memory of the backend it resolved to).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "host_buffers.hpp"
#include "hk/config.hpp"
#include "hk/io/io.hpp"

namespace hk::app {

// Host memory a kokkos run may use for what grows with the chunk (chunk buffers, the engine's
// activations, the HDF5 chunk cache of x) when --mem-cap is not given. A constant, not a measurement of
// free memory, so that the default chunk grid (and so the bits of every result) is the same on
// every machine and for every rank count.
constexpr double kDefaultHostCapBytes = 1024.0 * (1 << 20);
// Device memory left to the CUDA runtime, cuBLASLt / cuDNN workspaces and graphs.
constexpr double kDeviceReserveBytes = 1024.0 * (1 << 20);

// The x bytes per chunk the CUDA path aims at (see size_chunks).
constexpr double kStreamChunkBytes = 64.0 * 1024 * 1024;

struct ChunkSizing {
  int64_t chunk = 1;
  size_t cache_bytes = hk::io::kDefaultChunkCacheBytes;  // of the input x (y is written past HDF5's caches)
  std::string basis;                                     // how it was sized, for --explain
};

// Parameters of the model, for the device memory its weights take.
double parameter_count(const hk::ModelConfig& c);

// The HDF5 chunk cache of x under a memory cap: a sixteenth of it, 1..64 MiB.
size_t cache_bytes_for(double cap);

// Host bytes per sequence of the kokkos engine's activations (and its float64 copies).
double kokkos_engine_bytes_per_sequence(const hk::ModelConfig& c, int S, hk::Precision p);

// Host bytes per sequence of a chunk: the pipeline's buffers, the float16 staging of x, and the
// engine's host memory (cuda: the page-locked staging of x and y; kokkos: the activations).
double host_bytes_per_sequence(const hk::ModelConfig& c, int S, bool x_half, hk::Precision p, bool cuda);

// The backend the chunk grid is planned for before the CUDA driver has answered (its start takes
// ~0.1 s, which the reader spends reading): the one asked for, or for "auto" cuda when the build
// has CUDA, the node has NVIDIA's device files and CUDA_VISIBLE_DEVICES does not hide every GPU.
// Only a plan: a wrong guess costs speed or a smaller engine batch, never correctness
// (engine_batch_for). The ranks of a job then take the smallest chunk any of them planned.
std::string planned_backend(const std::string& asked);

// Sequences per chunk: the job's grid, from the file, the model, the options and the planned
// backend only (not the free device memory: the reader starts on the grid before the device has
// been asked). Host memory: the pipeline's chunk buffers, the engine's host memory and the HDF5
// chunk cache of x stay within the cap (kokkos: a default cap). cuda: about 64 MiB of x per
// chunk, so that reading chunk k+1, the forward of chunk k and writing chunk k-1 overlap (one
// chunk of a whole large batch would serialise them), rounded down to a power of two.
ChunkSizing size_chunks(const hk::ModelConfig& c, int S, int64_t B, bool x_half, hk::Precision p,
                        const std::string& backend, double mem_cap);

// Sequences the engine computes at once: a chunk is computed in pieces of at most this many.
// cuda: the activation arena within what the device reports free, shared by the ranks on one
// GPU, less the weights and a reserve, rounded down to a power of two (small changes in free
// memory keep the same pieces; the pieces, not the chunk, fix which sequences are computed
// together). kokkos: the whole chunk, unless the chunk was planned for cuda and the activations
// do not fit the host budget beside its buffers (throws when a --mem-cap leaves no room for one
// sequence). Appends how it cut the chunk to `basis`.
int64_t engine_batch_for(const hk::ModelConfig& c, int S, bool x_half, hk::Precision p, const std::string& backend,
                         const std::string& planned, int64_t chunk, double mem_cap, const DeviceMemory& dev,
                         int ranks_per_device, std::string* basis);

}  // namespace hk::app
