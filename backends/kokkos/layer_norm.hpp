// Row-wise LayerNorm of the Kokkos backend (MODEL.md: biased variance, eps inside the sqrt),
// alone or fused with the residual bias that precedes it and with the model's output tail.
// Statistics are two-pass (mean, then the centred sum of squares) in T.
// Kernels: "hk::layer_norm[kokkos]", "hk::add_layer_norm[kokkos]", "hk::final_layer_norm[kokkos]".
#pragma once

#include "kokkos/common.hpp"

namespace hk::kokkos {

// h[r, :] = LN(x[r, :]; w, b) for every row r of x.
template <class T>
void layer_norm(const ConstMat<T>& x, const ConstVec<T>& w, const ConstVec<T>& b, double eps, const Mat<T>& h);

// x[r, :] += bias (written back: the residual stream), then h[r, :] = LN(x[r, :]; w, b).
// Ends out_proj and ffn_out, whose GEMM added the product into x without its bias.
template <class T>
void add_layer_norm(const Mat<T>& x, const ConstVec<T>& bias, const ConstVec<T>& w, const ConstVec<T>& b,
                    double eps, const Mat<T>& h);

// The tail: rows are [B, S] flattened; y[r, :] = LN(x[r, :] + bias; w, b) where s < lengths[b], and
// 0 where the position is padding. bias may be empty (extent 0: nothing added); x is not written.
template <class T>
void final_layer_norm(const ConstMat<T>& x, const ConstVec<T>& bias, const ConstVec<T>& w, const ConstVec<T>& b,
                      double eps, const Lengths& lengths, int seq_len, const Mat<T>& y);

}  // namespace hk::kokkos
