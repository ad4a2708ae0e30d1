// hk_forward's chunk grid and engine batch (apps/chunk_sizing.*): the grid depends on the file,
// the model, the options and the planned backend only; the engine batch is a power of two within
// what the device reports free (shared by the ranks of a GPU) and never above the chunk; a chunk
// planned for cuda that a kokkos engine runs gets pieces that fit the host cap beside the chunk
// buffers, or a clear error under a cap too small for one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "chunk_sizing.hpp"
#include "hk/build_config.hpp"
#include "hk/error.hpp"
#include "pipeline.hpp"

namespace {

using hk::app::DeviceMemory;

hk::ModelConfig case6() {
  hk::ModelConfig c;
  c.d_model = 128;
  c.n_heads = 4;
  c.n_layers = 4;
  c.ffn_dim = 512;
  return c;
}

DeviceMemory free_bytes(double free) {
  DeviceMemory d;
  d.known = true;
  d.device = 0;
  d.device_count = 1;
  d.free = size_t(free);
  d.total = size_t(free) + 1;
  return d;
}

bool power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

TEST(ChunkSizing, TheCudaGridIsAboutSixtyFourMiBOfXWhateverTheDevice) {
  const hk::ModelConfig c = case6();
  const hk::app::ChunkSizing z = hk::app::size_chunks(c, 128, 10000, false, hk::Precision::fast, "cuda", 0);
  EXPECT_EQ(z.chunk, 1024);  // 64 MiB / (128 x 128 x 4 bytes)
  EXPECT_NE(z.basis.find("64 MiB"), std::string::npos) << z.basis;
  // A small batch is one chunk; odd S and D round down to a power of two.
  EXPECT_EQ(hk::app::size_chunks(c, 128, 700, false, hk::Precision::fast, "cuda", 0).chunk, 700);
  hk::ModelConfig odd = c;
  odd.d_model = 20;
  EXPECT_EQ(hk::app::size_chunks(odd, 7, 1 << 20, false, hk::Precision::fast, "cuda", 0).chunk, 65536);
  // A host cap binds below that.
  const hk::app::ChunkSizing capped = hk::app::size_chunks(c, 128, 10000, false, hk::Precision::fast, "cuda", 64 << 20);
  EXPECT_LT(capped.chunk, 1024);
  EXPECT_LE(double(capped.chunk) * hk::app::host_bytes_per_sequence(c, 128, false, hk::Precision::fast, true) +
                double(capped.cache_bytes),
            double(64 << 20));
  EXPECT_THROW(hk::app::size_chunks(c, 128, 10000, false, hk::Precision::fast, "cuda", 1 << 20), hk::Error);
}

TEST(ChunkSizing, TheCudaEngineBatchIsAPowerOfTwoWithinTheFreeMemory) {
  const hk::ModelConfig c = case6();
  const int64_t chunk = 1024;
  auto batch = [&](const DeviceMemory& d, int ranks) {
    std::string basis;
    return hk::app::engine_batch_for(c, 128, false, hk::Precision::fast, "cuda", "cuda", chunk, 0, d, ranks, &basis);
  };
  EXPECT_EQ(batch(free_bytes(140e9), 1), chunk);  // an H200 holds the whole chunk
  int64_t last = 1;
  for (const double free : {1.3e9, 1.5e9, 2e9, 3e9, 5e9, 9e9, 20e9}) {
    const int64_t n = batch(free_bytes(free), 1);
    SCOPED_TRACE(free);
    EXPECT_TRUE(power_of_two(n)) << n;
    EXPECT_LE(n, chunk);
    EXPECT_GE(n, last) << "more free memory gave a smaller batch";
    last = n;
  }
  EXPECT_LT(batch(free_bytes(1.5e9), 1), chunk);
  // Two ranks on one GPU: each gets half.
  EXPECT_EQ(batch(free_bytes(3e9), 2), batch(free_bytes(1.5e9), 1));
  // Unknown free memory: 256 MiB assumed, still at least one sequence.
  const int64_t unknown = batch(DeviceMemory{}, 1);
  EXPECT_TRUE(power_of_two(unknown));
  EXPECT_LT(unknown, chunk);
  EXPECT_EQ(batch(free_bytes(1.0), 1), 1);  // nothing free: one at a time (the engine's own check refuses it)
  std::string basis;
  hk::app::engine_batch_for(c, 128, false, hk::Precision::fast, "cuda", "cuda", chunk, 0, free_bytes(1.5e9), 1, &basis);
  EXPECT_NE(basis.find("device memory free"), std::string::npos) << basis;
}

TEST(ChunkSizing, AKokkosEngineOnAChunkPlannedForCudaFitsTheHostCap) {
  const hk::ModelConfig c = case6();
  const int S = 128;
  const double cap = 512.0 * (1 << 20);
  const hk::app::ChunkSizing z = hk::app::size_chunks(c, S, 10000, false, hk::Precision::fp32, "cuda", cap);
  std::string basis;
  const int64_t n =
      hk::app::engine_batch_for(c, S, false, hk::Precision::fp32, "kokkos", "cuda", z.chunk, cap, DeviceMemory{}, 1, &basis);
  ASSERT_GE(n, 1);
  EXPECT_LT(n, z.chunk) << "the kokkos activations were not counted";
  const double used = double(z.cache_bytes) +
                      double(z.chunk) * hk::app::pipeline_bytes_per_sequence(S, c.d_model, true) +
                      double(n) * hk::app::kokkos_engine_bytes_per_sequence(c, S, hk::Precision::fp32);
  EXPECT_LE(used, cap);
  EXPECT_NE(basis.find("kokkos"), std::string::npos) << basis;
  // Planned for kokkos, the chunk already counts them: one piece.
  const hk::app::ChunkSizing k = hk::app::size_chunks(c, S, 10000, false, hk::Precision::fp32, "kokkos", cap);
  EXPECT_EQ(hk::app::engine_batch_for(c, S, false, hk::Precision::fp32, "kokkos", "kokkos", k.chunk, cap, DeviceMemory{},
                                      1, nullptr),
            k.chunk);
  // A cap the chunk buffers fill leaves no room: a clear error, not a run over the cap.
  const double tight = double(z.chunk) * hk::app::pipeline_bytes_per_sequence(S, c.d_model, true);
  EXPECT_THROW(hk::app::engine_batch_for(c, S, false, hk::Precision::fp32, "kokkos", "cuda", z.chunk, tight,
                                         DeviceMemory{}, 1, nullptr),
               hk::Error);
}

TEST(ChunkSizing, ThePlannedBackend) {
  EXPECT_EQ(hk::app::planned_backend("cuda"), "cuda");
  EXPECT_EQ(hk::app::planned_backend("kokkos"), "kokkos");
  const char* before = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string saved = before ? before : "";
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
  EXPECT_EQ(hk::app::planned_backend("auto"), "kokkos");
  ::setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
  EXPECT_EQ(hk::app::planned_backend("auto"), "kokkos");
  ::setenv("CUDA_VISIBLE_DEVICES", "0", 1);
  const bool driver = ::access("/dev/nvidiactl", F_OK) == 0;
  EXPECT_EQ(hk::app::planned_backend("auto"), HK_HAVE_CUDA && driver ? "cuda" : "kokkos");
  if (before) {
    ::setenv("CUDA_VISIBLE_DEVICES", saved.c_str(), 1);
  } else {
    ::unsetenv("CUDA_VISIBLE_DEVICES");
  }
}

}  // namespace
