// The model's parameters on the device, uploaded once per engine in the types the kernels take:
//   GEMM weights and the biases of fp16-output GEMMs in the GEMM input type (fp16 for `fast`,
//   fp32 for `fp32`); q/k/v fused into one [3D, D] weight (rows q | k | v, the qkv buffer's
//   column order) and one [3D] bias; the biases of the residual GEMMs (out_proj, ffn_out) and
//   every LayerNorm parameter in fp32.
// Every tensor starts on a 256-byte boundary of one allocation (cuBLASLt's default alignment).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention.hpp"  // DType
#include "hk/config.hpp"
#include "hk/model.hpp"

namespace hk::cuda {

inline constexpr size_t kTensorAlign = 256;

// Host image of the upload: byte offsets of each tensor in `bytes`. Pure host code (tests read it).
struct WeightImage {
  struct Layer {
    size_t ln1_w, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_w, ln2_b, w_in, b_in, w_out, b_out;
  };
  DType gemm_type = DType::f16;
  std::vector<unsigned char> bytes;
  std::vector<Layer> layers;
  size_t final_w = 0, final_b = 0;
};
// `fast`: fp16 GEMM operands (round to nearest from float64), `fp32`: fp32. Throws hk::Error for
// `reference`.
WeightImage build_weight_image(const Model& model, Precision precision);

struct DeviceLayerWeights {
  const float* ln1_w;
  const float* ln1_b;
  const void* w_qkv;  // [3D, D] gemm type
  const void* b_qkv;  // [3D] gemm type
  const void* w_o;    // [D, D] gemm type
  const float* b_o;   // [D]
  const float* ln2_w;
  const float* ln2_b;
  const void* w_in;   // [F, D] gemm type
  const void* b_in;   // [F] gemm type
  const void* w_out;  // [D, F] gemm type
  const float* b_out; // [D]
};

class DeviceWeights {
 public:
  DeviceWeights(const Model& model, Precision precision);  // one cudaMalloc, one copy
  ~DeviceWeights();
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  const DeviceLayerWeights& layer(int l) const { return layers_.at(size_t(l)); }
  const float* final_w() const { return final_w_; }
  const float* final_b() const { return final_b_; }
  DType gemm_type() const { return gemm_type_; }
  size_t bytes() const { return bytes_; }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
  DType gemm_type_ = DType::f16;
  std::vector<DeviceLayerWeights> layers_;
  const float* final_w_ = nullptr;
  const float* final_b_ = nullptr;
};

}  // namespace hk::cuda
