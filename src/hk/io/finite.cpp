#include "hk/io/finite.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <vector>

namespace hk::io {

int64_t first_nonfinite(const float* x, int64_t n) {
  // A float is NaN or Inf when its 8 exponent bits are all set. Blocks of 4096 are OR-reduced
  // without branches; only a block with a hit is searched element by element.
  constexpr int64_t kBlock = 4096;
  constexpr uint32_t kExp = 0x7f800000u;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    uint32_t hit = 0;
    for (int64_t i = b; i < e; ++i) {
      uint32_t u;
      std::memcpy(&u, x + i, sizeof u);
      hit |= uint32_t((u & kExp) == kExp);
    }
    if (hit)
      for (int64_t i = b; i < e; ++i)
        if (!std::isfinite(x[i])) return i;
  }
  return -1;
}

int64_t first_nonfinite_parallel(const float* x, int64_t n, int parts) {
  constexpr int64_t kMinSplit = int64_t(1) << 22;
  if (parts < 2 || n < kMinSplit) return first_nonfinite(x, n);
  const int64_t step = (n + parts - 1) / parts;
  std::vector<std::future<int64_t>> rest;
  for (int64_t b = step; b < n; b += step)
    rest.push_back(std::async(std::launch::async, [x, b, e = std::min(n, b + step)] {
      const int64_t i = first_nonfinite(x + b, e - b);
      return i < 0 ? i : b + i;
    }));
  int64_t i = first_nonfinite(x, std::min(n, step));
  for (auto& f : rest) {
    const int64_t j = f.get();  // every part joined before returning
    if (i < 0) i = j;
  }
  return i;
}

}  // namespace hk::io
