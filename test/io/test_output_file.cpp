// OutputFile: data and attributes round trip; a run that does not commit leaves no file and
// never touches a previous output; misuse is refused with a one-line error.
#include <gtest/gtest.h>

#include <filesystem>

#include "h5_test_util.hpp"

namespace hk::test {
namespace {

std::vector<float> ramp(size_t n, float offset) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = offset + 0.25f * float(i);
  return v;
}

TEST(OutputFile, WritesChunksAndAttributes) {
  ScratchDir dir;
  const std::string f = dir.path("out.h5");
  const int64_t B = 5;
  const int S = 3, D = 4;
  const std::vector<float> y = ramp(size_t(B) * S * D, -2.f);
  {
    io::OutputFile out(f, B, S, D);
    EXPECT_EQ(out.temp_path(), f + ".tmp." + std::to_string(::getpid()));
    out.set_attribute("precision", "fast");
    out.set_attribute("backend", "kokkos");
    out.set_attribute("precision", "fp32");  // replaced, not duplicated
    out.write(0, 2, y.data());
    out.write(2, 1, y.data() + 2 * S * D);
    out.write(3, 2, y.data() + 3 * S * D);
    EXPECT_FALSE(std::filesystem::exists(f)) << "visible before commit";
    out.commit();
    EXPECT_TRUE(out.committed());
  }
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"out.h5"});
  const io::OutputData back = io::read_output(f);
  EXPECT_EQ(back.B, B);
  EXPECT_EQ(back.S, S);
  EXPECT_EQ(back.D, D);
  EXPECT_EQ(back.y, y);
  EXPECT_EQ(back.attributes.at("precision"), "fp32");
  EXPECT_EQ(back.attributes.at("backend"), "kokkos");
}

// Rows written with their lengths: padded positions are not written and read back as zeros;
// runs of full rows and the valid prefix after them in one write; lengths 0, 1, S, S-1 mixed;
// a bigger file whose unwritten ranges span whole pages (holes of the new file).
TEST(OutputFile, PaddedPositionsAreLeftUnwrittenAndReadAsZero) {
  for (const int S : {3, 512}) {
    ScratchDir dir;
    const std::string f = dir.path("out.h5");
    const int64_t B = 9;
    const int D = 8;
    // The last rows empty: the file then ends before the dataset until HDF5 closes it.
    const std::vector<int32_t> lengths = {0, S, S, 1, S - 1, S, S, 0, 0};
    std::vector<float> y = ramp(size_t(B) * S * D, 1.f);
    std::vector<float> garbage = y;  // what is in the caller's buffer past each length: not written
    for (int64_t b = 0; b < B; ++b)
      for (int s = lengths[size_t(b)]; s < S; ++s)
        for (int d = 0; d < D; ++d) {
          y[(size_t(b) * S + s) * D + d] = 0.f;
          garbage[(size_t(b) * S + s) * D + d] = 12345.f;
        }
    {
      io::OutputFile out(f, B, S, D);
      out.write(0, 4, garbage.data(), lengths.data());
      out.write(4, 5, garbage.data() + 4 * S * D, lengths.data() + 4);
      out.commit();
    }
    const io::OutputData back = io::read_output(f);
    ASSERT_EQ(back.y.size(), y.size());
    EXPECT_EQ(back.y, y) << "S = " << S;
  }
}

TEST(OutputFile, UncommittedLeavesNoFile) {
  ScratchDir dir;
  const std::string f = dir.path("out.h5");
  {
    io::OutputFile out(f, 2, 3, 4);
    const std::vector<float> y = ramp(12, 0.f);
    out.write(0, 1, y.data());
    EXPECT_TRUE(std::filesystem::exists(out.temp_path()));
  }  // e.g. an exception unwound past it
  EXPECT_TRUE(dir.entries().empty());
}

TEST(OutputFile, FailedRunLeavesThePreviousOutputUntouched) {
  ScratchDir dir;
  const std::string f = dir.path("out.h5");
  {
    io::OutputFile first(f, 1, 2, 2);
    const std::vector<float> y = ramp(4, 1.f);
    first.write(0, 1, y.data());
    first.commit();
  }
  const std::string before = read_bytes(f);
  try {
    io::OutputFile second(f, 3, 2, 2);
    const std::vector<float> y = ramp(4, 9.f);
    second.write(0, 1, y.data());
    throw Error("simulated failure in the middle of a run");
  } catch (const Error&) {
  }
  EXPECT_EQ(read_bytes(f), before);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"out.h5"});
}

TEST(OutputFile, CommitReplacesThePreviousOutput) {
  ScratchDir dir;
  const std::string f = dir.path("out.h5");
  write_text_file(f, "an old file");
  io::OutputFile out(f, 1, 1, 2);
  const float y[2] = {1.f, 2.f};
  out.write(0, 1, y);
  out.commit();
  EXPECT_EQ(io::read_output(f).y, (std::vector<float>{1.f, 2.f}));
}

TEST(OutputFile, CommitNeedsEveryRow) {
  ScratchDir dir;
  const std::string f = dir.path("out.h5");
  {
    io::OutputFile out(f, 3, 1, 2);
    const float y[2] = {1.f, 2.f};
    out.write(0, 1, y);
    HK_EXPECT_FILE_ERROR(error_of([&] { out.commit(); }), f, "/output/y", "expected all 3 rows written before commit, found 1");
  }
  EXPECT_TRUE(dir.entries().empty());
}

TEST(OutputFile, RowsInOrderAndInRange) {
  ScratchDir dir;
  const std::string f = dir.path("out.h5");
  io::OutputFile out(f, 3, 1, 2);
  const float y[4] = {1.f, 2.f, 3.f, 4.f};
  HK_EXPECT_FILE_ERROR(error_of([&] { out.write(1, 1, y); }), f, "/output/y", "expected b0 = 0, found 1");
  out.write(0, 2, y);
  HK_EXPECT_FILE_ERROR(error_of([&] { out.write(2, 2, y); }), f, "/output/y", "expected a range inside [0, 3)");
}

TEST(OutputFile, UnwritableLocation) {
  ScratchDir dir;
  const std::string f = dir.path("no/such/dir/out.h5");
  HK_EXPECT_FILE_ERROR(error_of([&] { io::OutputFile out(f, 1, 1, 1); }), f, "/",
                       "cannot create the temporary output file");
  HK_EXPECT_FILE_ERROR(error_of([&] { io::OutputFile out(dir.dir().string(), 1, 1, 1); }), dir.dir().string(), "/",
                       "found a directory");
  EXPECT_TRUE(dir.entries().empty());
}

TEST(ReadOutput, ValidatesTheDataset) {
  ScratchDir dir;
  const std::string f = dir.path("o.h5");
  write_good_file(f);
  HK_EXPECT_FILE_ERROR(error_of([&] { io::read_output(f); }), f, "/output", "expected a group, found no such object");
}

}  // namespace
}  // namespace hk::test
