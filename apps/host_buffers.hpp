// Host memory for hk_forward's chunk buffers, and what the CUDA device has free. With the CUDA
// backend the buffers are page-locked (cudaHostAlloc), so that copies to and from the device run
// at full bus speed and can overlap compute; otherwise ordinary memory. Pages are touched when
// allocated, so the resident size is what the pipeline holds from the start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hk::app {

// One block of host memory, page-locked when requested and possible.
class HostBlock {
 public:
  HostBlock() = default;
  HostBlock(size_t bytes, bool pinned);
  ~HostBlock();
  HostBlock(HostBlock&& o) noexcept : p_(o.p_), bytes_(o.bytes_), pinned_(o.pinned_) { o.p_ = nullptr; }
  HostBlock& operator=(HostBlock&& o) noexcept;
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;

  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  bool pinned() const { return pinned_; }

 private:
  void release() noexcept;
  void* p_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_ = false;
};

struct DeviceMemory {
  bool known = false;  // false: no CUDA in this build, or the query failed
  size_t free = 0, total = 0;
  int device_count = 0;
};
// cudaMemGetInfo on `device` (selects it for this process).
DeviceMemory device_memory(int device);
// Number of CUDA devices visible to this process (0 without CUDA).
int cuda_device_count();

}  // namespace hk::app
