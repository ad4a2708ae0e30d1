// hk_forward's streaming: an input several times larger than --mem-cap runs within the cap
// (peak resident memory, VmHWM, printed by --stats) and gives the same bits as one chunk; the
// progress line shows the rate, the stages' shares and the ETA.
// usage: hk_cli_streaming_test <hk_forward> [gtest flags]
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "h5_test_util.hpp"
#include "process_util.hpp"

namespace hk::test {
namespace {

std::string g_forward;

// Model D=32 H=4 F=64 L=2 and an input of B sequences of S positions in one file.
void write_case(const std::string& path, int B, int S) {
  ModelConfig c;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_layers = 2;
  c.ffn_dim = 64;
  c.causal = true;
  io::write_model(path, synthetic_model(c, 7, true), {}, io::WriteMode::create);
  const std::vector<float> x = synthetic_input(B, S, c.d_model, 7);
  const std::vector<int32_t> len = synthetic_lengths(B, S, 7);
  io::write_input(path, B, S, c.d_model, x.data(), len.data(), io::DType::float32, io::WriteMode::append);
}

ProcResult forward(const ScratchDir& dir, std::vector<std::string> args) {
  args.insert(args.begin(), g_forward);
  return run_process(args, dir.path(""), dir.path("capture"));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// x is 4000 x 64 x 32 float32 = 32.8 MB; the cap is 8 MiB. The fixed part of the memory (program,
// libraries, weights) is measured on a one-sequence input of the same model; the capped run may
// add at most the cap to it (plus 4 MiB of allocator and BLAS slack). Without streaming the x
// alone would exceed that. Reference precision is bit-identical whatever the chunking, so the
// capped run must equal one chunk of the whole batch exactly.
TEST(Streaming, MemCapBoundsPeakMemoryAndMatchesOneChunk) {
#if defined(__SANITIZE_ADDRESS__)
  // Peak RSS there counts AddressSanitizer's shadow memory and quarantine, not hk's buffers.
  GTEST_SKIP() << "peak memory is not hk's own under AddressSanitizer (the plain build runs this test)";
#endif
  ScratchDir dir;
  const int B = 4000, S = 64;
  write_case(dir.path("big.h5"), B, S);
  write_case(dir.path("tiny.h5"), 1, S);
  const int64_t cap = int64_t(8) << 20;
  const std::vector<std::string> common = {"--backend", "kokkos", "--precision", "reference", "--stats", "--quiet"};
  auto args = [&](std::vector<std::string> a) {
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };

  const ProcResult base = forward(dir, args({"--input", "tiny.h5", "--output", "tiny_y.h5", "--mem-cap", "8M"}));
  ASSERT_EQ(base.status, 0) << base.err;
  const ProcResult capped = forward(dir, args({"--input", "big.h5", "--output", "capped.h5", "--mem-cap", "8M"}));
  ASSERT_EQ(capped.status, 0) << capped.err;
  const ProcResult whole =
      forward(dir, args({"--input", "big.h5", "--output", "whole.h5", "--batch-chunk", std::to_string(B)}));
  ASSERT_EQ(whole.status, 0) << whole.err;

  const double base_kib = stat_of(base.out, "peak_rss_kib"), capped_kib = stat_of(capped.out, "peak_rss_kib");
  const double whole_kib = stat_of(whole.out, "peak_rss_kib");
  ASSERT_GT(base_kib, 0) << base.out;
  ASSERT_GT(capped_kib, 0) << capped.out;
  EXPECT_GT(stat_of(capped.out, "chunks"), 10) << "the input was not cut into chunks: " << capped.out;
  EXPECT_EQ(stat_of(capped.out, "mem_cap"), double(cap)) << capped.out;
  const double limit_kib = base_kib + double(cap) / 1024 + 4096;
  EXPECT_LE(capped_kib, limit_kib) << "peak " << capped_kib << " KiB, fixed part " << base_kib << " KiB, cap "
                                   << cap / 1024 << " KiB";
  // The check can fail: one chunk of the whole batch needs far more.
  EXPECT_GT(whole_kib, limit_kib + 16 * 1024) << "the test input is too small to tell streaming apart";

  const io::OutputData a = io::read_output(dir.path("capped.h5")), b = io::read_output(dir.path("whole.h5"));
  ASSERT_EQ(a.B, B);
  EXPECT_TRUE(same_bits(a.y, b.y)) << "the streamed output differs from one chunk";
  EXPECT_EQ(b.attributes.at("batch_chunk"), std::to_string(B));
  EXPECT_EQ(a.attributes.at("batch_chunk"), std::to_string(int64_t(stat_of(capped.out, "chunk"))));
}

TEST(Streaming, MemCapTooSmallOrMalformedIsAnError) {
  ScratchDir dir;
  write_case(dir.path("in.h5"), 4, 64);
  for (const char* cap : {"1K", "-5", "lots", "0"}) {
    const ProcResult r = forward(dir, {"--input", "in.h5", "--output", "y.h5", "--backend", "kokkos", "--mem-cap", cap});
    EXPECT_EQ(r.status, 1) << cap << ": " << r.err;
    EXPECT_EQ(r.err_lines_starting("hk_forward: error: --mem-cap ").size(), 1u) << cap << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.path("y.h5")));
  }
}

// --chunk is --batch-chunk; --progress into a log prints one line per update with tokens/s,
// the busy share of read, compute and write, and the ETA; the last line is 100%.
TEST(Streaming, ChunkAliasAndProgressLine) {
  ScratchDir dir;
  write_case(dir.path("in.h5"), 12, 16);
  const ProcResult r = forward(dir, {"--input", "in.h5", "--output", "y.h5", "--backend", "kokkos", "--chunk", "5",
                                     "--progress", "--stats"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(stat_of(r.out, "chunk"), 5) << r.out;
  EXPECT_EQ(stat_of(r.out, "chunks"), 3) << r.out;
  const std::vector<std::string> lines = r.err_lines_starting("100%");
  ASSERT_EQ(lines.size(), 1u) << r.err;
  for (const char* part : {"tokens/s", "read ", "compute ", "write ", "ETA "})
    EXPECT_NE(lines[0].find(part), std::string::npos) << part << " missing in: " << lines[0];
  EXPECT_EQ(io::read_output(dir.path("y.h5")).attributes.at("batch_chunk"), "5");
}

// --engine-batch computes each chunk in pieces: reference precision gives the same bits as whole
// chunks (its rows do not depend on their neighbours); fp32 (blocked GEMMs over the rows: bits
// may differ) stays within 1e-4 of them; every position is computed (a missing piece would be
// zeros in the file); --stats reports the pieces.
TEST(Streaming, EngineBatchComputesChunksInPiecesWithTheSameBits) {
  ScratchDir dir;
  write_case(dir.path("in.h5"), 23, 16);
  auto run = [&](const char* precision, const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> a = {"--input", "in.h5", "--backend", "kokkos", "--precision", precision, "--batch-chunk",
                                  "10", "--stats", "--quiet", "--output", out};
    a.insert(a.end(), extra.begin(), extra.end());
    return forward(dir, a);
  };
  const ProcResult whole = run("reference", "whole.h5", {});
  ASSERT_EQ(whole.status, 0) << whole.err;
  EXPECT_EQ(stat_of(whole.out, "engine_batch"), 10) << whole.out;
  const ProcResult pieces = run("reference", "pieces.h5", {"--engine-batch", "3"});
  ASSERT_EQ(pieces.status, 0) << pieces.err;
  EXPECT_EQ(stat_of(pieces.out, "engine_batch"), 3) << pieces.out;
  EXPECT_EQ(stat_of(pieces.out, "chunk"), 10) << pieces.out;
  const io::OutputData a = io::read_output(dir.path("whole.h5")), b = io::read_output(dir.path("pieces.h5"));
  ASSERT_EQ(b.B, 23);
  EXPECT_TRUE(same_bits(a.y, b.y)) << "pieces of 3 differ from whole chunks of 10";

  const ProcResult fp32 = run("fp32", "fp32.h5", {"--engine-batch", "3"});
  ASSERT_EQ(fp32.status, 0) << fp32.err;
  const io::OutputData f = io::read_output(dir.path("fp32.h5"));
  ASSERT_EQ(f.y.size(), a.y.size());
  double worst = 0;
  int64_t nonzero = 0;
  for (size_t i = 0; i < a.y.size(); ++i) {
    worst = std::max(worst, double(std::fabs(f.y[i] - a.y[i])));
    nonzero += a.y[i] != 0.0f;
  }
  EXPECT_LE(worst, 1e-4) << "fp32 in pieces of 3 against reference in chunks of 10";
  EXPECT_GT(nonzero, int64_t(a.y.size() / 4)) << "the reference output is mostly zeros: the check could not fail";

  const ProcResult bigger = run("reference", "bigger.h5", {"--engine-batch", "50"});
  ASSERT_EQ(bigger.status, 0) << bigger.err;
  EXPECT_EQ(stat_of(bigger.out, "engine_batch"), 10) << "an engine batch above the chunk is the chunk";
  const ProcResult zero = forward(dir, {"--input", "in.h5", "--output", "z.h5", "--backend", "kokkos", "--engine-batch", "0"});
  EXPECT_EQ(zero.status, 2) << zero.err;
  EXPECT_FALSE(std::filesystem::exists(dir.path("z.h5")));
}

// HK_INPUT_BUFFERS sets how far the reader may run ahead, HK_WRITE_BACK when the disk write of
// each chunk starts (same output either way); a bad value is one clear error before anything is
// written. Run through env(1): the variable reaches only hk_forward.
TEST(Streaming, InputBufferAndWriteBackKnobs) {
  ScratchDir dir;
  write_case(dir.path("in.h5"), 12, 16);
  const std::vector<std::string> common = {g_forward, "--input", "in.h5", "--backend", "kokkos", "--precision",
                                           "reference", "--batch-chunk", "2", "--quiet"};
  for (const char* wb : {"inline", "off", "async"}) {
    const std::vector<std::string> a = {"/usr/bin/env", std::string("HK_WRITE_BACK=") + wb};
    std::vector<std::string> args = a;
    args.insert(args.end(), common.begin(), common.end());
    args.insert(args.end(), {"--output", std::string("wb-") + wb + ".h5"});
    const ProcResult r = run_process(args, dir.path(""), dir.path("capture"));
    ASSERT_EQ(r.status, 0) << wb << ": " << r.err;
    if (std::string(wb) != "inline")
      EXPECT_TRUE(same_bits(io::read_output(dir.path("wb-inline.h5")).y,
                            io::read_output(dir.path(std::string("wb-") + wb + ".h5")).y))
          << wb;
  }
  for (const char* bad : {"HK_WRITE_BACK=sometimes", "HK_HOST_HUGEPAGES=yes"}) {
    std::vector<std::string> args = {"/usr/bin/env", bad};
    args.insert(args.end(), common.begin(), common.end());
    args.insert(args.end(), {"--output", "wb-bad.h5"});
    const ProcResult r = run_process(args, dir.path(""), dir.path("capture"));
    EXPECT_EQ(r.status, 1) << bad << ": " << r.err;
    EXPECT_EQ(r.err_lines_starting("hk_forward: error: ").size(), 1u) << r.err;
    EXPECT_NE(r.err.find(std::string(bad).substr(0, std::string(bad).find('='))), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.path("wb-bad.h5")));
  }
  auto with = [&](const std::string& value, const std::string& out) {
    std::vector<std::string> a = {"/usr/bin/env", "HK_INPUT_BUFFERS=" + value};
    a.insert(a.end(), common.begin(), common.end());
    a.insert(a.end(), {"--output", out});
    return run_process(a, dir.path(""), dir.path("capture"));
  };
  const ProcResult two = with("auto", "two.h5"), five = with("5", "five.h5");
  ASSERT_EQ(two.status, 0) << two.err;
  ASSERT_EQ(five.status, 0) << five.err;
  EXPECT_TRUE(same_bits(io::read_output(dir.path("two.h5")).y, io::read_output(dir.path("five.h5")).y));
  for (const char* bad : {"1", "9", "many"}) {
    const ProcResult r = with(bad, "bad.h5");
    EXPECT_EQ(r.status, 1) << bad << ": " << r.err;
    EXPECT_EQ(r.err_lines_starting("hk_forward: error: HK_INPUT_BUFFERS=").size(), 1u) << bad << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.path("bad.h5")));
  }
}

}  // namespace
}  // namespace hk::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <hk_forward> [gtest flags]\n", argv[0]);
    return 2;
  }
  hk::test::g_forward = std::filesystem::absolute(argv[1]).string();
  return RUN_ALL_TESTS();
}
