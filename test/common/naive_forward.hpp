// A deliberately plain float64 evaluation of MODEL.md: loops over the formulas as written,
// shared by every test as the reference. No blocking, no online softmax, no shortcuts, so that
// it is easy to check by reading against MODEL.md.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "hk/model.hpp"

namespace hk::test {

// h[t, :] = LN(x[t, :]; w, b), biased variance, eps inside the sqrt.
inline void naive_layer_norm(const std::vector<double>& x, int64_t T, int D, const std::vector<double>& w,
                             const std::vector<double>& b, double eps, std::vector<double>& h) {
  h.assign(size_t(T) * D, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const double* r = &x[size_t(t) * D];
    double mean = 0;
    for (int c = 0; c < D; ++c) mean += r[c];
    mean /= D;
    double var = 0;
    for (int c = 0; c < D; ++c) var += (r[c] - mean) * (r[c] - mean);
    var /= D;
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < D; ++c) h[size_t(t) * D + c] = (r[c] - mean) * inv * w[c] + b[c];
  }
}

// y[t, o] = sum_i x[t, i] W[o, i] + bias[o]   (nn.Linear, W is [out, in]).
inline void naive_linear(const std::vector<double>& x, int64_t T, int in, const std::vector<double>& W,
                         const std::vector<double>& bias, int out, std::vector<double>& y) {
  y.assign(size_t(T) * out, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int o = 0; o < out; ++o) {
      double acc = bias[o];
      for (int i = 0; i < in; ++i) acc += x[size_t(t) * in + i] * W[size_t(o) * in + i];
      y[size_t(t) * out + o] = acc;
    }
}

inline double naive_gelu(double z) { return 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0))); }

// o[b, s, h*hd + c] from q, k, v laid out [B, S, D] (head h at columns h*hd).
// lengths: [B] or empty (all valid). A row with no allowed key gives zeros.
inline void naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                            const std::vector<double>& v, int B, int S, int D, int H, bool causal,
                            const std::vector<int32_t>& lengths, std::vector<double>& o) {
  const int hd = D / H;
  const double scale = 1.0 / std::sqrt(double(hd));
  o.assign(size_t(B) * S * D, 0.0);
  std::vector<double> p(S);
  for (int b = 0; b < B; ++b) {
    const int len = lengths.empty() ? S : lengths[b];
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < S; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < S; ++j) {
          const bool allowed = j < len && (!causal || j <= i);
          if (!allowed) {
            p[j] = -std::numeric_limits<double>::infinity();
            continue;
          }
          double s = 0;
          for (int c = 0; c < hd; ++c)
            s += q[(size_t(b) * S + i) * D + h * hd + c] * k[(size_t(b) * S + j) * D + h * hd + c];
          p[j] = s * scale;
          if (p[j] > mx) mx = p[j];
        }
        if (mx == -std::numeric_limits<double>::infinity()) continue;  // no allowed key: p = 0
        double sum = 0;
        for (int j = 0; j < S; ++j) {
          p[j] = std::isinf(p[j]) ? 0.0 : std::exp(p[j] - mx);
          sum += p[j];
        }
        for (int c = 0; c < hd; ++c) {
          double acc = 0;
          for (int j = 0; j < S; ++j) acc += p[j] * v[(size_t(b) * S + j) * D + h * hd + c];
          o[(size_t(b) * S + i) * D + h * hd + c] = acc / sum;
        }
      }
  }
}

// The whole forward of MODEL.md in float64. x: [B, S, D]; lengths: [B] or empty.
inline std::vector<double> naive_forward(const Model& m, const std::vector<double>& x_in, int B, int S,
                                         const std::vector<int32_t>& lengths) {
  const ModelConfig& c = m.config;
  const int D = c.d_model, F = c.ffn_dim;
  const int64_t T = int64_t(B) * S;
  std::vector<double> x = x_in, h, q, k, v, o, proj, f;
  for (const LayerWeights& w : m.layers) {
    naive_layer_norm(x, T, D, w.norm1_w, w.norm1_b, c.eps, h);
    naive_linear(h, T, D, w.q_w, w.q_b, D, q);
    naive_linear(h, T, D, w.k_w, w.k_b, D, k);
    naive_linear(h, T, D, w.v_w, w.v_b, D, v);
    naive_attention(q, k, v, B, S, D, c.n_heads, c.causal, lengths, o);
    naive_linear(o, T, D, w.o_w, w.o_b, D, proj);
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
    naive_layer_norm(x, T, D, w.norm2_w, w.norm2_b, c.eps, h);
    naive_linear(h, T, D, w.ffn_in_w, w.ffn_in_b, F, f);
    for (double& z : f) z = naive_gelu(z);
    naive_linear(f, T, F, w.ffn_out_w, w.ffn_out_b, D, proj);
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
  }
  std::vector<double> y;
  naive_layer_norm(x, T, D, m.final_norm_w, m.final_norm_b, c.eps, y);
  for (int b = 0; b < B; ++b) {
    const int len = lengths.empty() ? S : lengths[b];
    for (int s = len; s < S; ++s)
      for (int d = 0; d < D; ++d) y[(size_t(b) * S + s) * D + d] = 0.0;
  }
  return y;
}

// The accuracy budget of MODEL.md: |y - ref| <= max(atol, rtol * |ref|). Returns the worst ratio
// |y - ref| / max(atol, rtol |ref|) (<= 1 passes; NaN anywhere gives +inf).
inline double budget_ratio(const float* y, const std::vector<double>& ref, double atol = 2e-3,
                           double rtol = 0.02) {
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(y[i])) return std::numeric_limits<double>::infinity();
    const double r = std::fabs(double(y[i]) - ref[i]) / std::max(atol, rtol * std::fabs(ref[i]));
    if (r > worst) worst = r;
  }
  return worst;
}

}  // namespace hk::test
