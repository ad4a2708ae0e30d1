// The k order of the A operands in the column whole-model kernel (model_persistent.cu): host- and
// device-compilable (test_cuda_host checks it on the CPU).
//
// Where logical column c (even) of a K-wide fp16 A operand is stored when its B operand (weights
// [N, K], K contiguous) is read with 16-byte loads (K % 16 == 0): within each group of 32 columns,
// logical 8t + 4s + 2h + i is stored at 16s + 8h + 2t + i, so that ldmatrix hands the lane of quad
// position t, at k16 step s of the group, the logical columns 8t + 4s + 2h + i in fragment register
// h: the 8 consecutive weights 8t .. 8t + 7 of a row (one 16-byte load) are that lane's B fragments
// of both k16 steps of the group. A last group of 16 (K % 32 == 16): logical 4t + 2h + i at
// 8h + 2t + i (8-byte loads). Columns c and c + 1 stay adjacent (c even).
#pragma once

#if defined(__CUDACC__)
#define HK_PERM_HD __host__ __device__ __forceinline__
#else
#define HK_PERM_HD inline
#endif

namespace hk::cuda {

HK_PERM_HD int perm_col(int c, int K) {
  const int base = c & ~31;
  if (base + 32 <= K) {
    const int r = c & 31;
    return base + ((r >> 2) & 1) * 16 + ((r >> 1) & 1) * 8 + (r >> 3) * 2 + (r & 1);
  }
  const int r = c & 15;
  return (c & ~15) + ((r >> 1) & 1) * 8 + (r >> 2) * 2 + (r & 1);
}

}  // namespace hk::cuda

#undef HK_PERM_HD
