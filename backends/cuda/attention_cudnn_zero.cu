// Zeroing of the padded query rows for the cuDNN attention route: cuDNN leaves rows
// s >= seq_len_q unwritten, while AttentionParams promises zeros there.
#include "attention_cudnn.cuh"
#include "common.cuh"

#include <algorithm>

namespace hk::cuda::detail {
namespace {

// One 16-byte chunk (8 halves) per thread; blockIdx.y walks sequences, so a fully valid
// sequence costs one load of lengths[b] per thread and no stores.
__global__ void zero_padded_rows_kernel(char* out, const int32_t* lengths, int B, int S,
                                        int chunks_per_row, int64_t row_bytes) {
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  for (int b = blockIdx.y; b < B; b += gridDim.y) {
    const int len = min(max(lengths[b], 0), S);
    const int64_t n = static_cast<int64_t>(S - len) * chunks_per_row;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t row = static_cast<int64_t>(b) * S + len + i / chunks_per_row;
      const int64_t chunk = i % chunks_per_row;
      *reinterpret_cast<uint4*>(out + row * row_bytes + chunk * 16) = zero;
    }
  }
}

}  // namespace

void zero_padded_rows_f16(void* out, const int32_t* lengths, int B, int S, int D,
                          int64_t out_row_stride, cudaStream_t stream) {
  if (B <= 0 || S <= 0 || D <= 0) return;
  constexpr int kThreads = 256;
  const int chunks_per_row = D / 8;  // D is a multiple of 8 (head_dim is), rows 16-byte aligned
  const int64_t chunks_per_seq = static_cast<int64_t>(S) * chunks_per_row;
  // Enough blocks to cover one full sequence, capped: a sequence is mostly valid in practice.
  const unsigned gx = static_cast<unsigned>(
      std::min<int64_t>((chunks_per_seq + kThreads - 1) / kThreads, 64));
  const unsigned gy = static_cast<unsigned>(std::min(B, 65535));
  zero_padded_rows_kernel<<<dim3(gx, gy), kThreads, 0, stream>>>(
      static_cast<char*>(out), lengths, B, S, chunks_per_row,
      out_row_stride * static_cast<int64_t>(sizeof(__half)));
  HK_CUDA_CHECK_LAUNCH();
}

}  // namespace hk::cuda::detail
