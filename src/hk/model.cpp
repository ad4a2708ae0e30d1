#include "hk/model.hpp"

namespace hk {

Model Model::allocate(const ModelConfig& c) {
  Model m;
  m.config = c;
  m.layers.resize(c.n_layers);
  for (auto& ref : m.parameters()) {
    int64_t n = 1;
    for (int64_t d : ref.shape) n *= d;
    ref.values->assign(static_cast<size_t>(n), 0.0);
  }
  return m;
}

std::vector<ParameterRef> Model::parameters() {
  const int64_t D = config.d_model, F = config.ffn_dim;
  std::vector<ParameterRef> out;
  out.reserve(layers.size() * 16 + 2);
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerWeights& w = layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    out.push_back({p + "norm1.weight", {D}, &w.norm1_w});
    out.push_back({p + "norm1.bias", {D}, &w.norm1_b});
    out.push_back({p + "attn.q_proj.weight", {D, D}, &w.q_w});
    out.push_back({p + "attn.q_proj.bias", {D}, &w.q_b});
    out.push_back({p + "attn.k_proj.weight", {D, D}, &w.k_w});
    out.push_back({p + "attn.k_proj.bias", {D}, &w.k_b});
    out.push_back({p + "attn.v_proj.weight", {D, D}, &w.v_w});
    out.push_back({p + "attn.v_proj.bias", {D}, &w.v_b});
    out.push_back({p + "attn.out_proj.weight", {D, D}, &w.o_w});
    out.push_back({p + "attn.out_proj.bias", {D}, &w.o_b});
    out.push_back({p + "norm2.weight", {D}, &w.norm2_w});
    out.push_back({p + "norm2.bias", {D}, &w.norm2_b});
    out.push_back({p + "ffn_in.weight", {F, D}, &w.ffn_in_w});
    out.push_back({p + "ffn_in.bias", {F}, &w.ffn_in_b});
    out.push_back({p + "ffn_out.weight", {D, F}, &w.ffn_out_w});
    out.push_back({p + "ffn_out.bias", {D}, &w.ffn_out_b});
  }
  out.push_back({"final_norm.weight", {D}, &final_norm_w});
  out.push_back({"final_norm.bias", {D}, &final_norm_b});
  return out;
}

int64_t Model::parameter_count() const {
  const int64_t D = config.d_model, F = config.ffn_dim;
  return int64_t(config.n_layers) * (4 * D + 4 * (D * D + D) + 2 * F * D + F + D) + 2 * D;
}

}  // namespace hk
