// The attention routes as the engine sees them: one adapter over the own flash kernel
// (attention_flash.cuh) and the cuDNN graph (attention_cudnn.cuh), so that the engine compiles
// and plans whether or not each route is part of this build (HK_CUDA_HAVE_FLASH /
// HK_CUDA_HAVE_CUDNN, set by backends/cuda/CMakeLists.txt). Host-compilable header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

#include "attention.hpp"

namespace hk::cuda {

// The own flash kernel (the default route). Its f16 kernel has two query tiles; `automatic`
// picks one by occupancy, the explicit ones are the measured alternatives (f32 ignores the tile).
// q64k2 / q64k4: q64 tiles with the keys split over a cluster of 2 / 4 CTAs (f16, sm_90+, head
// dims 16-64; flash_route_supports(p, tile) says where). q64g4: q64 tiles of 4 heads per CTA (f16,
// head_dim exactly 8, H a multiple of 4).
enum class FlashTile { automatic, q64, q16, q64k2, q64k4, q64g4 };
bool flash_route_compiled();
bool flash_route_supports(const AttentionParams& p);
bool flash_route_supports(const AttentionParams& p, FlashTile tile);
std::string flash_route_name(const AttentionParams& p, FlashTile tile = FlashTile::automatic);
void flash_route_run(const AttentionParams& p, cudaStream_t stream, FlashTile tile = FlashTile::automatic);

// The cuDNN route (HK_ATTENTION=cudnn). prepare() builds cuDNN's plan (slow): plan time only,
// never inside a capture.
class CudnnRoute {
 public:
  static bool compiled();
  static bool runtime_ok(std::string* why_not);
  static int runtime_version();  // cudnnGetVersion(), 0 when the route is not built
  CudnnRoute();
  ~CudnnRoute();
  CudnnRoute(const CudnnRoute&) = delete;
  CudnnRoute& operator=(const CudnnRoute&) = delete;
  bool supports(const AttentionParams& p) const;
  void prepare(const AttentionParams& p, cudaStream_t stream);
  size_t workspace_bytes(const AttentionParams& p) const;
  void run(const AttentionParams& p, void* workspace, cudaStream_t stream);
  std::string name() const;
  std::string plan_info(const AttentionParams& p) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hk::cuda
