// The token rows a padding-free plan runs on (engine.hpp: padding-free execution). Pure host
// code, shared by the engine and its host test.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

namespace hk::cuda {

// B sequences of S positions, `tokens` valid (-1: unknown). pin: "" (auto), "0" (never pack),
// "1" (pack whenever the bucket is smaller than B*S). Returns B*S for the dense plan, else T
// rounded up to a bucket of max(256, B*S/32 rounded up to a multiple of 256) rows; auto packs only when the
// bucket is at most 85% of B*S and B*S >= 4096 (below that the packing launch costs more than
// the rows it saves).
inline int64_t padding_free_rows(int B, int S, int64_t tokens, const std::string& pin) {
  const int64_t dense = int64_t(B) * S;
  // The packed layout's row offsets are int32 (seq_start, row_dst): beyond that, dense.
  if (tokens < 0 || tokens >= dense || pin == "0" || dense > INT32_MAX) return dense;
  const int64_t granule = std::max<int64_t>(256, (dense / 32 + 255) / 256 * 256);
  const int64_t rows = std::max<int64_t>(1, (tokens + granule - 1) / granule) * granule;
  if (rows >= dense) return dense;
  if (pin == "1") return rows;
  return dense >= 4096 && rows * 100 <= dense * 85 ? rows : dense;
}

}  // namespace hk::cuda
