// The projections of the Kokkos backend: nn.Linear products through KokkosBlas::gemm (the BLAS
// TPL where Kokkos Kernels has one, its portable kernel elsewhere), and the row epilogues that
// complete them (bias, bias + exact GELU). A residual projection accumulates into the residual
// stream directly (beta = 1), and its bias is added by whatever runs next on those rows.
// Kernels: "hk::linear[kokkos]" (GEMM), "hk::add_bias[kokkos]", "hk::bias_gelu[kokkos]".
#pragma once

#include "kokkos/common.hpp"

namespace hk::kokkos {

// out = in W^T + beta out. in [T, K], W [N, K] (nn.Linear's [out, in]), out [T, N].
// beta = 0 ignores what out held (NaN included); beta = 1 accumulates.
template <class T>
void gemm_nt(const ConstMat<T>& in, const ConstMat<T>& W, T beta, const Mat<T>& out);

// y[r, :] += bias.
template <class T>
void add_bias(const Mat<T>& y, const ConstVec<T>& bias);

// y[r, :] = GELU(y[r, :] + bias), exact erf GELU.
template <class T>
void bias_gelu(const Mat<T>& y, const ConstVec<T>& bias);

}  // namespace hk::kokkos
