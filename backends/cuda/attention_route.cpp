// Adapter over the attention routes (see attention_route.hpp). The only file of the engine that
// includes the routes' headers; a route absent from the build reports "not supported".
#include "attention_route.hpp"

#include "common.cuh"

#ifndef HK_CUDA_HAVE_FLASH
#define HK_CUDA_HAVE_FLASH 0
#endif
#ifndef HK_CUDA_HAVE_CUDNN
#define HK_CUDA_HAVE_CUDNN 0
#endif

#if HK_CUDA_HAVE_FLASH
#include "attention_flash.cuh"
#endif
#if HK_CUDA_HAVE_CUDNN
#include "attention_cudnn.cuh"
#endif

namespace hk::cuda {

bool flash_route_compiled() { return HK_CUDA_HAVE_FLASH != 0; }

bool flash_route_supports([[maybe_unused]] const AttentionParams& p) {
#if HK_CUDA_HAVE_FLASH
  return attention_flash_supports(p);
#else
  return false;
#endif
}

bool flash_route_supports([[maybe_unused]] const AttentionParams& p, [[maybe_unused]] FlashTile tile) {
#if HK_CUDA_HAVE_FLASH
  if (tile == FlashTile::q64k2 || tile == FlashTile::q64k4)
    return attention_flash_split_supports(p, tile == FlashTile::q64k2 ? 2 : 4);
  if (tile == FlashTile::q64g4) return attention_flash_grouped_supports(p, 4);
  return attention_flash_supports(p);
#else
  return false;
#endif
}

#if HK_CUDA_HAVE_FLASH
namespace {
int key_splits(FlashTile t) { return t == FlashTile::q64k2 ? 2 : t == FlashTile::q64k4 ? 4 : 1; }
int head_group(FlashTile t) { return t == FlashTile::q64g4 ? 4 : 1; }
FlashQueryTile query_tile(FlashTile t) {
  switch (t) {
    case FlashTile::q64: return FlashQueryTile::q64;
    case FlashTile::q16: return FlashQueryTile::q16;
    default: return FlashQueryTile::automatic;
  }
}
}  // namespace
#endif

std::string flash_route_name([[maybe_unused]] const AttentionParams& p, [[maybe_unused]] FlashTile tile) {
#if HK_CUDA_HAVE_FLASH
  if (key_splits(tile) > 1) return attention_flash_split_name(p, key_splits(tile));
  if (head_group(tile) > 1) return attention_flash_grouped_name(p, head_group(tile));
  return attention_flash_name(p, query_tile(tile));
#else
  return "hk::attention[cuda.flash: not built]";
#endif
}

void flash_route_run([[maybe_unused]] const AttentionParams& p, [[maybe_unused]] cudaStream_t stream,
                     [[maybe_unused]] FlashTile tile) {
#if HK_CUDA_HAVE_FLASH
  if (key_splits(tile) > 1) return attention_flash_split(p, stream, key_splits(tile));
  if (head_group(tile) > 1) return attention_flash_grouped(p, stream, head_group(tile));
  attention_flash(p, stream, query_tile(tile));
#else
  throw CudaError("the flash attention route is not part of this build");
#endif
}

#if HK_CUDA_HAVE_CUDNN
struct CudnnRoute::Impl {
  CudnnAttention attention;
};
#else
struct CudnnRoute::Impl {};
#endif

bool CudnnRoute::compiled() { return HK_CUDA_HAVE_CUDNN != 0; }

bool CudnnRoute::runtime_ok(std::string* why_not) {
#if HK_CUDA_HAVE_CUDNN
  return CudnnAttention::runtime_ok(why_not);
#else
  if (why_not) *why_not = "the cuDNN attention route is not part of this build";
  return false;
#endif
}

int CudnnRoute::runtime_version() {
#if HK_CUDA_HAVE_CUDNN
  return CudnnAttention::runtime_version();
#else
  return 0;
#endif
}

CudnnRoute::CudnnRoute() : impl_(std::make_unique<Impl>()) {}
CudnnRoute::~CudnnRoute() = default;

bool CudnnRoute::supports([[maybe_unused]] const AttentionParams& p) const {
#if HK_CUDA_HAVE_CUDNN
  return impl_->attention.supports(p);
#else
  return false;
#endif
}

void CudnnRoute::prepare([[maybe_unused]] const AttentionParams& p, [[maybe_unused]] cudaStream_t stream) {
#if HK_CUDA_HAVE_CUDNN
  impl_->attention.prepare(p, stream);
#else
  throw CudaError("the cuDNN attention route is not part of this build");
#endif
}

size_t CudnnRoute::workspace_bytes([[maybe_unused]] const AttentionParams& p) const {
#if HK_CUDA_HAVE_CUDNN
  return impl_->attention.workspace_bytes(p);
#else
  return 0;
#endif
}

void CudnnRoute::run([[maybe_unused]] const AttentionParams& p, [[maybe_unused]] void* workspace,
                     [[maybe_unused]] cudaStream_t stream) {
#if HK_CUDA_HAVE_CUDNN
  impl_->attention.run(p, workspace, stream);
#else
  throw CudaError("the cuDNN attention route is not part of this build");
#endif
}

std::string CudnnRoute::name() const {
#if HK_CUDA_HAVE_CUDNN
  return impl_->attention.name();
#else
  return "hk::attention[cuda.cudnn: not built]";
#endif
}

std::string CudnnRoute::plan_info([[maybe_unused]] const AttentionParams& p) const {
#if HK_CUDA_HAVE_CUDNN
  return impl_->attention.plan_info(p);
#else
  return "";
#endif
}

}  // namespace hk::cuda
