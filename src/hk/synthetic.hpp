// Seeded synthetic models and inputs, MODEL.md's standard distribution (optionally with
// non-trivial LayerNorm parameters), used by hk_generate and the tests. Uses its own generator
// so that results do not depend on the standard library's distribution implementations.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "hk/model.hpp"

namespace hk {

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  int uniform_int(int lo, int hi) { return lo + int(next() % uint64_t(hi - lo + 1)); }  // [lo, hi]

 private:
  uint64_t s_;
};

// nn.Linear default init (uniform +-1/sqrt(fan_in) for weight and bias); LayerNorm weight 1,
// bias 0, or, with nontrivial_ln, weight ~ U(0.5, 1.5) and bias ~ U(-0.5, 0.5).
inline Model synthetic_model(const ModelConfig& c, uint64_t seed, bool nontrivial_ln = false) {
  Model m = Model::allocate(c);
  Rng rng(seed);
  for (auto& p : m.parameters()) {
    const bool is_norm = p.name.find("norm") != std::string::npos;
    const bool is_weight = p.name.size() > 6 && p.name.compare(p.name.size() - 6, 6, "weight") == 0;
    if (is_norm) {
      for (double& v : *p.values)
        v = nontrivial_ln ? (is_weight ? rng.uniform(0.5, 1.5) : rng.uniform(-0.5, 0.5)) : (is_weight ? 1.0 : 0.0);
    } else {
      const int64_t fan_in = p.name.find("ffn_out") != std::string::npos ? c.ffn_dim : c.d_model;
      const double bound = 1.0 / std::sqrt(double(fan_in));
      for (double& v : *p.values) v = rng.uniform(-bound, bound);
    }
  }
  return m;
}

inline std::vector<float> synthetic_input(int B, int S, int D, uint64_t seed) {
  Rng rng(seed ^ 0xABCDEF12345ull);
  std::vector<float> x(size_t(B) * S * D);
  for (float& v : x) v = float(rng.normal());
  return x;
}

inline std::vector<int32_t> synthetic_lengths(int B, int S, uint64_t seed) {
  Rng rng(seed ^ 0x5EEDull);
  std::vector<int32_t> len(B);
  for (int32_t& l : len) l = rng.uniform_int(1, S);
  return len;
}

}  // namespace hk
