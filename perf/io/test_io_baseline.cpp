// hk_io_baseline run as a program: y must be x bit for bit (the baseline times the same bytes
// hk_forward moves), in one chunk and in several with a short last one, from float32 and from
// float16 input and on the shipped sample; a bad input must give one error line naming the
// file, a non-zero exit and no file left behind.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "h5_test_util.hpp"
#include "process_util.hpp"

namespace hk::test {
namespace {

std::string g_baseline, g_sample;

ProcResult run_baseline(const ScratchDir& dir, const std::vector<std::string>& args) {
  std::vector<std::string> argv{g_baseline};
  argv.insert(argv.end(), args.begin(), args.end());
  static int n = 0;
  // Captured outside the scratch directory, whose entries the tests inspect.
  const std::string capture = (std::filesystem::temp_directory_path() /
                               ("hk_io_baseline_test." + std::to_string(::getpid()) + "." + std::to_string(n++)))
                                  .string();
  ProcResult r = run_process(argv, dir.dir().string(), capture);
  std::remove((capture + ".out").c_str());
  std::remove((capture + ".err").c_str());
  return r;
}

// x as the io layer hands it to hk_forward (float32 whatever the file's type).
std::vector<float> read_x(const std::string& path) {
  io::InputFile in(path);
  std::vector<float> x(size_t(in.batch()) * in.seq_len() * in.d_model());
  in.read(0, in.batch(), x.data(), nullptr);
  return x;
}

// Runs the baseline on `input` and checks /output/y against x bit for bit.
void expect_copy(const ScratchDir& dir, const std::string& input, const std::vector<std::string>& extra,
                 int64_t want_chunks) {
  const std::string out = dir.path("y.h5");
  std::vector<std::string> args{"--input", input, "--output", out};
  args.insert(args.end(), extra.begin(), extra.end());
  const ProcResult r = run_baseline(dir, args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("hk_io_baseline: stats: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" chunks=" + std::to_string(want_chunks) + " "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" read_s="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" write_s="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" total_s="), std::string::npos) << r.out;

  io::InputFile in(input);
  const io::OutputData y = io::read_output(out);
  ASSERT_EQ(y.B, in.batch());
  ASSERT_EQ(y.S, in.seq_len());
  ASSERT_EQ(y.D, in.d_model());
  const std::vector<float> x = read_x(input);
  ASSERT_EQ(y.y.size(), x.size());
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (std::memcmp(&x[i], &y.y[i], sizeof(float)) != 0 && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << "first differing element " << first;
  EXPECT_EQ(y.attributes.count("program"), 1u);
  EXPECT_EQ(y.attributes.at("program").rfind("hk_io_baseline ", 0), 0u);
  // The output was renamed into place: no temporary file is left beside it.
  for (const std::string& e : dir.entries()) EXPECT_EQ(e.find(".tmp."), std::string::npos) << e;
  std::filesystem::remove(out);
}

// B sequences with lengths, and bit patterns a conversion would disturb (-0, subnormals, the
// largest float).
std::string write_tricky_input(const ScratchDir& dir, const std::string& name, int B, int S, int D, io::DType type) {
  std::vector<float> x = synthetic_input(B, S, D, 11);
  x[0] = -0.0f;
  x[1] = std::numeric_limits<float>::denorm_min();
  // float16 would overflow it to -inf, which the io layer rightly refuses.
  x[2] = type == io::DType::float32 ? -std::numeric_limits<float>::max() : -65504.0f;
  std::vector<int32_t> lengths = synthetic_lengths(B, S, 12);
  lengths[0] = 0;
  const std::string path = dir.path(name);
  io::write_input(path, B, S, D, x.data(), lengths.data(), type);
  return path;
}

TEST(IoBaseline, SampleOneChunk) {
  ScratchDir dir;
  expect_copy(dir, g_sample, {}, 1);
}

TEST(IoBaseline, SeveralChunksWithShortLastOne) {
  ScratchDir dir;
  const std::string in = write_tricky_input(dir, "x.h5", 7, 5, 3, io::DType::float32);
  expect_copy(dir, in, {"--chunk", "3"}, 3);  // 3 + 3 + 1
  expect_copy(dir, in, {"--chunk", "1"}, 7);
  expect_copy(dir, in, {"--chunk", "100"}, 1);  // clamped to B
}

TEST(IoBaseline, Float16InputIsWidenedAsForHkForward) {
  ScratchDir dir;
  const std::string in = write_tricky_input(dir, "x16.h5", 4, 6, 8, io::DType::float16);
  expect_copy(dir, in, {"--chunk", "3"}, 2);
}

// One line "hk_io_baseline: error: ..." naming the input, exit 1, nothing created.
void expect_clean_failure(const ScratchDir& dir, const std::string& input, const std::string& output,
                          const std::string& mention) {
  const auto before = dir.entries();
  const ProcResult r = run_baseline(dir, {"--input", input, "--output", output});
  EXPECT_EQ(r.status, 1) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.rfind("hk_io_baseline: error: ", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "expected exactly one line: " << r.err;
  EXPECT_NE(r.err.find(mention), std::string::npos) << r.err;
  EXPECT_EQ(dir.entries(), before) << "files created or removed by a failed run";
}

TEST(IoBaseline, BadInputsGiveOneLineAndNoOutput) {
  ScratchDir dir;
  expect_clean_failure(dir, dir.path("missing.h5"), dir.path("y.h5"), "missing.h5");
  write_text_file(dir.path("text.h5"), "not an HDF5 file\n");
  expect_clean_failure(dir, dir.path("text.h5"), dir.path("y.h5"), "text.h5");

  // A file with /output but no /input.
  expect_copy(dir, g_sample, {}, 1);
  ASSERT_EQ(run_baseline(dir, {"--input", g_sample, "--output", dir.path("only_output.h5")}).status, 0);
  expect_clean_failure(dir, dir.path("only_output.h5"), dir.path("y.h5"), "/input");

  // A NaN in the last chunk: found while reading, after the output was created; the temporary
  // output must be gone.
  const std::string nan_in = write_tricky_input(dir, "nan.h5", 5, 4, 2, io::DType::float32);
  poke_float(nan_in, "/input/x", 5 * 4 * 2 - 1, std::nanf(""));
  const auto before = dir.entries();
  const ProcResult r = run_baseline(dir, {"--input", nan_in, "--output", dir.path("y.h5"), "--chunk", "2"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err.rfind("hk_io_baseline: error: ", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  EXPECT_NE(r.err.find("/input/x"), std::string::npos) << r.err;
  EXPECT_EQ(dir.entries(), before);

  // An output that is a directory, and the input itself as the output.
  std::filesystem::create_directories(dir.path("adir"));
  expect_clean_failure(dir, g_sample, dir.path("adir"), "directory");
  expect_clean_failure(dir, nan_in, nan_in, "same file");
}

TEST(IoBaseline, UsageErrorExits2) {
  ScratchDir dir;
  EXPECT_EQ(run_baseline(dir, {"--output", dir.path("y.h5")}).status, 2);
  EXPECT_EQ(run_baseline(dir, {"--input", g_sample, "--output", dir.path("y.h5"), "--chunk", "0"}).status, 2);
  EXPECT_TRUE(dir.entries().empty());
}

}  // namespace
}  // namespace hk::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <hk_io_baseline> <sample.h5> [gtest flags]\n", argv[0]);
    return 2;
  }
  hk::test::g_baseline = std::filesystem::absolute(argv[1]).string();
  hk::test::g_sample = std::filesystem::absolute(argv[2]).string();
  return RUN_ALL_TESTS();
}
