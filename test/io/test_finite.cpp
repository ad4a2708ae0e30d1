// hk::io::first_nonfinite, the blocked scan behind the input check and hk_forward's check of y:
// every position of a few blocks, both infinities and NaN payloads, the last partial block,
// n = 0, and values that look close to the exponent pattern but are finite.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "hk/io/finite.hpp"

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(FirstNonfinite, FiniteArraysAndEmpty) {
  EXPECT_EQ(hk::io::first_nonfinite(nullptr, 0), -1);
  std::vector<float> x(3 * 4096 + 17);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) - 3.f;
  x[5] = std::numeric_limits<float>::max();
  x[6] = -std::numeric_limits<float>::max();
  x[7] = std::numeric_limits<float>::denorm_min();
  x[8] = from_bits(0x7f7fffffu);  // largest finite: exponent bits all set but one
  x[9] = -0.f;
  EXPECT_EQ(hk::io::first_nonfinite(x.data(), int64_t(x.size())), -1);
}

TEST(FirstNonfinite, FindsTheFirstOfEveryKindAnywhere) {
  const int64_t n = 3 * 4096 + 17;  // three whole blocks and a partial one
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity(), from_bits(0xff800001u) /* NaN, sign set */};
  std::vector<float> x(size_t(n), 1.f);
  for (const float b : bad)
    for (const int64_t at : {int64_t(0), int64_t(1), int64_t(4095), int64_t(4096), int64_t(8191), int64_t(2 * 4096 + 5),
                             n - 17, n - 1}) {
      x[size_t(at)] = b;
      EXPECT_EQ(hk::io::first_nonfinite(x.data(), n), at);
      if (at + 3 < n) {
        x[size_t(at + 3)] = b;  // a later one does not hide the first
        EXPECT_EQ(hk::io::first_nonfinite(x.data(), n), at);
        x[size_t(at + 3)] = 1.f;
      }
      EXPECT_EQ(hk::io::first_nonfinite(x.data(), at), -1) << "before " << at;
      x[size_t(at)] = 1.f;
    }
}

// The threaded scan gives the serial answer: the first hit in any part (several hits in several
// parts: the earliest), none, sizes just above the split threshold with an uneven last part, and
// 1 or 7 parts.
TEST(FirstNonfinite, TheParallelScanGivesTheSerialAnswer) {
  const int64_t n = (int64_t(1) << 22) + 4099;  // above the split threshold, parts of uneven size
  std::vector<float> x(size_t(n), 0.5f);
  EXPECT_EQ(hk::io::first_nonfinite_parallel(x.data(), n), -1);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const int64_t quarter = (n + 3) / 4;
  for (const int parts : {1, 4, 7})
    for (const int64_t at : {int64_t(0), quarter - 1, quarter, 2 * quarter + 1, 3 * quarter, n - 1}) {
      SCOPED_TRACE(std::to_string(parts) + " parts, at " + std::to_string(at));
      x[size_t(at)] = at % 2 ? nan : -inf;
      EXPECT_EQ(hk::io::first_nonfinite_parallel(x.data(), n, parts), at);
      if (at + quarter < n) {
        x[size_t(at + quarter)] = inf;  // a later hit in a later part does not win
        EXPECT_EQ(hk::io::first_nonfinite_parallel(x.data(), n, parts), at);
        x[size_t(at + quarter)] = 0.5f;
      }
      x[size_t(at)] = 0.5f;
    }
  x[size_t(n - 1)] = nan;  // small arrays take the serial path with the same answer
  EXPECT_EQ(hk::io::first_nonfinite_parallel(x.data() + n - 100, 100), 99);
}

}  // namespace
