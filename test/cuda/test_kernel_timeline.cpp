// The kernel-timeline summary of hk_bench_cuda --timeline (perf/cuda/kernel_timeline.hpp) on
// hand-made records: medians per kernel, the advance of a kernel whose prologue overlaps its
// predecessor (programmatic dependent launch), the span, forwards of two kernel sequences kept
// apart, and the refusals when the records do not split into the forwards' kernel counts. The
// CUPTI side needs a GPU and runs on the device.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kernel_timeline.hpp"

namespace {

using hk::perf::KernelRecord;

KernelRecord rec(const char* name, uint64_t start, uint64_t end) {
  KernelRecord r;
  r.name = name;
  r.start_ns = start;
  r.end_ns = end;
  r.grid = 8;
  r.block = 256;
  r.registers = 64;
  r.dynamic_smem = 2048;
  return r;
}

// The table row of kernel k (its line starting "| k |").
std::string row(const std::string& table, int k) {
  const std::string key = "| " + std::to_string(k) + " |";
  const size_t p = table.find(key);
  if (p == std::string::npos) return {};
  return table.substr(p, table.find('\n', p) - p);
}

TEST(KernelTimeline, MediansAdvancesAndSpan) {
  // Three forwards of a -> b -> c (times in ns from an arbitrary origin); b starts before a ends
  // (its prologue overlaps), c follows b after a gap. Forward 1 is slower than the others, so the
  // medians come from forwards 0 and 2.
  std::vector<KernelRecord> recs;
  for (uint64_t f = 0; f < 3; ++f) {
    const uint64_t t = 1000000 * f, slow = f == 1 ? 5000 : 0;
    recs.push_back(rec("a", t, t + 4000 + slow));
    recs.push_back(rec("b", t + 3000, t + 9000 + slow));
    recs.push_back(rec("c", t + 10000 + slow, t + 12000 + slow));
  }
  const std::string table = hk::perf::timeline_tables(hk::perf::split_forwards(recs, {3, 3, 3}));
  EXPECT_EQ(table.rfind("kernel sequence 1 of 1: 3 of 3 forwards\n", 0), 0u) << table;
  // kernel | shape | regs | smem KB | us | start | end | advance
  EXPECT_EQ(row(table, 0), "| 0 | a | 8 x 256 | 64 | 2.0 | 4.00 | 0.00 | 4.00 | 4.00 |");
  EXPECT_EQ(row(table, 1), "| 1 | b | 8 x 256 | 64 | 2.0 | 6.00 | 3.00 | 9.00 | 5.00 |");
  EXPECT_EQ(row(table, 2), "| 2 | c | 8 x 256 | 64 | 2.0 | 2.00 | 10.00 | 12.00 | 3.00 |");
  EXPECT_NE(table.find("median span (first kernel start to last kernel end) 12.00 us; median sum of kernel durations "
                       "12.00 us"),
            std::string::npos)
      << table;
}

TEST(KernelTimeline, AdvanceOfAKernelInsideCoveredTime) {
  // b runs and ends inside a's time (a node beside others): it adds nothing; c ends 2 us past a. The
  // advances add up to the span; medians of two forwards are the mean of the middle two.
  const std::vector<KernelRecord> recs = {rec("a", 0, 10000),     rec("b", 1000, 3000),  rec("c", 2000, 12000),
                                          rec("a", 100000, 110000), rec("b", 101000, 105000),
                                          rec("c", 102000, 114000)};
  const std::string t = hk::perf::timeline_tables(hk::perf::split_forwards(recs, {3, 3}));
  EXPECT_EQ(row(t, 1), "| 1 | b | 8 x 256 | 64 | 2.0 | 3.00 | 1.00 | 4.00 | 0.00 |") << t;
  EXPECT_EQ(row(t, 2), "| 2 | c | 8 x 256 | 64 | 2.0 | 11.00 | 2.00 | 13.00 | 3.00 |") << t;
  EXPECT_NE(t.find("median span (first kernel start to last kernel end) 13.00 us"), std::string::npos) << t;
}

TEST(KernelTimeline, ClusterShapeShown) {
  KernelRecord r = rec("k", 0, 1000);
  r.cluster = 4;
  const std::string table = hk::perf::timeline_tables({{r}});
  EXPECT_EQ(row(table, 0), "| 0 | k | 8 x 256 (4) | 64 | 2.0 | 1.00 | 0.00 | 1.00 | 1.00 |");
}

TEST(KernelTimeline, ForwardsOfTwoPlansKeptApart) {
  // Forwards alternate between a two-kernel plan (a, b) and a one-kernel plan (m), as input sets of
  // different token counts may: counts 2, 1, 2, 1.
  const std::vector<KernelRecord> recs = {rec("a", 0, 1000),         rec("b", 1000, 3000), rec("m", 10000, 17000),
                                          rec("a", 20000, 21000),    rec("b", 21000, 23000),
                                          rec("m", 30000, 37000)};
  const std::string t = hk::perf::timeline_tables(hk::perf::split_forwards(recs, {2, 1, 2, 1}));
  const size_t first = t.find("kernel sequence 1 of 2: 2 of 4 forwards"), second = t.find("kernel sequence 2 of 2: 2 of 4 forwards");
  ASSERT_NE(first, std::string::npos) << t;
  ASSERT_NE(second, std::string::npos) << t;
  EXPECT_NE(t.find("| 1 | b | 8 x 256 | 64 | 2.0 | 2.00 | 1.00 | 3.00 | 2.00 |", first), std::string::npos) << t;
  EXPECT_NE(t.find("| 0 | m | 8 x 256 | 64 | 2.0 | 7.00 | 0.00 | 7.00 | 7.00 |", second), std::string::npos) << t;
  // The same names with another grid are another plan too.
  KernelRecord wide = rec("m", 40000, 41000);
  wide.grid = 16;
  const std::string t2 = hk::perf::timeline_tables({{rec("m", 0, 7000)}, {wide}});
  EXPECT_NE(t2.find("kernel sequence 2 of 2: 1 of 2 forwards"), std::string::npos) << t2;
}

TEST(KernelTimeline, RefusesRecordsThatAreNotWholeForwards) {
  const std::vector<KernelRecord> five = {rec("a", 0, 1), rec("b", 2, 3), rec("a", 10, 11), rec("b", 12, 13),
                                          rec("a", 20, 21)};
  EXPECT_THROW(hk::perf::split_forwards(five, {2, 2}), std::runtime_error);
  EXPECT_THROW(hk::perf::split_forwards(five, {2, 2, 2}), std::runtime_error);
  EXPECT_EQ(hk::perf::split_forwards(five, {2, 2, 1}).size(), 3u);
  EXPECT_THROW(hk::perf::timeline_tables({}), std::runtime_error);
  EXPECT_THROW(hk::perf::timeline_tables({{rec("a", 0, 1)}, {}}), std::runtime_error);
}

}  // namespace
