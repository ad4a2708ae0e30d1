// The built hk_forward and hk_generate, run as a user runs them.
// usage: hk_cli_test <hk_forward> <hk_generate> <data dir> [gtest flags]
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>
#include <set>

#include "h5_test_util.hpp"
#include "naive_forward.hpp"

namespace hk::test {
namespace {

std::string g_forward, g_generate, g_data;

struct Result {
  int status = -1;  // exit status, or 128 + signal
  std::string out, err;
  std::vector<std::string> err_lines() const {
    std::vector<std::string> lines;
    size_t pos = 0;
    while (pos < err.size()) {
      const size_t nl = err.find('\n', pos);
      lines.push_back(err.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos));
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
    return lines;
  }
};

// Runs `args` in directory `cwd` with stdout/stderr captured (through files outside `cwd`).
Result run(const std::vector<std::string>& args, const std::string& cwd) {
  static ScratchDir capture;
  const std::string out_path = capture.path("stdout"), err_path = capture.path("stderr");
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls until exec
    if (::chdir(cwd.c_str()) != 0) ::_exit(126);
    const int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0) ::_exit(126);
    ::dup2(o, 1);
    ::dup2(e, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  Result r;
  int st = 0;
  if (pid < 0 || ::waitpid(pid, &st, 0) != pid) return r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = read_bytes(out_path);
  r.err = read_bytes(err_path);
  return r;
}

std::string sample() { return g_data + "/sample.h5"; }

// A failure as FORMAT.md wants it: exit 1 and exactly one line "hk_forward: error: <file>: <object>: ...".
void expect_one_line_error(const Result& r, const std::string& file, const std::string& object) {
  EXPECT_EQ(r.status, 1) << r.err;
  const auto lines = r.err_lines();
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0].rfind("hk_forward: error: " + file + ": " + object + ": ", 0), 0u) << lines[0];
}

// ---- hk_forward -------------------------------------------------------------------------------

TEST(HkForward, HelpAndVersion) {
  ScratchDir dir;
  const Result help = run({g_forward, "--help"}, dir.path(""));
  EXPECT_EQ(help.status, 0);
  for (const char* opt : {"--input", "--model", "--output", "--precision", "--backend", "--batch-chunk", "--quiet",
                          "--explain", "--version"})
    EXPECT_NE(help.out.find(opt), std::string::npos) << opt;
  const Result version = run({g_forward, "--version"}, dir.path(""));
  EXPECT_EQ(version.status, 0);
  EXPECT_EQ(version.out.rfind("hk_forward ", 0), 0u) << version.out;
  EXPECT_TRUE(dir.entries().empty());
}

TEST(HkForward, UsageErrorsExitTwo) {
  ScratchDir dir;
  EXPECT_EQ(run({g_forward, "--precision", "half"}, dir.path("")).status, 2);
  EXPECT_EQ(run({g_forward, "--batch-chunk", "0"}, dir.path("")).status, 2);
  EXPECT_EQ(run({g_forward, "--no-such-option"}, dir.path("")).status, 2);
  EXPECT_TRUE(dir.entries().empty());
}

TEST(HkForward, RunsTheSampleWithinTheBudget) {
  ScratchDir dir;
  const Result r = run({g_forward, "--input", sample(), "--output", "out.h5"}, dir.path(""));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << "stderr is not a terminal: no progress bar expected: " << r.err;
  EXPECT_NE(r.out.find("tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-> out.h5"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"out.h5"});

  const io::OutputData y = io::read_output(dir.path("out.h5"));
  EXPECT_EQ(y.B, 4);
  EXPECT_EQ(y.S, 16);
  EXPECT_EQ(y.D, 32);
  EXPECT_EQ(y.attributes.at("precision"), "fast");
  EXPECT_FALSE(y.attributes.at("backend").empty());
  EXPECT_FALSE(y.attributes.at("device").empty());
  EXPECT_EQ(y.attributes.at("program").rfind("hk_forward ", 0), 0u);
  EXPECT_FALSE(y.attributes.at("version").empty());
  EXPECT_EQ(y.attributes.at("input_file"), sample());
  EXPECT_EQ(y.attributes.at("model_file"), sample());

  // Against the float64 evaluation: the MODEL.md budget, padded positions exactly zero.
  const Model m = io::read_model(sample());
  io::InputFile in(sample(), m.config);
  std::vector<float> x(y.y.size());
  std::vector<int32_t> len(4);
  in.read(0, 4, x.data(), len.data());
  const std::vector<double> ref = naive_forward(m, std::vector<double>(x.begin(), x.end()), 4, 16, len);
  EXPECT_LE(budget_ratio(y.y.data(), ref), 1.0);
  for (int b = 0; b < 4; ++b)
    for (int s = len[size_t(b)]; s < 16; ++s)
      for (int d = 0; d < 32; ++d) ASSERT_EQ(y.y[(size_t(b) * 16 + s) * 32 + d], 0.0f);
}

TEST(HkForward, DefaultsToTheShippedSampleAndHkOut) {
  ScratchDir dir;
  const Result r = run({g_forward, "--quiet"}, dir.path(""));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.out.empty()) << "--quiet: " << r.out;
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"hk_out.h5"});
  EXPECT_EQ(io::read_output(dir.path("hk_out.h5")).B, 4);
}

class BatchChunk : public ::testing::TestWithParam<const char*> {};

// Chunking must not change a sequence's result beyond the rounding of the precision: float64
// (reference) is bit-identical whatever the chunk; in fp32 the host BLAS (OpenBLAS sgemm) picks
// its kernel by the number of rows in a call, so a row may round differently by an ulp or so.
TEST_P(BatchChunk, OneSequencePerChunkMatchesOneChunk) {
  ScratchDir dir;
  const Result one = run({g_forward, "--input", sample(), "--output", "one.h5", "--batch-chunk", "4", "--precision",
                          GetParam()},
                         dir.path(""));
  ASSERT_EQ(one.status, 0) << one.err;
  const Result many = run({g_forward, "--input", sample(), "--output", "many.h5", "--batch-chunk", "1",
                           "--precision", GetParam(), "--progress"},
                          dir.path(""));
  ASSERT_EQ(many.status, 0) << many.err;
  EXPECT_NE(many.err.find("100%"), std::string::npos) << "--progress: " << many.err;
  const io::OutputData a = io::read_output(dir.path("one.h5")), b = io::read_output(dir.path("many.h5"));
  ASSERT_EQ(a.y.size(), b.y.size());
  // Each sequence's result must not depend on which other sequences share its chunk.
  const bool exact = std::string(GetParam()) == "reference";
  const double tol = exact ? 0.0 : 1e-5;  // a few fp32 ulps of O(1) outputs
  size_t differ = 0;
  double max_diff = 0;
  std::string rows;
  for (size_t i = 0; i < a.y.size(); ++i)
    if (exact ? std::memcmp(&a.y[i], &b.y[i], sizeof(float)) != 0 : !(std::fabs(a.y[i] - b.y[i]) <= tol)) {
      const std::string row = std::to_string(i / (size_t(a.S) * a.D));
      if (differ++ == 0 || rows.substr(rows.rfind(' ') + 1) != row) rows += " " + row;
      max_diff = std::max(max_diff, double(std::fabs(a.y[i] - b.y[i])));
    }
  EXPECT_EQ(differ, 0u) << differ << " of " << a.y.size() << " elements differ (max |diff| " << max_diff
                        << ") in sequences" << rows << " (backend " << a.attributes.at("backend") << ")";
  EXPECT_EQ(b.attributes.at("batch_chunk"), "1");
}

INSTANTIATE_TEST_SUITE_P(Precisions, BatchChunk, ::testing::Values("fast", "fp32", "reference"));

// --trace: a Chrome trace-event file whose read, compute and write spans cover every chunk once,
// each on its own named thread, in order read < compute < write for a chunk, inside the run.
TEST(HkForward, TraceCoversEveryChunkOnItsThread) {
  ScratchDir dir;
  const Result r = run({g_forward, "--input", sample(), "--output", "y.h5", "--batch-chunk", "1", "--trace",
                        "run.json", "--quiet"},
                       dir.path(""));
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(read_bytes(dir.path("run.json")));
  const io::OutputData y = io::read_output(dir.path("y.h5"));
  std::map<int, std::string> thread;
  std::map<std::string, std::map<int64_t, std::pair<double, double>>> span;  // name -> chunk -> [begin, end)
  std::map<std::string, std::set<int>> tids;
  double last_end = 0;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name") thread[e.at("tid").get<int>()] = e.at("args").at("name");
    if (e.at("ph") != "X") continue;
    const double b = e.at("ts").get<double>(), d = e.at("dur").get<double>();
    EXPECT_GE(b, 0.0);
    EXPECT_GE(d, 0.0);
    last_end = std::max(last_end, b + d);
    const std::string name = e.at("name");
    tids[name].insert(e.at("tid").get<int>());
    if (e.contains("args") && e.at("args").contains("chunk")) {
      const int64_t k = e.at("args").at("chunk");
      EXPECT_EQ(span[name].count(k), 0u) << name << " chunk " << k << " twice";
      span[name][k] = {b, b + d};
    }
  }
  for (const char* stage : {"read", "compute", "write"}) {
    ASSERT_EQ(span[stage].size(), size_t(y.B)) << stage;
    ASSERT_EQ(tids[stage].size(), 1u) << stage << " on several threads";
  }
  EXPECT_EQ(thread[*tids["read"].begin()], "reader");
  EXPECT_EQ(thread[*tids["write"].begin()], "writer");
  EXPECT_NE(*tids["compute"].begin(), *tids["read"].begin());
  for (int64_t k = 0; k < y.B; ++k) {
    EXPECT_LE(span["read"][k].second, span["compute"][k].first) << "chunk " << k;
    EXPECT_LE(span["compute"][k].second, span["write"][k].first) << "chunk " << k;
  }
  ASSERT_EQ(span["commit (fsync, rename)"].size(), 0u);  // not per chunk
  EXPECT_EQ(tids["commit (fsync, rename)"].size(), 1u);
  EXPECT_GT(last_end, 0.0);
  // An unwritable trace path: the run still succeeds (its output is committed), with a warning.
  const Result bad = run({g_forward, "--input", sample(), "--output", "y2.h5", "--trace", "missing/run.json",
                          "--quiet"},
                         dir.path(""));
  EXPECT_EQ(bad.status, 0) << bad.err;
  EXPECT_NE(bad.err.find("hk_forward: warning: --trace: cannot create missing/run.json"), std::string::npos) << bad.err;
  EXPECT_TRUE(std::filesystem::exists(dir.path("y2.h5")));
}

TEST(HkForward, BadModelGivesOneLineAndNoOutput) {
  ScratchDir dir;
  const std::string bad = dir.path("bad.h5");
  std::filesystem::copy_file(sample(), bad);
  poke_float(bad, "/model/layers/1/ffn_in/weight", 5, std::numeric_limits<float>::infinity());
  const Result r = run({g_forward, "--input", bad, "--output", "out.h5"}, dir.path(""));
  expect_one_line_error(r, bad, "/model/layers/1/ffn_in/weight");
  EXPECT_NE(r.err.find("+Inf at [0, 5]"), std::string::npos) << r.err;
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"bad.h5"});
}

TEST(HkForward, BadInputInALaterChunkLeavesThePreviousOutputUntouched) {
  ScratchDir dir;
  const std::string bad = dir.path("bad.h5");
  std::filesystem::copy_file(sample(), bad);
  poke_float(bad, "/input/x", (3 * 16 + 2) * 32 + 1, std::numeric_limits<float>::quiet_NaN());
  write_text_file(dir.path("out.h5"), "the previous output");
  const Result r = run({g_forward, "--input", bad, "--output", "out.h5", "--batch-chunk", "1"}, dir.path(""));
  expect_one_line_error(r, bad, "/input/x");
  EXPECT_NE(r.err.find("NaN at [3, 2, 1]"), std::string::npos) << r.err;
  EXPECT_EQ(read_bytes(dir.path("out.h5")), "the previous output");
  auto entries = dir.entries();
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"bad.h5", "out.h5"}));
}

TEST(HkForward, BadFileClasses) {
  ScratchDir dir;
  const std::string bad = dir.path("bad.h5");
  auto fresh = [&] { std::filesystem::copy_file(sample(), bad, std::filesystem::copy_options::overwrite_existing); };
  auto check = [&](const std::string& object, const std::string& phrase) {
    const Result r = run({g_forward, "--input", bad, "--output", "out.h5"}, dir.path(""));
    expect_one_line_error(r, bad, object);
    EXPECT_NE(r.err.find(phrase), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.path("out.h5")));
  };
  fresh();
  remove_link(bad, "/model/layers/0/attn/v_proj/weight");
  check("/model/layers/0/attn/v_proj/weight", "found no such object");
  fresh();
  set_int_attribute(bad, "/model", "n_heads", 5);
  check("/model", "multiple of n_heads");
  fresh();
  set_string_attribute(bad, "/model", "causal", "yes");
  check("/model", "attribute 'causal': expected an integer, found a string");
  fresh();
  replace_dataset(bad, "/input/lengths", H5T_STD_I32LE, {4}, {1, 17, 3, 4});
  check("/input/lengths", "expected values in 0..16, found 17 at [1]");
  fresh();
  replace_dataset(bad, "/input/x", H5T_IEEE_F32LE, {4, 16, 24}, std::vector<double>(4 * 16 * 24, 0.5));
  check("/input/x", "(d_model of the model)");
  write_text_file(bad, "not hdf5");
  check("/", "without the HDF5 signature");
  const Result missing = run({g_forward, "--input", dir.path("missing.h5")}, dir.path(""));
  expect_one_line_error(missing, dir.path("missing.h5"), "/");
}

TEST(HkForward, OutputMustNotBeTheInput) {
  ScratchDir dir;
  const std::string in = dir.path("in.h5");
  std::filesystem::copy_file(sample(), in);
  const std::string before = read_bytes(in);
  const Result r = run({g_forward, "--input", in, "--output", in}, dir.path(""));
  expect_one_line_error(r, in, "/");
  EXPECT_EQ(read_bytes(in), before);
}

TEST(HkForward, ExplainComputesNothing) {
  ScratchDir dir;
  const Result r = run({g_forward, "--input", sample(), "--output", "out.h5", "--explain"}, dir.path(""));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("backend"), std::string::npos) << r.out;
  EXPECT_TRUE(dir.entries().empty());
}

TEST(HkForward, UnknownOrUnusableBackendIsAnError) {
  ScratchDir dir;
  const Result r = run({g_forward, "--input", sample(), "--output", "out.h5", "--backend", "cuda"}, dir.path(""));
  if (r.status == 0) {  // a GPU build on a GPU machine
    EXPECT_EQ(io::read_output(dir.path("out.h5")).attributes.at("backend"), "cuda");
  } else {
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.err_lines().size(), 1u) << r.err;
    EXPECT_EQ(r.err.rfind("hk_forward: error: ", 0), 0u) << r.err;
    EXPECT_TRUE(dir.entries().empty());
  }
}

// ---- hk_generate ------------------------------------------------------------------------------

TEST(HkGenerate, CaseWithSmallerBatchThenForward) {
  ScratchDir dir;
  const Result g = run({g_generate, "--case", "4", "--batch", "2", "--output", "c4.h5", "--lengths-list", "0,S"},
                       dir.path(""));
  ASSERT_EQ(g.status, 0) << g.err;
  const Model m = io::read_model(dir.path("c4.h5"));
  EXPECT_EQ(m.config.d_model, 64);
  EXPECT_EQ(m.config.n_heads, 4);
  EXPECT_EQ(m.config.ffn_dim, 64);
  EXPECT_EQ(m.config.n_layers, 4);
  EXPECT_TRUE(m.config.causal);
  io::InputFile in(dir.path("c4.h5"), m.config);
  EXPECT_EQ(in.batch(), 2);
  EXPECT_EQ(in.seq_len(), 128);
  std::vector<float> x(size_t(2) * 128 * 64);
  std::vector<int32_t> len(2);
  in.read(0, 2, x.data(), len.data());
  EXPECT_EQ(len, (std::vector<int32_t>{0, 128}));
  const Result f = run({g_forward, "--input", "c4.h5", "--output", "y.h5", "--quiet"}, dir.path(""));
  EXPECT_EQ(f.status, 0) << f.err;
}

TEST(HkGenerate, SeparateFilesAndDtypes) {
  ScratchDir dir;
  const Result g = run({g_generate, "--batch", "3", "--seq", "5", "--d-model", "16", "--heads", "2", "--ffn", "24",
                        "--layers", "1", "--causal", "0", "--weights-dtype", "float16", "--input-dtype", "float16",
                        "--no-lengths", "--model-output", "m.h5", "--input-output", "i.h5", "--seed", "9"},
                       dir.path(""));
  ASSERT_EQ(g.status, 0) << g.err;
  const Model m = io::read_model(dir.path("m.h5"));
  EXPECT_FALSE(m.config.causal);
  for (double v : m.layers[0].q_w) ASSERT_EQ(v, io::half_to_double(io::double_to_half(v)));  // float16 values
  io::InputFile in(dir.path("i.h5"), m.config);
  EXPECT_FALSE(in.has_lengths());
  EXPECT_EQ(in.x_type(), io::DType::float16);
  const Result f = run({g_forward, "--input", "i.h5", "--model", "m.h5", "--output", "y.h5", "--quiet"}, dir.path(""));
  EXPECT_EQ(f.status, 0) << f.err;
}

TEST(HkGenerate, SameSeedSameBytes) {
  ScratchDir dir;
  const std::vector<std::string> common = {"--batch", "2", "--seq", "4", "--d-model", "8", "--heads", "2"};
  auto gen = [&](const std::string& out, const std::string& seed) {
    std::vector<std::string> a = {g_generate};
    a.insert(a.end(), common.begin(), common.end());
    a.insert(a.end(), {"--output", out, "--seed", seed});
    return run(a, dir.path("")).status;
  };
  ASSERT_EQ(gen("a.h5", "3"), 0);
  ASSERT_EQ(gen("b.h5", "3"), 0);
  ASSERT_EQ(gen("c.h5", "4"), 0);
  EXPECT_EQ(read_bytes(dir.path("a.h5")), read_bytes(dir.path("b.h5")));
  EXPECT_NE(read_bytes(dir.path("a.h5")), read_bytes(dir.path("c.h5")));
}

TEST(HkGenerate, Errors) {
  ScratchDir dir;
  const Result bad = run({g_generate, "--batch", "2", "--seq", "4", "--d-model", "10", "--heads", "4", "--output",
                          "x.h5"},
                         dir.path(""));
  EXPECT_EQ(bad.status, 1);
  EXPECT_EQ(bad.err_lines().size(), 1u) << bad.err;
  EXPECT_NE(bad.err.find("multiple of n_heads"), std::string::npos) << bad.err;
  const Result no_case = run({g_generate, "--case", "99", "--output", "x.h5"}, dir.path(""));
  EXPECT_EQ(no_case.status, 1);
  EXPECT_NE(no_case.err.find("no case 99"), std::string::npos) << no_case.err;
  const Result lengths = run({g_generate, "--batch", "2", "--seq", "4", "--d-model", "8", "--heads", "2",
                              "--lengths-list", "1,5", "--output", "x.h5"},
                             dir.path(""));
  EXPECT_EQ(lengths.status, 1);
  EXPECT_NE(lengths.err.find("found 5"), std::string::npos) << lengths.err;
  EXPECT_EQ(run({g_generate, "--case", "1"}, dir.path("")).status, 1);  // nothing to write
  EXPECT_EQ(run({g_generate, "--causal", "2"}, dir.path("")).status, 2);
  EXPECT_EQ(run({g_generate, "--help"}, dir.path("")).status, 0);
  EXPECT_TRUE(dir.entries().empty());
}

}  // namespace
}  // namespace hk::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s <hk_forward> <hk_generate> <data dir> [gtest flags]\n", argv[0]);
    return 2;
  }
  // Absolute: the programs run with another working directory.
  hk::test::g_forward = std::filesystem::absolute(argv[1]).string();
  hk::test::g_generate = std::filesystem::absolute(argv[2]).string();
  hk::test::g_data = std::filesystem::absolute(argv[3]).lexically_normal().string();
  return RUN_ALL_TESTS();
}
