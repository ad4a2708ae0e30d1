// Validation of hk_forward's input files in a forked child. libhdf5 still has crashes on
// crafted files (CVE-2021-45830, CVE-2025-6750 reach 1.14.x) that no check in hk can prevent:
// the child opens and fully validates the model and the input with the normal readers (every
// x element read and checked), and its death by a signal becomes one clean error line in the
// parent instead of a crash of the batch job. Header-only so that it needs no build rule of
// its own; call it before the process starts any thread (fork copies only the caller).
#pragma once

#include <poll.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "hk/error.hpp"
#include "hk/io/io.hpp"

namespace hk::app {

namespace detail {

// Whole-message write to the pipe; a parent that went away is not the child's problem.
inline void pipe_write(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += size_t(n);
  }
}

// The child's work. Protocol, one record per line: "open <file>" before each file is touched
// (so a crash can be attributed), then "ok", "error <message>" or "skip" (a failure that is
// not a file error, such as out of memory: the parent then meets it itself and reports it).
[[noreturn]] inline void validate_and_exit(int fd, const std::string& model_path, const std::string& input, int part,
                                           int parts, size_t buffer_bytes) {
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  int status = 0;
  try {
    pipe_write(fd, "open " + model_path + "\n");
    const Model model = io::read_model(model_path);
    pipe_write(fd, "open " + input + "\n");
    // The HDF5 chunk cache and the x buffer share the memory bound.
    io::InputFile in(input, model.config, std::max<size_t>(size_t(1) << 20, buffer_bytes / 4));
    const int64_t per_seq = int64_t(in.seq_len()) * in.d_model();
    const int64_t step = std::max<int64_t>(1, int64_t(buffer_bytes / 2 / 6) / std::max<int64_t>(1, per_seq));
    // At most a part's share per block, so that every part gets blocks to read.
    const int64_t nb_max = std::min(step, (in.batch() + parts - 1) / parts);
    std::vector<float> x(size_t(nb_max * per_seq));
    std::vector<int32_t> len(static_cast<size_t>(nb_max));
    // Blocks j with j % parts == part: the ranks of a job share the reading of x.
    int64_t j = 0;
    for (int64_t b0 = 0; b0 < in.batch(); b0 += nb_max, ++j) {
      if (j % parts != part) continue;
      in.read(b0, std::min(nb_max, in.batch() - b0), x.data(), len.data());
      pipe_write(fd, "p\n");  // progress: a long input is not a hang
    }
    pipe_write(fd, "ok\n");
  } catch (const Error& e) {
    std::string m = e.what();
    for (char& c : m)
      if (c == '\n' || c == '\r') c = ' ';
    pipe_write(fd, "error " + m + "\n");
    status = 1;
  } catch (...) {
    pipe_write(fd, "skip\n");
    status = 2;
  }
  ::close(fd);
  ::_exit(status);  // no atexit handlers: the parent owns every library's shutdown
}

}  // namespace detail

// Throws hk::Error with the file error the child found, "<file>: the HDF5 library crashed
// while reading it (signal N)" when the child died, "<file>: the HDF5 library hung while
// reading it (...)" when it reported no progress for `stall_seconds` (> 0; libhdf5 loops forever
// on some crafted files), or "interrupted" when it was stopped by SIGINT/SIGTERM. Returns
// normally when the files are valid (or the check could not run, in which case the parent's own
// validation reports the problem).
// The processes of a job split x between them: this one checks blocks `part`, `part + parts`, ...
// (the model, shapes and lengths are checked whole by each). `buffer_bytes` bounds the child's
// memory for x (buffer, float16 staging and HDF5 chunk cache).
inline void validate_in_child(const std::string& model_path, const std::string& input, int stall_seconds = 0,
                              int part = 0, int parts = 1, size_t buffer_bytes = size_t(256) << 20) {
  if (parts < 1 || part < 0 || part >= parts) {
    part = 0;
    parts = 1;
  }
  int fds[2];
  if (::pipe(fds) != 0) return;  // no pipe: validate in-process only
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return;
  }
  if (pid == 0) {
    ::close(fds[0]);
    detail::validate_and_exit(fds[1], model_path, input, part, parts, buffer_bytes);
  }
  ::close(fds[1]);
  std::string msg;
  char buf[4096];
  bool hung = false;
  using clock = std::chrono::steady_clock;
  auto last_progress = clock::now();
  for (;;) {
    int wait_ms = -1;
    if (stall_seconds > 0) {
      const auto left = std::chrono::seconds(stall_seconds) - (clock::now() - last_progress);
      wait_ms = int(std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(left).count()));
    }
    pollfd pfd{fds[0], POLLIN, 0};
    const int ready = ::poll(&pfd, 1, wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      hung = true;
      ::kill(pid, SIGKILL);
      break;
    }
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    msg.append(buf, size_t(n));
    last_progress = clock::now();
  }
  ::close(fds[0]);
  int st = 0;
  pid_t w;
  do w = ::waitpid(pid, &st, 0);
  while (w < 0 && errno == EINTR);
  if (w != pid) return;

  // The last complete record decides; "open" records name the file being read.
  std::string last_file = model_path, verdict;
  size_t pos = 0;
  while (pos < msg.size()) {
    const size_t nl = msg.find('\n', pos);
    if (nl == std::string::npos) break;  // a record cut short by a crash
    const std::string rec = msg.substr(pos, nl - pos);
    pos = nl + 1;
    if (rec.rfind("open ", 0) == 0) last_file = rec.substr(5);
    else verdict = rec;
  }
  if (hung)
    throw Error(last_file + ": the HDF5 library hung while reading it (no progress in " + std::to_string(stall_seconds) +
                " s; see --validate-timeout)");
  if (WIFSIGNALED(st)) {
    const int sig = WTERMSIG(st);
    if (sig == SIGINT || sig == SIGTERM) throw Error("interrupted");
    throw Error(last_file + ": the HDF5 library crashed while reading it (signal " + std::to_string(sig) + ")");
  }
  if (verdict.rfind("error ", 0) == 0) throw Error(verdict.substr(6));
  // "ok", "skip", or a child that exited without a verdict: the parent validates again anyway.
}

}  // namespace hk::app
