// The finiteness scan of a float32 array: the input check of every slice read and hk_forward's
// check of every output chunk. Branch-free over blocks (the compiler vectorises it), so that a
// chunk of tens of megabytes is scanned at memory speed instead of element by element.
#pragma once

#include <cstdint>

namespace hk::io {

// Index of the first NaN or +-Inf of x[0, n), or -1 when every element is finite.
int64_t first_nonfinite(const float* x, int64_t n);
// The same answer, the scan shared by up to `parts` threads when x is large (at least 4M
// elements: a chunk of tens of megabytes, which one thread scans at ~5 GB/s). The calling thread
// takes the first part; every helper is joined before it returns.
int64_t first_nonfinite_parallel(const float* x, int64_t n, int parts = 4);

}  // namespace hk::io
