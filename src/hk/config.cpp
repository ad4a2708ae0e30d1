#include "hk/config.hpp"

#include <limits>

#include "hk/error.hpp"

namespace hk {

void ModelConfig::validate(const std::string& where) const {
  auto fail = [&](const std::string& what) { throw Error(where + ": " + what); };
  if (d_model <= 0) fail("d_model must be positive, got " + std::to_string(d_model));
  if (n_heads <= 0) fail("n_heads must be positive, got " + std::to_string(n_heads));
  if (n_layers <= 0) fail("n_layers must be positive, got " + std::to_string(n_layers));
  if (ffn_dim <= 0) fail("ffn_dim must be positive, got " + std::to_string(ffn_dim));
  if (d_model % n_heads != 0)
    fail("d_model (" + std::to_string(d_model) + ") must be a multiple of n_heads (" +
         std::to_string(n_heads) + ")");
  if (!(eps > 0.0) || eps > 1.0) fail("eps must be in (0, 1], got " + std::to_string(eps));
  // Weight matrices are indexed with 64-bit offsets, but a single [F, D] matrix or a [3D, D]
  // fused weight beyond 2^31 elements is far outside any sane model and would break int
  // leading dimensions of the BLAS libraries.
  const int64_t big = std::numeric_limits<int32_t>::max();
  if (int64_t(3) * d_model * d_model > big || int64_t(ffn_dim) * d_model > big)
    fail("d_model/ffn_dim too large (a weight matrix would exceed 2^31 elements)");
}

const char* to_string(Precision p) {
  switch (p) {
    case Precision::fast: return "fast";
    case Precision::fp32: return "fp32";
    case Precision::reference: return "reference";
  }
  return "?";
}

Precision precision_from_string(const std::string& s) {
  if (s == "fast") return Precision::fast;
  if (s == "fp32") return Precision::fp32;
  if (s == "reference") return Precision::reference;
  throw Error("unknown precision '" + s + "' (expected fast, fp32 or reference)");
}

}  // namespace hk
