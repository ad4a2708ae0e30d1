// Running a program as a user or a batch system runs it: exit status, stdout and stderr
// captured through files, optionally in the background (to be signalled). For the streaming
// (test/cli) and MPI (test/mpi) tests of hk_forward.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace hk::test {

struct ProcResult {
  int status = -1;  // exit status, or 128 + signal
  std::string out, err;
  // Lines of `err` that start with `prefix`.
  std::vector<std::string> err_lines_starting(const std::string& prefix) const {
    std::vector<std::string> lines;
    std::istringstream in(err);
    std::string line;
    while (std::getline(in, line))
      if (line.rfind(prefix, 0) == 0) lines.push_back(line);
    return lines;
  }
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// A started process; its output goes to <capture>.out / <capture>.err.
struct Proc {
  pid_t pid = -1;
  std::string capture;

  ProcResult wait() const {
    ProcResult r;
    int st = 0;
    pid_t w;
    do w = ::waitpid(pid, &st, 0);
    while (w < 0 && errno == EINTR);
    if (pid > 0 && w == pid) r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = slurp(capture + ".out");
    r.err = slurp(capture + ".err");
    return r;
  }
  bool running() const {
    int st = 0;
    return pid > 0 && ::waitpid(pid, &st, WNOHANG) == 0;
  }
};

// Starts `args` in directory `cwd`; output captured under `capture` (a path prefix outside cwd).
inline Proc start(const std::vector<std::string>& args, const std::string& cwd, const std::string& capture) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::string out_path = capture + ".out", err_path = capture + ".err";
  const pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls until exec
    if (::chdir(cwd.c_str()) != 0) ::_exit(126);
    const int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0) ::_exit(126);
    ::dup2(o, 1);
    ::dup2(e, 2);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  return Proc{pid, capture};
}

inline ProcResult run_process(const std::vector<std::string>& args, const std::string& cwd, const std::string& capture) {
  return start(args, cwd, capture).wait();
}

// The value of `key=` in hk_forward's --stats line(s) of `out` for `rank`, or -1.
inline double stat_of(const std::string& out, const std::string& key, int rank = 0) {
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("hk_forward: stats: ", 0) != 0 || line.find(" rank=" + std::to_string(rank) + " ") == std::string::npos)
      continue;
    const size_t p = line.find(" " + key + "=");
    if (p != std::string::npos) return std::atof(line.c_str() + p + key.size() + 2);
  }
  return -1;
}

}  // namespace hk::test
