// LayerNorm over rows held in the mma.sync C layout (thread (g, t) of a warp holds rows g and g + 8,
// columns 8j + 2t and 8j + 2t + 1 of every n8 tile j): the statistics of the thread's two rows
// across its quad, shared by the fused post-attention chain and the whole-model tile kernel.
// Device-only; include from .cu files.
#pragma once

#include "ptx.cuh"

namespace hk::cuda::quad {

// Statistics of the rows shifted by their first element (column 0: acc[0][0] / acc[0][2] of the
// quad's leader), in one pass: the sum and the sum of squares of the shifted values, var = E[d^2] -
// E[d]^2 (clamped at 0). The shift keeps both sums at the scale of the row's spread, so a constant
// row gets variance exactly 0 and rows far from zero keep the accuracy of their spread (E[d]^2
// cancels against E[d^2] only as far as the first element is from the mean, a few standard
// deviations in practice). The normalised value is fma(acc - shift, rstd, nmr) (ln_value).
struct RowStats {
  float shift[2];
  float rstd[2];
  float nmr[2];  // -mean * rstd, mean of the shifted row
};

// Over all NT n8 tiles (D = 8 NT).
template <int NT>
__device__ __forceinline__ RowStats row_stats(const float (&acc)[NT][4], float eps) {
  const int leader = int(threadIdx.x & 31u) & ~3;
  const float sh0 = __shfl_sync(0xffffffffu, acc[0][0], leader);
  const float sh1 = __shfl_sync(0xffffffffu, acc[0][2], leader);
  float s0 = 0.f, s1 = 0.f, q0 = 0.f, q1 = 0.f;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const float a = acc[j][0] - sh0, b = acc[j][1] - sh0;
    const float c = acc[j][2] - sh1, d = acc[j][3] - sh1;
    s0 += a;
    s0 += b;
    s1 += c;
    s1 += d;
    q0 = fmaf(a, a, q0);
    q0 = fmaf(b, b, q0);
    q1 = fmaf(c, c, q1);
    q1 = fmaf(d, d, q1);
  }
  ptx::quad_sum(s0, s1);
  ptx::quad_sum(q0, q1);
  const float inv_d = 1.f / float(8 * NT);
  const float m0 = s0 * inv_d, m1 = s1 * inv_d;
  RowStats st;
  st.rstd[0] = rsqrtf(fmaxf(fmaf(-m0, m0, q0 * inv_d), 0.f) + eps);
  st.rstd[1] = rsqrtf(fmaxf(fmaf(-m1, m1, q1 * inv_d), 0.f) + eps);
  st.nmr[0] = -m0 * st.rstd[0];
  st.nmr[1] = -m1 * st.rstd[1];
  // The shift reaches the normalisation through a (value-preserving) quad broadcast: with the
  // same register, the compiler keeps every shifted value of the loop alive for it, D/2 more
  // registers next to the residual (spills at D = 256).
  st.shift[0] = __shfl_sync(0xffffffffu, sh0, leader);
  st.shift[1] = __shfl_sync(0xffffffffu, sh1, leader);
  return st;
}

// LN value of one accumulator element; half 0: row g (elements 0, 1), half 1: row g + 8 (2, 3).
__device__ __forceinline__ float ln_value(float a, const RowStats& st, int half, float w, float b) {
  return fmaf(fmaf(a - st.shift[half], st.rstd[half], st.nmr[half]), w, b);
}

}  // namespace hk::cuda::quad
