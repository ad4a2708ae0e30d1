// The model's parameters on the host, in float64 (the file may hold float16/32/64; float64
// keeps every source type exact, and each backend converts once when it uploads).
// Names and shapes follow MODEL.md (PyTorch state_dict names, nn.Linear weights [out, in]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hk/config.hpp"

namespace hk {

struct LayerWeights {
  std::vector<double> norm1_w, norm1_b;          // [D]
  std::vector<double> q_w, q_b, k_w, k_b;        // [D, D], [D]
  std::vector<double> v_w, v_b, o_w, o_b;        // [D, D], [D]
  std::vector<double> norm2_w, norm2_b;          // [D]
  std::vector<double> ffn_in_w, ffn_in_b;        // [F, D], [F]
  std::vector<double> ffn_out_w, ffn_out_b;      // [D, F], [D]
};

// One parameter as the file contract names it: "layers.0.attn.q_proj.weight", shape {D, D}.
struct ParameterRef {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<double>* values;
};

struct Model {
  ModelConfig config;
  std::vector<LayerWeights> layers;
  std::vector<double> final_norm_w, final_norm_b;  // [D]

  // Every parameter is sized (zero-filled) from `config`, which must be valid.
  static Model allocate(const ModelConfig& config);
  // All parameters in a fixed order (layer by layer, then final_norm), for I/O and generators.
  std::vector<ParameterRef> parameters();
  int64_t parameter_count() const;
};

}  // namespace hk
