// Host memory for hk_forward's chunk buffers, and what the CUDA device has free. With the CUDA
// backend the buffers are page-locked, so that copies to and from the device run at full bus
// speed and can overlap compute; otherwise ordinary memory.
//
// A block is allocated as ordinary memory and page-locked in place later (pin():
// cudaHostRegister): the reader fills the buffers while the CUDA context and the engine are still
// being built; registration needs the context, the first read does not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hk::app {

// One block of host memory, page-locked when requested and possible.
class HostBlock {
 public:
  enum class Touch { now, later };
  HostBlock() = default;
  // Ordinary memory, its pages touched now (Touch::now: the resident size is what the pipeline
  // holds from the start) or left to the first writer and to pin() (Touch::later).
  explicit HostBlock(size_t bytes, Touch touch = Touch::now);
  ~HostBlock();
  HostBlock(HostBlock&& o) noexcept : p_(o.p_), bytes_(o.bytes_), registered_(o.registered_), huge_(o.huge_) {
    o.p_ = nullptr;
  }
  HostBlock& operator=(HostBlock&& o) noexcept;
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;

  // Page-locks ordinary memory in place for every CUDA context (cudaHostRegister, portable), with
  // `device` made current first so that no other device's context is created. Another thread may
  // be writing the block meanwhile: registration keeps its contents. False (the block stays
  // ordinary memory, copies stay correct but slower) when CUDA refuses or is not built in.
  bool pin(int device);

  // True when the block lies on transparent huge pages (advised, and the kernel's setting allows
  // them): touching it all costs a few dozen page faults, not thousands.
  bool huge_pages() const { return huge_; }
  // Makes every page of the block present now (zeroes it).
  void touch();

  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }
  bool pinned() const { return registered_; }

 private:
  void release() noexcept;
  void* p_ = nullptr;
  size_t bytes_ = 0;
  bool registered_ = false;  // under cudaHostRegister
  bool huge_ = false;        // on transparent huge pages
};

struct DeviceMemory {
  bool known = false;  // false: no CUDA in this build, or the query failed
  size_t free = 0, total = 0;
  int device_count = 0;
  int device = -1;  // the device queried
};
// cudaMemGetInfo on `device` (selects it for the calling thread; creates its context).
DeviceMemory device_memory(int device);
// The same figures from NVML (the driver's management library, loaded at run time), found by the
// device's PCI bus id: no CUDA context is made, so this is fast while another thread creates
// one. known = false when NVML is missing or does not answer (then use device_memory).
DeviceMemory device_memory_nvml(int device);
// Number of CUDA devices visible to this process (0 without CUDA).
int cuda_device_count();

// The GPUs of this node in the CUDA runtime's numbering, found without starting CUDA: the entries
// of CUDA_VISIBLE_DEVICES when it is set (indices, GPU-/MIG- UUIDs), else NVML's count of GPUs
// (entries "0".."n-1"). Empty when unknown: no NVML, a GPU in MIG mode (its CUDA devices are
// not NVML's GPUs), an entry CUDA would stop at, or a build without CUDA.
std::vector<std::string> node_gpus();
// NVIDIA GPUs the driver lists (/proc/driver/nvidia/gpus), without starting CUDA or NVML; 0
// without the driver.
int nvidia_gpu_count();
// Makes `gpu` (an entry of node_gpus()) the only device this process sees, through
// CUDA_VISIBLE_DEVICES: CUDA must not have started yet. It then sets up that one GPU instead of
// every GPU of the node (and the device's ordinal in this process becomes 0).
bool restrict_to_gpu(const std::string& gpu);

}  // namespace hk::app
