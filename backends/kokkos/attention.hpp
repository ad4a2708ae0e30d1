// Multi-head attention of the Kokkos backend (MODEL.md): o = softmax(mask(q k^T / sqrt(hd))) v,
// one team per (sequence, head, block of query rows), K/V tiles staged in team scratch, online
// softmax. Kernel: "hk::attention[kokkos]".
#pragma once

#include "kokkos/common.hpp"

namespace hk::kokkos {

// qkv [B*S, 3D] holds q | k | v (head h at columns h*hd of each third); qkv_bias [3D] is added on
// load when not empty (the fused projection leaves it out), else qkv already holds it.
// lengths [>= B], each in 0..S. Writes o [B*S, D] ([B, S, H, hd] order). Query rows s >= lengths[b]
// are written as 0 (they never influence valid rows; the model tail zeroes them anyway), as is
// any row with no allowed key. Under `causal`, valid query i sees keys j <= i (< lengths[b]).
template <class T>
void attention(const ConstMat<T>& qkv, const ConstVec<T>& qkv_bias, const Lengths& lengths, int B, int S,
               int H, bool causal, const Mat<T>& o);

}  // namespace hk::kokkos
