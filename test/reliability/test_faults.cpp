// Faults and determinism of the built hk_forward, run as a batch queue runs it: an unwritable
// output directory, a full disk, kill -9 in the middle of the write, and bit-identical output
// run to run. usage: hk_reliability_faults <hk_forward> [gtest flags]
// Exit code 77 (ctest SKIP_RETURN_CODE) when every test that ran was skipped, e.g. the disk-full
// test where no tmpfs can be mounted.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <cstring>
#include <thread>

#include "h5_test_util.hpp"

namespace hk::test {
namespace {

std::string g_forward;

struct Result {
  int status = -1;  // exit status, or 128 + signal
  std::string err;
};

// hk_forward with `args`; as an unprivileged user when `drop_root` and running as root (root
// writes into a mode-0555 directory regardless of its mode).
// `keep_segv`: a sanitizer build must not catch the SIGSEGV of the test (it would abort instead).
// `fsize_limit` > 0: RLIMIT_FSIZE of the child in bytes (a write past it fails with EFBIG once
// SIGXFSZ is ignored, as hk_forward does).
pid_t spawn(const std::vector<std::string>& args, const std::string& err_path, bool drop_root = false,
            bool keep_segv = false, rlim_t fsize_limit = 0) {
  const char* asan = std::getenv("ASAN_OPTIONS");
  const std::string asan_options = std::string(asan ? asan : "") + (asan && *asan ? ":" : "") + "handle_segv=0";
  std::vector<std::string> full = {g_forward};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (const std::string& a : full) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    const int o = ::open("/dev/null", O_WRONLY);
    if (e < 0 || o < 0) ::_exit(126);
    ::dup2(o, 1);
    ::dup2(e, 2);
    if (keep_segv) ::setenv("ASAN_OPTIONS", asan_options.c_str(), 1);
    if (fsize_limit > 0) {
      const struct rlimit lim = {fsize_limit, fsize_limit};
      if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(124);
    }
    if (drop_root && ::getuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(125);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

Result wait_for(pid_t pid, const std::string& err_path) {
  Result r;
  int st = 0;
  if (pid > 0 && ::waitpid(pid, &st, 0) == pid) r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.err = read_bytes(err_path);
  return r;
}

Result run(const std::vector<std::string>& args, const std::string& err_path, bool drop_root = false) {
  return wait_for(spawn(args, err_path, drop_root), err_path);
}

// A model + input file with B sequences of S positions (model D=32, 2 layers).
void write_case(const std::string& path, int B, int S) {
  ModelConfig c;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_layers = 2;
  c.ffn_dim = 64;
  c.causal = true;
  io::write_model(path, synthetic_model(c, 5, true), {}, io::WriteMode::create);
  const std::vector<float> x = synthetic_input(B, S, c.d_model, 5);
  const std::vector<int32_t> len = synthetic_lengths(B, S, 5);
  io::write_input(path, B, S, c.d_model, x.data(), len.data(), io::DType::float32, io::WriteMode::append);
}

int line_count(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

TEST(Faults, UnwritableOutputDirectory) {
  ScratchDir dir;
  write_case(dir.path("in.h5"), 4, 8);
  ASSERT_EQ(::chmod(dir.path("").c_str(), 0755), 0);
  ASSERT_EQ(::chmod(dir.path("in.h5").c_str(), 0644), 0);
  const std::string out_dir = dir.path("ro");
  std::filesystem::create_directories(out_dir);
  ASSERT_EQ(::chmod(out_dir.c_str(), 0555), 0);
  const std::string err = "/tmp/hk_faults_err." + std::to_string(::getpid());
  const Result r = run({"--input", dir.path("in.h5"), "--output", out_dir + "/y.h5", "--backend", "kokkos", "--quiet"},
                       err, /*drop_root=*/true);
  ::unlink(err.c_str());
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(line_count(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("hk_forward: error: " + out_dir + "/y.h5", 0), 0u) << r.err;
  EXPECT_TRUE(std::filesystem::is_empty(out_dir)) << "something was created in the unwritable directory";
  ::chmod(out_dir.c_str(), 0755);
}

// A real ENOSPC: a 64 KiB tmpfs (needs root and mount(2); skipped otherwise). The output of
// 64 x 32 x 32 floats (256 KiB) cannot fit; a previous file under the final name must survive.
TEST(Faults, DiskFull) {
  ScratchDir dir;
  write_case(dir.path("in.h5"), 64, 32);
  const std::string mnt = dir.path("full");
  std::filesystem::create_directories(mnt);
  if (::getuid() != 0 || ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64k") != 0)
    GTEST_SKIP() << "no tmpfs mount here (needs root and CAP_SYS_ADMIN): disk full not exercised";
  const std::string previous = "previous output, must stay";
  write_text_file(mnt + "/y.h5", previous);
  const Result r = run({"--input", dir.path("in.h5"), "--output", mnt + "/y.h5", "--backend", "kokkos", "--quiet"},
                       dir.path("err"));
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(mnt)) left.push_back(e.path().filename().string());
  const std::string kept = read_bytes(mnt + "/y.h5");
  ::umount(mnt.c_str());
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(line_count(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("hk_forward: error: " + mnt + "/y.h5", 0), 0u) << r.err;
  EXPECT_EQ(kept, previous) << "the previous output was touched";
  EXPECT_EQ(left, std::vector<std::string>{"y.h5"}) << "a temporary file was left on the full disk";
}

// A file-size limit (ulimit -f, a batch system's per-job limit) reached while writing y: an
// EFBIG write, not a SIGXFSZ kill. Needs no privilege: one error line naming the output and
// /output/y, exit 1, the previous output under the final name untouched, no temporary file left.
TEST(Faults, FileSizeLimitDuringWrite) {
  ScratchDir dir;
  write_case(dir.path("in.h5"), 64, 32);  // y: 64 x 32 x 32 floats = 256 KiB
  const std::string out = dir.path("out");
  std::filesystem::create_directories(out);
  const std::string previous = "previous output, must stay";
  write_text_file(out + "/y.h5", previous);
  const Result r = wait_for(spawn({"--input", dir.path("in.h5"), "--output", out + "/y.h5", "--backend", "kokkos",
                                   "--batch-chunk", "8", "--quiet"},
                                  dir.path("err"), false, false, /*fsize_limit=*/128 * 1024),
                            dir.path("err"));
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(out)) left.push_back(e.path().filename().string());
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(line_count(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("hk_forward: error: " + out + "/y.h5: /output/y: cannot write rows", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("File too large"), std::string::npos) << r.err;
  EXPECT_EQ(read_bytes(out + "/y.h5"), previous) << "the previous output was touched";
  EXPECT_EQ(left, std::vector<std::string>{"y.h5"}) << "a temporary file was left behind";
}

// kill -9 while the temporary output exists (chunk of 1 sequence: many writes): nothing under
// the final name changes. The temporary file is left behind (nothing survives SIGKILL to
// remove it) but it never carries the final name.
TEST(Faults, KillNineDuringWrite) {
  ScratchDir dir;
  // About 1.1 s of work here (one process, 2 cores): the kill, 50 ms into the write, lands well
  // before the end even on a loaded machine.
  write_case(dir.path("in.h5"), 6000, 48);
  const std::string out = dir.path("y.h5"), previous = "previous output, must stay";
  write_text_file(out, previous);
  const pid_t pid =
      spawn({"--input", dir.path("in.h5"), "--output", out, "--backend", "kokkos", "--precision", "reference",
             "--batch-chunk", "1", "--quiet"},
            dir.path("err"));
  const std::string temp = out + ".tmp." + std::to_string(pid);
  bool seen = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!seen && std::chrono::steady_clock::now() < deadline) {
    std::error_code ec;
    seen = std::filesystem::exists(temp, ec) && std::filesystem::file_size(temp, ec) > 0;
    if (!seen) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) FAIL() << "hk_forward ended before its output was seen: " << st;
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  }
  ASSERT_TRUE(seen) << "no temporary output within 60 s";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a few chunks into the write
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  const Result r = wait_for(pid, dir.path("err"));
  ASSERT_EQ(r.status, 128 + SIGKILL) << "finished before the kill; enlarge the input. " << r.err;
  EXPECT_EQ(read_bytes(out), previous) << "the final name changed";
  // And with no previous file: the final name does not appear at all.
  std::filesystem::remove(out);
  const pid_t pid2 =
      spawn({"--input", dir.path("in.h5"), "--output", out, "--backend", "kokkos", "--precision", "reference",
             "--batch-chunk", "1", "--quiet"},
            dir.path("err"));
  const std::string temp2 = out + ".tmp." + std::to_string(pid2);
  std::error_code ec;
  while (!std::filesystem::exists(temp2, ec) && std::chrono::steady_clock::now() < deadline + std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::kill(pid2, SIGKILL);
  const Result r2 = wait_for(pid2, dir.path("err"));
  EXPECT_EQ(r2.status, 128 + SIGKILL) << r2.err;
  EXPECT_FALSE(std::filesystem::exists(out)) << "a file appeared under the final name";
}

// The first child process of `parent` (from /proc/*/stat), or -1.
pid_t child_of(pid_t parent) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_bytes("/proc/" + name + "/stat");
    const size_t rp = stat.rfind(')');  // the command name may hold spaces
    if (rp == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(stat.c_str() + rp + 1, " %c %d", &state, &ppid) == 2 && ppid == parent) return std::stoi(name);
  }
  return -1;
}

// A crash inside libhdf5 while the forked child reads the input becomes one clean error line.
// No crafted file crashes every libhdf5 version, so the crash is made: the input is a FIFO that
// nobody writes, the child blocks opening it, and the test kills that child with SIGSEGV.
TEST(Faults, LibraryCrashInChild) {
  ScratchDir dir;
  const std::string fifo = dir.path("in.h5");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const pid_t pid = spawn({"--input", fifo, "--output", dir.path("y.h5"), "--backend", "kokkos", "--quiet"},
                          dir.path("err"), false, /*keep_segv=*/true);
  pid_t child = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((child = child_of(pid)) < 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (child < 0) ::kill(pid, SIGKILL);
  ASSERT_GT(child, 0) << "hk_forward forked no validation child";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // into the blocking open
  ASSERT_EQ(::kill(child, SIGSEGV), 0);
  const Result r = wait_for(pid, dir.path("err"));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err, "hk_forward: error: " + fifo + ": the HDF5 library crashed while reading it (signal " +
                       std::to_string(SIGSEGV) + ")\n");
  EXPECT_EQ(dir.entries(), std::vector<std::string>({"err", "in.h5"})) << "an output was created";

  // --no-fork-validate skips the child and still validates in-process.
  ScratchDir ok;
  write_case(ok.path("in.h5"), 2, 4);
  const Result r2 = run({"--input", ok.path("in.h5"), "--output", ok.path("y.h5"), "--backend", "kokkos",
                         "--no-fork-validate", "--quiet"},
                        ok.path("err"));
  EXPECT_EQ(r2.status, 0) << r2.err;
  std::vector<float> x(2 * 4 * 32, 0.0f);
  x[7] = std::numeric_limits<float>::infinity();
  io::write_input(ok.path("in.h5"), 2, 4, 32, x.data(), nullptr, io::DType::float32, io::WriteMode::create);
  write_case(ok.path("model.h5"), 1, 1);
  for (const bool fork_validate : {true, false}) {
    std::vector<std::string> args = {"--input", ok.path("in.h5"), "--model", ok.path("model.h5"), "--output",
                                     ok.path("y2.h5"), "--backend", "kokkos", "--quiet"};
    if (!fork_validate) args.push_back("--no-fork-validate");
    const Result r3 = run(args, ok.path("err"));
    EXPECT_EQ(r3.status, 1) << r3.err;
    EXPECT_EQ(line_count(r3.err), 1) << r3.err;
    EXPECT_EQ(r3.err.rfind("hk_forward: error: " + ok.path("in.h5") + ": /input/x: ", 0), 0u) << r3.err;
    EXPECT_FALSE(std::filesystem::exists(ok.path("y2.h5")));
  }
}

// A file the contract fuzzer found that crashes libhdf5 1.10.8 itself (a corrupt global-heap
// length behind the /model "format" string attribute: H5Aread -> H5HG_read copies wild memory).
// hk_forward must end with one clean error line; a libhdf5 without the bug gives a contract
// error instead, equally fine. Under AddressSanitizer the child prints the sanitizer's report
// first (it catches the bad memcpy before the crash), so only the last line is checked there.
TEST(Faults, Libhdf5CrashFileFromFuzzer) {
  ScratchDir dir;
  const std::string file = std::string(HK_RELIABILITY_DATA) + "/libhdf5_crash_vlen_attribute.h5";
  const Result r = run({"--input", file, "--output", dir.path("y.h5"), "--backend", "kokkos", "--quiet"},
                       dir.path("err"));
  EXPECT_EQ(r.status, 1) << r.err;
  std::string last = r.err;
  const size_t cut = last.rfind('\n', last.size() >= 2 ? last.size() - 2 : 0);
#if defined(__SANITIZE_ADDRESS__)
  if (cut != std::string::npos) last = last.substr(cut + 1);
#else
  EXPECT_EQ(line_count(r.err), 1) << r.err;
  (void)cut;
#endif
  EXPECT_EQ(last.rfind("hk_forward: error: " + file + ": ", 0), 0u) << r.err;
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"err"}) << "an output was created";
}

// A file the fuzzer found on which libhdf5 1.10.8 loops forever (H5Aread -> H5HG_read of a
// corrupt global heap): the validation child is killed after --validate-timeout seconds without
// progress and hk_forward ends with one clean error line instead of hanging the batch job. (A
// libhdf5 without the bug gives a contract error instead.)
TEST(Faults, Libhdf5HangFileFromFuzzer) {
  ScratchDir dir;
  const std::string file = std::string(HK_RELIABILITY_DATA) + "/libhdf5_hang_vlen_attribute.h5";
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run({"--input", file, "--output", dir.path("y.h5"), "--backend", "kokkos", "--quiet",
                        "--validate-timeout", "3"},
                       dir.path("err"));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(line_count(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("hk_forward: error: " + file + ": ", 0), 0u) << r.err;
  EXPECT_LT(s, 60.0);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"err"}) << "an output was created";
}

// The value of `key=` in a --stats line, or -1.
double stat_value(const std::string& text, const std::string& key) {
  const size_t p = text.find(" " + key + "=");
  return p == std::string::npos ? -1.0 : std::atof(text.c_str() + p + key.size() + 2);
}

// The forked validation runs ahead of the pipeline instead of before it, and stays a gate: the
// reader never reads a chunk the child has not survived going through.
// 1. A NaN in a late chunk (small chunks, small child blocks), x with the deflate filter: the
//    child reads and checks the values; its clean error ends the run, nothing is written, and
//    the reader had read only rows the child had validated, none of the bad chunk (--stats
//    prints how far each side got when the run fails). The same NaN in x without filters: the
//    child walks the chunk index instead of reading the values again, and the reader's own check
//    finds it: the same one error line, nothing written, still no row read before the child
//    went through it.
// 2. (deflate) The child is let run in 1 ms steps (SIGSTOP / SIGCONT) until hk_forward has
//    created its temporary output: the pipeline started while x was only partly validated (the
//    overlap). The child is then killed mid-x, as a crash inside libhdf5 would: one clean error
//    line, exit 1, the temporary output removed, and the reader stopped behind the child.
TEST(Faults, ValidationRunsAheadOfTheReader) {
  ScratchDir dir;
  const int B = 4000, S = 64, bad = 3900;
  write_case(dir.path("plain.h5"), B, S);
  poke_float(dir.path("plain.h5"), "/input/x", (int64_t(bad) * S + 5) * 32 + 7, std::numeric_limits<float>::quiet_NaN());
  write_case(dir.path("in.h5"), B, S);
  deflate_x(dir.path("in.h5"), 16);
  poke_float(dir.path("in.h5"), "/input/x", (int64_t(bad) * S + 5) * 32 + 7, std::numeric_limits<float>::quiet_NaN());
  for (const bool filtered : {true, false}) {
    SCOPED_TRACE(filtered ? "x with the deflate filter" : "x without filters");
    const std::string input = dir.path(filtered ? "in.h5" : "plain.h5");
    // --mem-cap 16M: the child gets 2 MiB, blocks of about 85 sequences.
    const std::vector<std::string> common = {"--input", input, "--backend", "kokkos", "--precision", "fp32",
                                             "--batch-chunk", "16", "--mem-cap", "16M", "--stats", "--quiet"};
    {
      std::vector<std::string> args = common;
      args.insert(args.end(), {"--output", dir.path("y.h5")});
      const std::string out_path = dir.path("stdout");
      std::vector<std::string> full = {g_forward};
      full.insert(full.end(), args.begin(), args.end());
      const pid_t pid = ::fork();
      if (pid == 0) {
        const int e = ::open(dir.path("err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
        const int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
        if (e < 0 || o < 0) ::_exit(126);
        ::dup2(o, 1);
        ::dup2(e, 2);
        std::vector<char*> argv;
        for (const std::string& a : full) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execv(argv[0], argv.data());
        ::_exit(127);
      }
      const Result r = wait_for(pid, dir.path("err"));
      const std::string stats = read_bytes(out_path);
      EXPECT_EQ(r.status, 1) << r.err;
      EXPECT_EQ(line_count(r.err), 1) << r.err;
      EXPECT_EQ(r.err.rfind("hk_forward: error: " + input + ": /input/x: expected finite values, found NaN at [" +
                                std::to_string(bad) + ", 5, 7]",
                            0),
                0u)
          << r.err;
      ASSERT_NE(stats.find("failed=1"), std::string::npos) << stats;
      const double read = stat_value(stats, "rows_read"), validated = stat_value(stats, "rows_validated");
      EXPECT_GE(read, 0) << stats;
      EXPECT_LE(read, validated) << "the reader read rows the child had not gone through: " << stats;
      if (filtered) {
        EXPECT_LE(read, bad / 16 * 16) << "the reader reached the bad chunk: " << stats;
      } else {
        EXPECT_GT(read, bad) << "the reader's own check should have found the NaN: " << stats;
      }
      std::filesystem::remove(out_path);
      std::filesystem::remove(dir.path("err"));
      auto left = dir.entries();
      std::sort(left.begin(), left.end());
      EXPECT_EQ(left, (std::vector<std::string>{"in.h5", "plain.h5"})) << "an output was left";
    }
  }
  // 2. Without the NaN (deflate: the child reads every value, slowly enough to be caught mid-x).
  poke_float(dir.path("in.h5"), "/input/x", (int64_t(bad) * S + 5) * 32 + 7, 0.5f);
  const std::vector<std::string> common = {"--input", dir.path("in.h5"), "--backend", "kokkos", "--precision", "fp32",
                                           "--batch-chunk", "16", "--mem-cap", "16M", "--stats", "--quiet"};
  std::vector<std::string> args = common;
  args.insert(args.end(), {"--output", dir.path("y.h5"), "--validate-timeout", "0"});
  const pid_t pid = spawn(args, dir.path("err"));
  const std::string temp = dir.path("y.h5") + ".tmp." + std::to_string(pid);
  pid_t child = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((child = child_of(pid)) < 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  if (child < 0) ::kill(pid, SIGKILL);
  ASSERT_GT(child, 0) << "hk_forward forked no validation child";
  ::kill(child, SIGSTOP);
  bool seen = false;
  while (!seen && std::chrono::steady_clock::now() < deadline) {
    ::kill(child, SIGCONT);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ::kill(child, SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the parent catches up with the child
    std::error_code ec;
    seen = std::filesystem::exists(temp, ec);
    // A child that ended (a zombie, or reaped) validated everything before the pipeline started.
    const std::string st = read_bytes("/proc/" + std::to_string(child) + "/stat");
    const size_t rp = st.rfind(')');
    if (rp == std::string::npos || st.compare(rp + 2, 1, "Z") == 0) break;
  }
  if (!seen) {
    ::kill(pid, SIGKILL);
    wait_for(pid, dir.path("err"));
    FAIL() << "the pipeline did not start while the child was still validating x";
  }
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  const Result r = wait_for(pid, dir.path("err"));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err, "hk_forward: error: " + dir.path("in.h5") + ": the HDF5 library crashed while reading it (signal " +
                       std::to_string(SIGKILL) + ")\n");
  auto entries = dir.entries();
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"err", "in.h5", "plain.h5"})) << "an output was left";
}

// Same input, same backend, same precision: byte-identical /output/y run to run.
TEST(Determinism, KokkosRunToRun) {
  ScratchDir dir;
  write_case(dir.path("in.h5"), 6, 40);
  for (const char* precision : {"fp32", "reference", "fast"}) {
    std::vector<float> ys[2];
    for (int i = 0; i < 2; ++i) {
      const std::string out = dir.path(std::string("y") + precision + std::to_string(i) + ".h5");
      const Result r = run({"--input", dir.path("in.h5"), "--output", out, "--backend", "kokkos", "--precision",
                            precision, "--batch-chunk", "4", "--quiet"},
                           dir.path("err"));
      ASSERT_EQ(r.status, 0) << r.err;
      ys[i] = io::read_output(out).y;
    }
    ASSERT_EQ(ys[0].size(), ys[1].size());
    EXPECT_EQ(std::memcmp(ys[0].data(), ys[1].data(), ys[0].size() * sizeof(float)), 0)
        << precision << ": two runs differ";
  }
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
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <hk_forward> [gtest flags]\n", argv[0]);
    return 2;
  }
  hk::test::g_forward = argv[1];
  auto* counter = new hk::test::SkipCounter;
  ::testing::UnitTest::GetInstance()->listeners().Append(counter);
  const int rc = RUN_ALL_TESTS();
  if (rc == 0 && counter->ran > 0 && counter->ran == counter->skipped) return 77;
  return rc;
}
