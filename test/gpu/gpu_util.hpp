// Small helpers shared by the GoogleTest GPU programs: device buffers, copies, NaN poisoning.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace hk::gputest {

inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#define HK_TEST_CUDA(expr) ::hk::gputest::ck((expr), #expr)

// 0xFF bytes: NaN as fp16 and fp32, -1 as int32.
constexpr unsigned char kPoisonByte = 0xFF;

class DevBuf {
 public:
  explicit DevBuf(size_t bytes) : n_(bytes) {
    HK_TEST_CUDA(cudaMalloc(&p_, bytes ? bytes : 1));
    poison();
  }
  ~DevBuf() { cudaFree(p_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <class T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return n_; }
  void poison() { HK_TEST_CUDA(cudaMemset(p_, kPoisonByte, n_ ? n_ : 1)); }
  template <class T>
  void upload(const std::vector<T>& v, size_t byte_offset = 0) {
    HK_TEST_CUDA(cudaMemcpy(static_cast<char*>(p_) + byte_offset, v.data(), v.size() * sizeof(T),
                            cudaMemcpyHostToDevice));
  }
  template <class T>
  std::vector<T> download(size_t count, size_t byte_offset = 0) const {
    std::vector<T> v(count);
    HK_TEST_CUDA(cudaMemcpy(v.data(), static_cast<const char*>(p_) + byte_offset, count * sizeof(T),
                            cudaMemcpyDeviceToHost));
    return v;
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// True when bytes [from, v.size()) all still hold the poison byte.
inline bool all_bytes_poison(const std::vector<unsigned char>& v, size_t from) {
  for (size_t i = from; i < v.size(); ++i)
    if (v[i] != kPoisonByte) return false;
  return true;
}

inline double half_round(double v) { return double(__half2float(__double2half(v))); }
inline std::vector<__half> to_half(const std::vector<double>& v) {
  std::vector<__half> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = __double2half(v[i]);
  return h;
}
inline std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

}  // namespace hk::gputest
