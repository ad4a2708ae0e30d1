// Validation of hk_forward's input files in a forked child. libhdf5 still has crashes on
// crafted files (CVE-2021-45830, CVE-2025-6750 reach 1.14.x) that no check in hk can prevent:
// the child opens and fully validates the model and the input with the normal readers (every
// x element read and checked), and its death by a signal becomes one clean error line in the
// parent instead of a crash of the batch job.
//
// The child runs alongside the parent's pipeline instead of before it: it validates the model,
// the input's shapes and lengths, then x in blocks in row order, reporting how far it got; the
// parent reads a chunk of x only once the child has survived going through it (so the parent
// never touches storage the child has not), and with the file in the page cache its read right
// behind the child is cheap. Going through x means reading it (every element, checked) when x
// has filters, whose decoding is where damaged data crashes the library; without filters the
// child reads the first block (the read and conversion path) and then walks the chunk index of
// the rest (InputFile::probe: every chunk looked up, its extent checked against the file) instead
// of reading the values a second time: the parent's reader checks every value it reads. With
// `full` (hk_forward --explain, which computes nothing) the child reads and checks all of x. Header-only so that it needs no build rule of its own; construct it
// before the process starts any thread (fork copies only the caller).
#pragma once

#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "hk/error.hpp"
#include "hk/io/io.hpp"

namespace hk::app {

namespace detail {

// Whole-message write to the channel; a parent that went away is not the child's problem.
inline void channel_write(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += size_t(n);
  }
}

// One line from the parent ("grid <chunk> <rank> <ranks>"); false at end of channel.
inline bool channel_read_line(int fd, std::string& line) {
  line.clear();
  char c;
  for (;;) {
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (c == '\n') return true;
    line.push_back(c);
  }
}

// The child's work. Records, one per line: "open <file>" before each file is touched (so that a
// crash can be attributed), "header" once the model and the input's shapes and lengths are
// valid, "upto <row>" after each block of x (every row of this process's chunks below <row> is
// valid), "took <seconds>" (its time from the fork), then "ok", "error <message>" or "skip" (a failure that is not a file error, such as
// out of memory: the parent then relies on its own checks). `split`: the ranks of a job share
// x, and the child waits for the chunk grid from the parent to know which rows are this rank's.
[[noreturn]] inline void validate_and_exit(int fd, const std::string& model_path, const std::string& input, bool split,
                                           bool full, size_t buffer_bytes, pid_t parent) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto took = [&] {
    char buf[48];
    std::snprintf(buf, sizeof buf, "took %.6f\n",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    channel_write(fd, buf);
  };
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  // A parent killed outright (kill -9) must not leave the child reading a large file.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(0);
  int status = 0;
  try {
    channel_write(fd, "open " + model_path + "\n");
    const Model model = io::read_model(model_path);
    channel_write(fd, "open " + input + "\n");
    // The HDF5 chunk cache and the x buffer share the memory bound.
    io::InputFile in(input, model.config, std::max<size_t>(size_t(1) << 20, buffer_bytes / 4));
    channel_write(fd, "header\n");
    const int64_t B = in.batch();
    int64_t chunk = B;
    long long c = 0;
    int rank = 0, ranks = 1;
    if (split) {
      std::string line;
      if (!channel_read_line(fd, line)) ::_exit(0);  // the parent stopped before computing: nothing to do
      if (std::sscanf(line.c_str(), "grid %lld %d %d", &c, &rank, &ranks) != 3 || c < 1 || ranks < 1 || rank < 0 ||
          rank >= ranks)
        throw std::runtime_error("bad grid");
      chunk = c;
    }
    const int64_t per_seq = int64_t(in.seq_len()) * in.d_model();
    const int64_t step = std::max<int64_t>(1, int64_t(buffer_bytes / 2 / 6) / std::max<int64_t>(1, per_seq));
    const int64_t nb_max = std::min(step, chunk);
    std::vector<float> x(size_t(nb_max * per_seq));
    std::vector<int32_t> len(static_cast<size_t>(nb_max));
    // This process's chunks k = rank, rank + ranks, ... of the grid, in row order.
    bool first = true;
    for (int64_t k = rank; k * chunk < B; k += ranks) {
      const int64_t end = std::min(B, (k + 1) * chunk);
      for (int64_t b0 = k * chunk; b0 < end;) {
        const int64_t nb = std::min(nb_max, end - b0);
        if (full || first || !in.probe(b0, nb)) in.read(b0, nb, x.data(), len.data());
        first = false;
        b0 += nb;
        channel_write(fd, "upto " + std::to_string(b0) + "\n");
      }
    }
    took();
    channel_write(fd, "ok\n");
  } catch (const Error& e) {
    std::string m = e.what();
    for (char& ch : m)
      if (ch == '\n' || ch == '\r') ch = ' ';
    took();
    channel_write(fd, "error " + m + "\n");
    status = 1;
  } catch (...) {
    took();
    channel_write(fd, "skip\n");
    status = 2;
  }
  ::close(fd);
  ::_exit(status);  // no atexit handlers: the parent owns every library's shutdown
}

}  // namespace detail

// The parent's side of the validation child. Every wait throws hk::Error, the same one on every
// later call: the file error the child found; "<file>: the HDF5 library crashed while reading
// it (signal N)" when the child died; "<file>: the HDF5 library hung while reading it (...)"
// when the parent waited `stall_seconds` (> 0) with no record from the child (libhdf5 loops
// forever on some crafted files; the child is killed); or "interrupted" when the child was
// stopped by SIGINT/SIGTERM. When the child cannot run or gives up on a failure that is not a
// file error, the waits return at once: the parent's own validation (the same readers) stands
// alone. Thread-safe: the reader thread waits for rows while the main thread owns the rest.
class ValidationChild {
 public:
  using Interrupted = std::function<bool()>;

  // Forks the child; no thread may exist yet. `split`: the ranks of a job share the reading of x
  // (the child then waits for start() to learn this rank's chunks). `full`: the child reads and
  // checks every element of x even where walking its storage would do (see above). `buffer_bytes`
  // bounds the child's memory for x (buffer, float16 staging and HDF5 chunk cache).
  ValidationChild(const std::string& model_path, const std::string& input, int stall_seconds, bool split, bool full,
                  size_t buffer_bytes)
      : model_path_(model_path), last_file_(model_path), stall_seconds_(stall_seconds), split_(split) {
    t_fork_ = t_end_ = clock::now();
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      no_child();
      return;
    }
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      no_child();
      return;
    }
    if (pid == 0) {
      ::close(fds[0]);
      detail::validate_and_exit(fds[1], model_path, input, split, full, buffer_bytes, parent);
    }
    ::close(fds[1]);
    pid_ = pid;
    fd_ = fds[0];
  }

  ~ValidationChild() {
    std::lock_guard<std::mutex> lock(m_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);  // the run ended early (error, --explain): its verdict no longer matters
      reap();
    }
    if (fd_ >= 0) ::close(fd_);
  }
  ValidationChild(const ValidationChild&) = delete;
  ValidationChild& operator=(const ValidationChild&) = delete;

  // The model and the input's shapes, types and lengths are valid.
  void wait_header(const Interrupted& interrupted = {}) {
    std::lock_guard<std::mutex> lock(m_);
    pump([&] { return header_; }, interrupted);
  }

  // This process's chunks of the grid (k % ranks == rank): what the child reads of x when split.
  void start(int64_t chunk, int rank, int ranks) {
    std::lock_guard<std::mutex> lock(m_);
    if (!split_ || fd_ < 0 || started_) return;
    started_ = true;
    detail::channel_write(fd_, "grid " + std::to_string(chunk) + " " + std::to_string(rank) + " " +
                                   std::to_string(ranks) + "\n");
  }

  // Every row of this process's chunks below `row_end` is valid.
  void wait_rows(int64_t row_end, const Interrupted& interrupted = {}) {
    std::lock_guard<std::mutex> lock(m_);
    pump([&] { return frontier_ >= row_end; }, interrupted);
  }

  // The whole verdict: the child validated everything it was given and ended cleanly.
  void finish(const Interrupted& interrupted = {}) {
    std::lock_guard<std::mutex> lock(m_);
    pump([&] { return pid_ <= 0; }, interrupted);
  }

  // For --stats: the child's time from the fork to its verdict (as it measured it; else until it
  // was reaped, or until now), seconds the parent spent blocked waiting for it, and the rows it
  // had validated (int64 max once it was done).
  double child_seconds() const {
    std::lock_guard<std::mutex> lock(m_);
    if (took_s_ >= 0) return took_s_;
    return std::chrono::duration<double>((pid_ > 0 ? clock::now() : t_end_) - t_fork_).count();
  }
  double blocked_seconds() const {
    std::lock_guard<std::mutex> lock(m_);
    return blocked_s_;
  }
  int64_t rows_validated() const {
    std::lock_guard<std::mutex> lock(m_);
    return frontier_;
  }

 private:
  using clock = std::chrono::steady_clock;
  static constexpr int64_t kAll = std::numeric_limits<int64_t>::max();

  // Reads records until `done()` holds or the child ended (then judged by conclude()).
  template <class Done>
  void pump(Done done, const Interrupted& interrupted) {
    if (!failure_.empty()) throw Error(failure_);
    if (pid_ <= 0 || done()) return;  // no child, already judged, or far enough
    const auto t_wait = clock::now();
    auto last = t_wait;  // the stall clock starts when the parent starts waiting
    bool hung = false;
    char buf[4096];
    while (pid_ > 0 && !done()) {
      // Short slices so that an interrupt of the parent is noticed.
      int wait_ms = 200;
      if (stall_seconds_ > 0) {
        const auto left = std::chrono::seconds(stall_seconds_) - (clock::now() - last);
        wait_ms = int(std::clamp<int64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(left).count(), 0, 200));
      }
      pollfd pfd{fd_, POLLIN, 0};
      const int ready = ::poll(&pfd, 1, wait_ms);
      if (ready < 0 && errno != EINTR) {
        const std::string why = std::strerror(errno);
        ::kill(pid_, SIGKILL);
        conclude(false);
        failure_ = "cannot watch the validation child (" + why + ")";
        break;
      }
      if (ready <= 0) {
        if (interrupted && interrupted()) {
          blocked_s_ += std::chrono::duration<double>(clock::now() - t_wait).count();
          throw Error("interrupted");
        }
        if (stall_seconds_ > 0 && clock::now() - last >= std::chrono::seconds(stall_seconds_)) {
          hung = true;
          ::kill(pid_, SIGKILL);
          conclude(hung);
        }
        continue;
      }
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        conclude(false);  // end of the channel: the child ended
        break;
      }
      pending_.append(buf, size_t(n));
      parse();
      last = clock::now();
    }
    blocked_s_ += std::chrono::duration<double>(clock::now() - t_wait).count();
    if (!failure_.empty()) throw Error(failure_);
  }

  // No child could be started: the parent's own checks stand alone.
  void no_child() {
    header_ = true;
    frontier_ = kAll;
  }

  // Complete records only; "open" records name the file being read.
  void parse() {
    size_t pos = 0;
    for (;;) {
      const size_t nl = pending_.find('\n', pos);
      if (nl == std::string::npos) break;  // a record cut short (by a crash, or not yet all here)
      const std::string rec = pending_.substr(pos, nl - pos);
      pos = nl + 1;
      if (rec.rfind("open ", 0) == 0) last_file_ = rec.substr(5);
      else if (rec == "header") header_ = true;
      else if (rec.rfind("upto ", 0) == 0) frontier_ = std::max<int64_t>(frontier_, std::atoll(rec.c_str() + 5));
      else if (rec.rfind("took ", 0) == 0) took_s_ = std::atof(rec.c_str() + 5);
      else verdict_ = rec;
    }
    pending_.erase(0, pos);
  }

  void reap() {
    int st = 0;
    pid_t w;
    do w = ::waitpid(pid_, &st, 0);
    while (w < 0 && errno == EINTR);
    status_ = w == pid_ ? st : 0;
    pid_ = 0;
    t_end_ = clock::now();
  }

  // The child ended (or was killed as hung): its exit decides.
  void conclude(bool hung) {
    reap();
    ::close(fd_);
    fd_ = -1;
    if (hung) {
      failure_ = last_file_ + ": the HDF5 library hung while reading it (no progress in " +
                 std::to_string(stall_seconds_) + " s; see --validate-timeout)";
    } else if (WIFSIGNALED(status_)) {
      const int sig = WTERMSIG(status_);
      failure_ = sig == SIGINT || sig == SIGTERM
                     ? std::string("interrupted")
                     : last_file_ + ": the HDF5 library crashed while reading it (signal " + std::to_string(sig) + ")";
    } else if (verdict_.rfind("error ", 0) == 0) {
      failure_ = verdict_.substr(6);
    }
    // "ok", "skip", or an exit without a verdict: the parent's own checks cover the rest.
    header_ = true;
    frontier_ = kAll;
  }

  std::string model_path_, last_file_, pending_, verdict_, failure_;
  int stall_seconds_ = 0;
  bool split_ = false, started_ = false, header_ = false;
  pid_t pid_ = -1;  // > 0 while the child runs; 0 once reaped; -1 when none was started
  int fd_ = -1, status_ = 0;
  int64_t frontier_ = 0;
  double blocked_s_ = 0, took_s_ = -1;
  clock::time_point t_fork_, t_end_;
  mutable std::mutex m_;
};

}  // namespace hk::app
