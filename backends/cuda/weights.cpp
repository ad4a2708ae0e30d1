#include "weights.hpp"

#include "arena.hpp"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstring>
#include <initializer_list>

#include "common.cuh"
#include "hk/error.hpp"

namespace hk::cuda {
namespace {

class ImageWriter {
 public:
  explicit ImageWriter(std::vector<unsigned char>& bytes) : bytes_(bytes) {}

  // Appends `n` values converted to `type` at the next aligned offset; returns the offset.
  size_t put(const double* v, size_t n, DType type) {
    const size_t at = (bytes_.size() + kTensorAlign - 1) / kTensorAlign * kTensorAlign;
    const size_t elem = type == DType::f16 ? sizeof(__half) : sizeof(float);
    bytes_.resize(at + n * elem, 0);
    unsigned char* dst = bytes_.data() + at;
    for (size_t i = 0; i < n; ++i) {
      if (type == DType::f16) {
        const __half h = __double2half(v[i]);  // one rounding, straight from float64
        std::memcpy(dst + i * elem, &h, elem);
      } else {
        const float f = float(v[i]);
        std::memcpy(dst + i * elem, &f, elem);
      }
    }
    return at;
  }
  size_t put(const std::vector<double>& v, DType type) { return put(v.data(), v.size(), type); }

  // Rows of several [rows_i, cols] matrices stacked into one; returns the offset.
  size_t put_stacked(std::initializer_list<const std::vector<double>*> parts, DType type) {
    std::vector<double> all;
    for (const auto* p : parts) all.insert(all.end(), p->begin(), p->end());
    return put(all, type);
  }

 private:
  std::vector<unsigned char>& bytes_;
};

}  // namespace

WeightImage build_weight_image(const Model& model, Precision precision) {
  if (precision == Precision::reference)
    throw Error("cuda backend: precision 'reference' (float64) is not supported; use the kokkos backend");
  WeightImage img;
  img.gemm_type = precision == Precision::fast ? DType::f16 : DType::f32;
  const DType g = img.gemm_type, f32 = DType::f32;
  ImageWriter w(img.bytes);
  for (const LayerWeights& L : model.layers) {
    WeightImage::Layer o{};
    o.ln1_w = w.put(L.norm1_w, f32);
    o.ln1_b = w.put(L.norm1_b, f32);
    o.w_qkv = w.put_stacked({&L.q_w, &L.k_w, &L.v_w}, g);
    o.b_qkv = w.put_stacked({&L.q_b, &L.k_b, &L.v_b}, g);
    o.w_o = w.put(L.o_w, g);
    o.b_o = w.put(L.o_b, f32);
    o.ln2_w = w.put(L.norm2_w, f32);
    o.ln2_b = w.put(L.norm2_b, f32);
    o.w_in = w.put(L.ffn_in_w, g);
    o.b_in = w.put(L.ffn_in_b, g);
    o.w_out = w.put(L.ffn_out_w, g);
    o.b_out = w.put(L.ffn_out_b, f32);
    img.layers.push_back(o);
  }
  img.final_w = w.put(model.final_norm_w, f32);
  img.final_b = w.put(model.final_norm_b, f32);
  return img;
}

DeviceWeights::DeviceWeights(const Model& model, Precision precision) {
  const WeightImage img = build_weight_image(model, precision);
  gemm_type_ = img.gemm_type;
  bytes_ = img.bytes.size();
  allocate(&base_, bytes_, false, "model weights");
  try {
    HK_CUDA_CHECK(cudaMemcpy(base_, img.bytes.data(), bytes_, cudaMemcpyHostToDevice));
  } catch (...) {
    cudaFree(base_);
    throw;
  }
  const auto* b = static_cast<const unsigned char*>(base_);
  auto f = [b](size_t off) { return reinterpret_cast<const float*>(b + off); };
  auto v = [b](size_t off) { return static_cast<const void*>(b + off); };
  for (const WeightImage::Layer& o : img.layers)
    layers_.push_back({f(o.ln1_w), f(o.ln1_b), v(o.w_qkv), v(o.b_qkv), v(o.w_o), f(o.b_o), f(o.ln2_w),
                       f(o.ln2_b), v(o.w_in), v(o.b_in), v(o.w_out), f(o.b_out)});
  final_w_ = f(img.final_w);
  final_b_ = f(img.final_b);
}

DeviceWeights::~DeviceWeights() { cudaFree(base_); }

}  // namespace hk::cuda
