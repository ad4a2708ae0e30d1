// Model hyper-parameters and the precision modes (MODEL.md).
#pragma once

#include <cstdint>
#include <string>

namespace hk {

struct ModelConfig {
  int d_model = 0;   // D
  int n_heads = 0;   // H, D % H == 0
  int n_layers = 0;  // L >= 1
  int ffn_dim = 0;   // F
  bool causal = false;
  double eps = 1e-5;

  int head_dim() const { return n_heads > 0 ? d_model / n_heads : 0; }
  // Throws hk::Error naming `where` when the combination is inconsistent or would overflow.
  void validate(const std::string& where) const;
};

// fast: reduced-precision tensor-core arithmetic allowed (fp32 residual and statistics);
// fp32: no reduced precision anywhere (no TF32); reference: float64 everywhere (host backend, tests).
enum class Precision { fast, fp32, reference };

const char* to_string(Precision p);
Precision precision_from_string(const std::string& s);  // throws hk::Error on an unknown name

}  // namespace hk
