// hk_forward --trace FILE: a timeline of one run in the Chrome trace-event format (JSON; opens in
// Perfetto or chrome://tracing): set-up phases, the start-up and engine threads, and each chunk's
// read, compute and write with the waits between them, one track per thread, times from the
// start of main. Off unless enabled: a span then costs one relaxed atomic load.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hk::app {

class Trace {
 public:
  using Clock = std::chrono::steady_clock;

  // Starts recording; times are measured from `origin`.
  void enable(Clock::time_point origin);
  bool on() const { return on_.load(std::memory_order_relaxed); }
  // Names the calling thread's track.
  void name_thread(const std::string& name);
  // One finished span of the calling thread; chunk >= 0 adds {"chunk": k} to it.
  void add(const char* name, Clock::time_point begin, Clock::time_point end, int64_t chunk = -1);
  // Writes the events as {"traceEvents": [...]} with pid = rank; "" on success, else why not.
  std::string write(const std::string& path, int rank) const;

  // Records [construction, destruction) on the calling thread.
  class Span {
   public:
    Span(Trace& t, const char* name, int64_t chunk = -1)
        : t_(t.on() ? &t : nullptr), name_(name), chunk_(chunk), begin_(t_ ? Clock::now() : Clock::time_point{}) {}
    ~Span() {
      if (t_) t_->add(name_, begin_, Clock::now(), chunk_);
    }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    Trace* t_;
    const char* name_;
    int64_t chunk_;
    Clock::time_point begin_;
  };

 private:
  struct Event {
    const char* name;
    int tid;
    double begin_us, dur_us;
    int64_t chunk;
  };
  int tid_locked();  // the calling thread's track number; m_ held

  std::atomic<bool> on_{false};
  Clock::time_point origin_;
  mutable std::mutex m_;
  std::vector<Event> events_;
  std::vector<std::string> names_;  // of track k
};

// The process's trace (one per process, like its log).
Trace& trace();

}  // namespace hk::app
