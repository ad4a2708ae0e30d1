// hk_forward under mpirun: the ranks' output equals the one-process output bit for bit (the
// global chunk grid does not depend on the rank count), for even and uneven splits and for more
// ranks than chunks; a failing rank fails the job with its error and leaves no output; a job
// killed mid-run and started again gives the same file. Without MPI at build time, a launch of
// several copies is refused.
// usage: hk_mpi_test <mpirun> <hk_forward> <built with MPI: 0|1> [gtest flags]
// Exit code 77 when mpirun is missing.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <thread>

#include "h5_test_util.hpp"
#include "process_util.hpp"

namespace hk::test {
namespace {

std::string g_mpirun, g_forward;
bool g_have_mpi = false;

void write_case(const std::string& path, int B, int S, int D = 32) {
  ModelConfig c;
  c.d_model = D;
  c.n_heads = 4;
  c.n_layers = 2;
  c.ffn_dim = 2 * D;
  c.causal = true;
  io::write_model(path, synthetic_model(c, 11, true), {}, io::WriteMode::create);
  const std::vector<float> x = synthetic_input(B, S, c.d_model, 11);
  const std::vector<int32_t> len = synthetic_lengths(B, S, 11);
  io::write_input(path, B, S, c.d_model, x.data(), len.data(), io::DType::float32, io::WriteMode::append);
}

std::vector<std::string> mpirun(int np) {
  // --oversubscribe: more ranks than cores here; --bind-to none: ranks of a loaded 2-core CI
  // machine must not share one core by binding.
  return {g_mpirun, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np", std::to_string(np), g_forward};
}

// hk_forward in `dir` as `np` ranks (np = 0: one process without mpirun).
ProcResult forward(int np, const ScratchDir& dir, const std::vector<std::string>& args) {
  static ScratchDir capture;
  std::vector<std::string> a = np > 0 ? mpirun(np) : std::vector<std::string>{g_forward};
  a.insert(a.end(), args.begin(), args.end());
  return run_process(a, dir.path(""), capture.path("run"));
}

void expect_same_bits(const std::string& a_path, const std::string& b_path) {
  const io::OutputData a = io::read_output(a_path), b = io::read_output(b_path);
  ASSERT_EQ(a.B, b.B);
  ASSERT_EQ(a.S, b.S);
  ASSERT_EQ(a.D, b.D);
  ASSERT_EQ(a.y.size(), b.y.size());
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < a.y.size(); ++i)
    if (std::memcmp(&a.y[i], &b.y[i], sizeof(float)) != 0 && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << differ << " of " << a.y.size() << " elements differ, the first in sequence "
                        << first / (size_t(a.S) * a.D) << " (" << a_path << " vs " << b_path << ")";
  EXPECT_EQ(a.attributes.at("batch_chunk"), b.attributes.at("batch_chunk"));
}

class MpiOnly : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!g_have_mpi) GTEST_SKIP() << "hk_forward built without MPI";
  }
};

// fp32 on the kokkos backend is not batch-invariant (OpenBLAS sgemm blocks by rows): equal bits
// need every sequence computed in the same chunk as in one process.
struct Split {
  int B, chunk, np;
  const char* what;
};

class RanksEqualOneProcess : public ::testing::TestWithParam<Split> {
 protected:
  void SetUp() override {
    if (!g_have_mpi) GTEST_SKIP() << "hk_forward built without MPI";
  }
};

TEST_P(RanksEqualOneProcess, BitForBit) {
  const Split s = GetParam();
  ScratchDir dir;
  write_case(dir.path("in.h5"), s.B, 12);
  for (const char* precision : {"fp32", "reference"}) {
    std::vector<std::string> args = {"--input", "in.h5", "--backend", "kokkos", "--precision", precision, "--stats"};
    if (s.chunk > 0) args.insert(args.end(), {"--batch-chunk", std::to_string(s.chunk)});
    auto with_output = [&](const std::string& out) {
      std::vector<std::string> a = args;
      a.insert(a.end(), {"--output", out});
      return a;
    };
    const ProcResult one = forward(0, dir, with_output("one.h5"));
    ASSERT_EQ(one.status, 0) << one.err;
    const ProcResult many = forward(s.np, dir, with_output("many.h5"));
    ASSERT_EQ(many.status, 0) << many.err;
    expect_same_bits(dir.path("one.h5"), dir.path("many.h5"));
    EXPECT_EQ(io::read_output(dir.path("many.h5")).attributes.at("ranks"), std::to_string(s.np));
    // Every rank took part, and the chunks were dealt as the grid says.
    const int64_t chunk = s.chunk > 0 ? s.chunk : s.B, chunks = (s.B + chunk - 1) / chunk;
    int64_t local_total = 0;
    for (int r = 0; r < s.np; ++r) {
      const double local = stat_of(many.out, "local_chunks", r);
      ASSERT_GE(local, 0) << "no stats line of rank " << r << ": " << many.out;
      EXPECT_EQ(int64_t(local), chunks > r ? (chunks - r + s.np - 1) / s.np : 0) << "rank " << r;
      local_total += int64_t(local);
    }
    EXPECT_EQ(local_total, chunks);
    std::filesystem::remove(dir.path("one.h5"));
    std::filesystem::remove(dir.path("many.h5"));
  }
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"in.h5"}) << "temporary files left behind";
}

INSTANTIATE_TEST_SUITE_P(
    Splits, RanksEqualOneProcess,
    ::testing::Values(Split{12, 3, 2, "TwoRanksEvenly"}, Split{10, 3, 3, "ThreeRanksUneven"},
                      Split{4, 2, 3, "MoreRanksThanChunks"}, Split{5, 0, 2, "DefaultChunkOneChunkTwoRanks"},
                      Split{7, 1, 2, "OneSequencePerChunk"}),
    [](const ::testing::TestParamInfo<Split>& i) { return std::string(i.param.what); });

// Every HK_MPIIO_WRITE mode writes the same file: uneven chunks, and a rank without chunks
// (independent writes skip its empty write rounds). A value the knob does not take is an error
// naming it, with no output.
TEST_F(MpiOnly, EveryWriteModeGivesTheSameBits) {
  ScratchDir dir;
  write_case(dir.path("in.h5"), 10, 12);
  const std::vector<std::string> args = {"--input", "in.h5", "--backend", "kokkos", "--precision", "fp32",
                                         "--batch-chunk", "3"};
  auto with_output = [&](const std::string& out) {
    std::vector<std::string> a = args;
    a.insert(a.end(), {"--output", out});
    return a;
  };
  const ProcResult one = forward(0, dir, with_output("one.h5"));
  ASSERT_EQ(one.status, 0) << one.err;
  for (const char* mode : {"collective", "individual", "independent", "posix", "mmap"}) {
    for (const int np : {3, 5}) {  // 4 chunks: 5 ranks leave one without any
      ::setenv("HK_MPIIO_WRITE", mode, 1);
      const ProcResult many = forward(np, dir, with_output("many.h5"));
      ::unsetenv("HK_MPIIO_WRITE");
      ASSERT_EQ(many.status, 0) << mode << " " << np << " ranks: " << many.err;
      expect_same_bits(dir.path("one.h5"), dir.path("many.h5"));
      std::filesystem::remove(dir.path("many.h5"));
    }
  }
  ::setenv("HK_MPIIO_WRITE", "aggregated", 1);
  const ProcResult bad = forward(2, dir, with_output("many.h5"));
  ::unsetenv("HK_MPIIO_WRITE");
  EXPECT_NE(bad.status, 0);
  const auto lines = bad.err_lines_starting("hk_forward: error: ");
  ASSERT_EQ(lines.size(), 1u) << bad.err;
  EXPECT_NE(lines[0].find("HK_MPIIO_WRITE must be one of"), std::string::npos) << lines[0];
  std::filesystem::remove(dir.path("one.h5"));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"in.h5"}) << "output or temporary files left behind";
}

// An output directory that does not exist: one clean error line naming the output, exit 1,
// nothing created.
TEST_F(MpiOnly, UnwritableOutputFailsTheJobCleanly) {
  ScratchDir dir;
  write_case(dir.path("in.h5"), 6, 8);
  const std::string out = dir.path("missing/y.h5");
  const ProcResult r = forward(2, dir, {"--input", "in.h5", "--output", out, "--backend", "kokkos", "--quiet"});
  EXPECT_NE(r.status, 0) << r.err;
  const auto lines = r.err_lines_starting("hk_forward: error: ");
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0].rfind("hk_forward: error: " + out + ": /: cannot create", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("No such file or directory"), std::string::npos) << lines[0];
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"in.h5"});
}

// Two ranks where rank 1's file system refuses the paths containing `refuse` (refuse_open.c
// preloaded into rank 1 only: as a node with another view of the output directory), under a time
// limit: a job that hangs in a collective call ends with status 124.
ProcResult forward_refusing(const ScratchDir& dir, const std::string& refuse, const std::vector<std::string>& args) {
  static ScratchDir capture;
  std::vector<std::string> a = {"timeout", "120"};
  const std::vector<std::string> rank0 = mpirun(1);
  a.insert(a.end(), rank0.begin(), rank0.end());
  a.insert(a.end(), args.begin(), args.end());
  for (const std::string& v : {std::string(":"), std::string("-np"), std::string("1"), std::string("-x"),
                               std::string("LD_PRELOAD=") + HK_REFUSE_OPEN_LIB, std::string("-x"),
                               "HK_TEST_REFUSE_PATHS=" + refuse, g_forward})
    a.push_back(v);
  a.insert(a.end(), args.begin(), args.end());
  return run_process(a, dir.path(""), capture.path("run"));
}

// An output directory that only rank 1 cannot write: the ranks' check before anything collective
// finds it; one clean error line naming rank 1, exit 1, nothing created.
TEST_F(MpiOnly, OutputDirectoryOneRankCannotWriteFailsTheJobCleanly) {
  ScratchDir dir;
  write_case(dir.path("in.h5"), 6, 8);
  std::filesystem::create_directory(dir.path("out"));
  const ProcResult r = forward_refusing(dir, "out", {"--input", "in.h5", "--output", "out/y.h5", "--backend", "kokkos", "--quiet"});
  EXPECT_EQ(r.status, 1) << r.err;
  const auto lines = r.err_lines_starting("hk_forward: error: ");
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0], "hk_forward: error: out/y.h5: /: cannot create the temporary output file in out (Permission denied) (rank 1 of 2)");
  EXPECT_TRUE(std::filesystem::is_empty(dir.path("out")));
}

// The temporary file itself refused on rank 1 only (its directory passes the check): every rank
// opens it on its own before the collective MPI-IO create, so the job fails instead of hanging in
// that create (it did): one error line for the job with rank 1's reason, exit status 1, and rank 0
// removes the file it created.
TEST_F(MpiOnly, TemporaryFileOneRankCannotOpenFailsTheJobWithoutHanging) {
  ScratchDir dir;
  write_case(dir.path("in.h5"), 6, 8);
  const ProcResult r = forward_refusing(dir, ".h5.tmp.", {"--input", "in.h5", "--output", "y.h5", "--backend", "kokkos", "--quiet"});
  EXPECT_NE(r.status, 124) << "the job hung (stopped by its time limit)\n" << r.err;
  EXPECT_EQ(r.status, 1) << r.err;
  // Every rank fails the collective create with the same message; the job reports it once.
  const auto lines = r.err_lines_starting("hk_forward: error: ");
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0], "hk_forward: error: y.h5: /: cannot create the temporary output file y.h5.tmp.* on rank 1 "
                      "(Permission denied)") << lines[0];
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"in.h5"}) << "output or temporary files left behind";
}

// A NaN in a chunk of rank 1 only (chunk 1 of 1-sequence chunks). With the forked validation,
// rank 1's child (running just ahead of rank 1's reader) reports it mid-run; without it, rank 1's
// reader meets it itself. Either way rank 1 prints one clean error line and aborts the job while
// rank 0 writes; a previous file under the final name is untouched and no temporary file is left.
TEST_F(MpiOnly, FailingRankFailsTheJobAndLeavesNoOutput) {
  ScratchDir dir;
  write_case(dir.path("in.h5"), 8, 8);
  poke_float(dir.path("in.h5"), "/input/x", (5 * 8 + 3) * 32 + 4, std::numeric_limits<float>::quiet_NaN());
  const std::string previous = "the previous output";
  write_text_file(dir.path("y.h5"), previous);
  for (const bool fork_validate : {true, false}) {
    std::vector<std::string> args = {"--input", "in.h5", "--output", "y.h5", "--backend", "kokkos", "--batch-chunk", "1",
                                     "--quiet"};
    if (!fork_validate) args.push_back("--no-fork-validate");
    const ProcResult r = forward(2, dir, args);
    EXPECT_NE(r.status, 0) << r.err;
    // The failing rank's error, once. Rank 0, which mpirun then terminates (SIGTERM), may say so
    // ("interrupted; no output written (rank 0 of 2)") when its writes did not hold it inside a
    // collective call; nothing else.
    std::vector<std::string> lines;
    for (const std::string& l : r.err_lines_starting("hk_forward: error: "))
      if (l != "hk_forward: error: interrupted; no output written (rank 0 of 2)") lines.push_back(l);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_EQ(lines[0].rfind("hk_forward: error: in.h5: /input/x: expected finite values, found NaN at [5, 3, 4]", 0), 0u)
        << lines[0];
    EXPECT_NE(lines[0].find("(rank 1 of 2)"), std::string::npos) << lines[0];
    EXPECT_EQ(read_bytes(dir.path("y.h5")), previous) << "the final name changed";
    auto entries = dir.entries();
    std::sort(entries.begin(), entries.end());
    EXPECT_EQ(entries, (std::vector<std::string>{"in.h5", "y.h5"})) << "fork_validate " << fork_validate;
  }
}

// The processes whose parent is `parent` (from /proc/*/stat).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = slurp("/proc/" + name + "/stat");
    const size_t rp = stat.rfind(')');  // the command name may hold spaces
    char state = 0;
    int ppid = 0;
    if (rp != std::string::npos && std::sscanf(stat.c_str() + rp + 1, " %c %d", &state, &ppid) == 2 && ppid == parent)
      out.push_back(pid_t(std::stoi(name)));
  }
  return out;
}

// The job is stopped (SIGTERM to every rank, as Slurm does at a time limit; Open MPI's mpirun
// itself, signalled, follows SIGTERM with SIGKILL at once or not at all) while the
// temporary output is being written: nothing appears under the final name; started again, it
// produces the file of an uninterrupted one-process run, bit for bit.
//
// The ranks are signalled the moment the temporary file appears (it is created before the first
// chunk is written and removed only by the commit or the cleanup), not after a fixed delay, which a
// fast machine outran. Should a run still finish first, the batch is doubled and the job started
// again; a run that is never interrupted fails the test.
TEST_F(MpiOnly, KilledMidRunThenRestartedGivesTheSameOutput) {
  ScratchDir dir, capture;
  const std::vector<std::string> args = {"--input", "in.h5", "--backend", "kokkos", "--precision", "reference",
                                         "--batch-chunk", "1", "--quiet"};
  ProcResult killed;
  int batch = 2400;
  for (int attempt = 0; attempt < 3; ++attempt, batch *= 2) {
    std::filesystem::remove(dir.path("in.h5"));
    write_case(dir.path("in.h5"), batch, 128);
    std::vector<std::string> a = mpirun(2);
    a.insert(a.end(), args.begin(), args.end());
    a.insert(a.end(), {"--output", "y.h5"});
    const Proc p = start(a, dir.path(""), capture.path("killed"));
    bool seen = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!seen && std::chrono::steady_clock::now() < deadline && p.running()) {
      for (const auto& e : std::filesystem::directory_iterator(dir.dir()))
        if (e.path().filename().string().rfind("y.h5.tmp.", 0) == 0) seen = true;
      if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (seen) {
      const std::vector<pid_t> ranks = children_of(p.pid);
      ASSERT_EQ(ranks.size(), 2u) << "expected the 2 ranks as children of mpirun";
      for (const pid_t r : ranks) ASSERT_EQ(::kill(r, SIGTERM), 0);
    }
    killed = p.wait();
    if (killed.status != 0) {
      std::printf("interrupted at B=%d (run %d)\n", batch, attempt + 1);
      break;
    }
    // Finished before the signal (or before its temporary file was seen): no interruption was
    // tested; what it wrote goes, and a larger batch is tried.
    std::filesystem::remove(dir.path("y.h5"));
  }
  ASSERT_NE(killed.status, 0) << "every run finished before the signal, up to B=" << batch / 2 << ". " << killed.err;
  EXPECT_FALSE(killed.err_lines_starting("hk_forward: error: interrupted; no output written").empty()) << killed.err;
  EXPECT_FALSE(std::filesystem::exists(dir.path("y.h5"))) << "a file appeared under the final name: " << killed.status
                                                          << " " << killed.err;
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"in.h5"}) << "temporary files left behind";

  const ProcResult again = forward(2, dir, [&] {
    std::vector<std::string> b = args;
    b.insert(b.end(), {"--output", "y.h5"});
    return b;
  }());
  ASSERT_EQ(again.status, 0) << again.err;
  const ProcResult one = forward(0, dir, [&] {
    std::vector<std::string> b = args;
    b.insert(b.end(), {"--output", "one.h5"});
    return b;
  }());
  ASSERT_EQ(one.status, 0) << one.err;
  expect_same_bits(dir.path("one.h5"), dir.path("y.h5"));
}

// Built without MPI: several copies started by mpirun would each run the whole job; refused.
TEST(NoMpiBuild, SeveralCopiesAreRefused) {
  if (g_have_mpi) GTEST_SKIP() << "hk_forward built with MPI";
  ScratchDir dir;
  write_case(dir.path("in.h5"), 4, 8);
  const ProcResult r = forward(2, dir, {"--input", "in.h5", "--output", "y.h5", "--backend", "kokkos"});
  EXPECT_NE(r.status, 0);
  EXPECT_FALSE(r.err_lines_starting("hk_forward: error: started as 2 processes").empty()) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.path("y.h5")));
}

// Records whether every test that ran was skipped, for exit code 77.
class SkipCounter : public ::testing::EmptyTestEventListener {
 public:
  int ran = 0, skipped = 0;
  void OnTestEnd(const ::testing::TestInfo& t) override {
    ++ran;
    if (t.result()->Skipped()) ++skipped;
  }
};

}  // namespace
}  // namespace hk::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s <mpirun> <hk_forward> <built with MPI: 0|1> [gtest flags]\n", argv[0]);
    return 2;
  }
  hk::test::g_mpirun = argv[1];
  if (hk::test::g_mpirun.empty() || hk::test::g_mpirun.find("NOTFOUND") != std::string::npos ||
      ::access(hk::test::g_mpirun.c_str(), X_OK) != 0) {
    std::printf("mpirun not found (%s): skipped\n", argv[1]);
    return 77;
  }
  hk::test::g_forward = std::filesystem::absolute(argv[2]).string();
  hk::test::g_have_mpi = std::string(argv[3]) == "1";
  auto* counter = new hk::test::SkipCounter;
  ::testing::UnitTest::GetInstance()->listeners().Append(counter);
  const int rc = RUN_ALL_TESTS();
  if (rc == 0 && counter->ran > 0 && counter->ran == counter->skipped) return 77;
  return rc;
}
