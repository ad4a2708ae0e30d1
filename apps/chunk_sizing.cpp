// hk_forward's chunk grid and engine batch (chunk_sizing.hpp).
#include "chunk_sizing.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "hk/build_config.hpp"
#include "hk/error.hpp"
#include "pipeline.hpp"

namespace hk::app {

double parameter_count(const hk::ModelConfig& c) {
  const double D = c.d_model, F = c.ffn_dim;
  return c.n_layers * (4.0 * D * D + 2.0 * D * F + 9.0 * D + F) + 2.0 * D;
}

size_t cache_bytes_for(double cap) {
  if (cap <= 0) return hk::io::kDefaultChunkCacheBytes;
  return size_t(std::clamp(cap / 16.0, 1024.0 * 1024.0, double(hk::io::kDefaultChunkCacheBytes)));
}

double kokkos_engine_bytes_per_sequence(const hk::ModelConfig& c, int S, hk::Precision p) {
  const double D = c.d_model, F = c.ffn_dim;
  const double elt = p == hk::Precision::reference ? 8.0 : 4.0;
  return elt * S * (8.0 * D + F) + (p == hk::Precision::reference ? 8.0 * S * D : 0.0);
}

double host_bytes_per_sequence(const hk::ModelConfig& c, int S, bool x_half, hk::Precision p, bool cuda) {
  const double D = c.d_model;
  double b = pipeline_bytes_per_sequence(S, c.d_model, cuda) + (x_half ? 2.0 * S * D : 0.0);
  return b + (cuda ? 2.0 * 4.0 * S * D + 4.0 : kokkos_engine_bytes_per_sequence(c, S, p));
}

std::string planned_backend(const std::string& asked) {
  if (asked != "auto") return asked;
  if (!HK_HAVE_CUDA || ::access("/dev/nvidiactl", F_OK) != 0) return "kokkos";
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v && (v[0] == '\0' || v[0] == '-') ? "kokkos" : "cuda";
}

ChunkSizing size_chunks(const hk::ModelConfig& c, int S, int64_t B, bool x_half, hk::Precision p,
                        const std::string& backend, double mem_cap) {
  ChunkSizing z;
  const double D = c.d_model;
  const bool cuda = backend == "cuda";
  const double host_cap = mem_cap > 0 ? mem_cap : (cuda ? 0.0 : kDefaultHostCapBytes);
  z.cache_bytes = cache_bytes_for(mem_cap);
  const double host_per_seq = host_bytes_per_sequence(c, S, x_half, p, cuda);
  int64_t chunk = B;
  if (host_cap > 0) {
    const double left = host_cap - double(z.cache_bytes);
    const int64_t n = left > 0 ? int64_t(std::floor(left / host_per_seq)) : 0;
    if (n < 1)
      throw hk::Error("--mem-cap " + std::to_string(int64_t(host_cap)) + " bytes is too small: one sequence needs about " +
                      std::to_string(int64_t(host_per_seq)) + " bytes plus " + std::to_string(z.cache_bytes) +
                      " of HDF5 chunk cache");
    chunk = std::min<int64_t>(chunk, n);
    z.basis = "host memory cap " + std::to_string(int64_t(host_cap)) + " bytes";
  }
  if (cuda) {
    const int64_t n = std::max<int64_t>(1, int64_t(kStreamChunkBytes / (4.0 * S * D)));
    int64_t pow2 = 1;
    while (pow2 * 2 <= n) pow2 *= 2;
    if (pow2 < chunk) z.basis += std::string(z.basis.empty() ? "" : ", ") + "64 MiB of x per chunk";
    chunk = std::min(chunk, pow2);
  }
  z.chunk = std::max<int64_t>(1, std::min<int64_t>(chunk, std::numeric_limits<int>::max() / std::max(1, S)));
  return z;
}

int64_t engine_batch_for(const hk::ModelConfig& c, int S, bool x_half, hk::Precision p, const std::string& backend,
                         const std::string& planned, int64_t chunk, double mem_cap, const DeviceMemory& dev,
                         int ranks_per_device, std::string* basis) {
  const double D = c.d_model, F = c.ffn_dim;
  int64_t n = chunk;
  std::string why;
  if (backend == "cuda") {
    const double act = p == hk::Precision::fast ? 2.0 : 4.0;
    const double dev_per_seq = 1.25 * S * (16.0 * D + act * (5.0 * D + F));
    // Weights, and a second copy in the other GEMM layout that tuning may keep.
    const double weights = 2.0 * act * parameter_count(c);
    const double free = dev.known ? double(dev.free) / std::max(1, ranks_per_device) : 0.0;
    const double budget = dev.known ? 0.8 * (free - weights - kDeviceReserveBytes) : 256.0 * (1 << 20);
    const int64_t fits = int64_t(std::max(1.0, std::floor(budget / dev_per_seq)));
    int64_t pow2 = 1;
    while (pow2 * 2 <= fits) pow2 *= 2;
    n = std::min(chunk, pow2);
    why = dev.known ? "device memory free " + std::to_string(dev.free) + " bytes / " +
                          std::to_string(std::max(1, ranks_per_device)) + " rank(s)"
                    : "device memory unknown (256 MiB assumed)";
  } else if (planned == "cuda") {
    const double host_cap = mem_cap > 0 ? mem_cap : kDefaultHostCapBytes;
    const double left = host_cap - double(cache_bytes_for(mem_cap)) -
                        double(chunk) * (pipeline_bytes_per_sequence(S, c.d_model, true) + (x_half ? 2.0 * S * D : 0.0));
    const double per = kokkos_engine_bytes_per_sequence(c, S, p);
    const int64_t fits = left > 0 ? int64_t(std::floor(left / per)) : 0;
    if (fits < 1 && mem_cap > 0)
      throw hk::Error("--mem-cap " + std::to_string(int64_t(mem_cap)) + " bytes is too small: the chunk buffers (planned for a GPU) leave no room for the kokkos backend's activations (" +
                      std::to_string(int64_t(per)) + " bytes per sequence); a smaller --batch-chunk needs less");
    n = std::min(chunk, std::max<int64_t>(1, fits));
    why = "host memory left to the kokkos activations";
  }
  if (n < chunk && basis) *basis += std::string(basis->empty() ? "" : ", ") + why + ": " + std::to_string(n) + " at once";
  return std::max<int64_t>(1, n);
}

}  // namespace hk::app
