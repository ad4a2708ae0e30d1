#include "pipeline.hpp"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "hk/error.hpp"
#include "hk/tune/knobs.hpp"
#include "host_buffers.hpp"
#include "trace.hpp"

namespace hk::app {

namespace {

using clock = std::chrono::steady_clock;

double since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }

// One chunk buffer and whose turn it is: the producer fills it when empty, the consumer takes it when full.
struct Slot {
  HostBlock data, lengths;
  bool full = false;
  bool filled = false;  // written by its producer at least once (its pages are there)
};

class Pipeline {
 public:
  Pipeline(const ChunkGrid& g, int S, int D, int pin_device, const PipelineStages& st)
      : g_(g), st_(st), pin_device_(pin_device) {
    const size_t n = size_t(g.chunk) * size_t(S) * size_t(D) * sizeof(float);
    const auto touch = pin_device >= 0 ? HostBlock::Touch::later : HostBlock::Touch::now;
    x_.resize(size_t(input_buffers(pin_device >= 0)));
    for (Slot& x : x_) {
      x.data = HostBlock(n, touch);
      x.lengths = HostBlock(size_t(g.chunk) * sizeof(int32_t), touch);
    }
    for (Slot& y : y_) {
      y.data = HostBlock(n, touch);
      y.lengths = HostBlock(size_t(g.chunk) * sizeof(int32_t), HostBlock::Touch::now);  // a copy of the chunk's
    }
  }

  PipelineStats run() {
    const int64_t n = g_.local_chunks();
    std::thread reader([&] { guarded([&] { read_all(n); }); });
    // Stops the reader and waits for it (the way out before the writer exists).
    const auto stop_reader = [&] {
      {
        std::lock_guard<std::mutex> lock(m_);
        stop_ = true;  // the reader stops after its current chunk
        cv_.notify_all();
      }
      reader.join();
    };
    try {
      // Buffers for a GPU are allocated untouched (pages registered untouched hold up the
      // engine's CUDA calls). The output buffers' pages are made here, before the set-up (which
      // then mostly waits for the CUDA driver's start on another thread), when they lie on huge
      // pages (a few dozen faults: they do not contend with the driver's own mappings, as 4 KiB
      // faults measured to): page-locking them beside the engine's build is then quick. The
      // input buffers get theirs from the reader's first fills.
      if (pin_device_ >= 0 && n > 0) {
        Trace::Span span(trace(), "output buffers' pages");
        for (Slot& y : y_)
          if (y.data.huge_pages()) y.data.touch();
      }
      if (st_.setup) {
        Trace::Span span(trace(), "set-up (beside the reader)");
        pin_device_ = st_.setup();
      }
    } catch (...) {
      stop_reader();  // the set-up's error is the run's
      throw;
    }
    {
      // The reader failed while the set-up ran: its error now, without starting the rest.
      std::unique_lock<std::mutex> lock(m_);
      if (error_) {
        lock.unlock();
        stop_reader();
        std::rethrow_exception(error_);
      }
    }
    std::thread writer;
    try {
      writer = std::thread([&] { guarded([&] { write_all(n); }); });
    } catch (...) {
      stop_reader();
      throw;
    }
    guarded([&] { compute_all(n); });
    reader.join();
    writer.join();
    if (error_) std::rethrow_exception(error_);
    return stats_;
  }

 private:
  // Runs one stage; the first failure stops every stage (or, with `fatal`, ends the job here).
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (...) {
      std::string what = "unknown failure";
      try {
        throw;
      } catch (const std::bad_alloc&) {
        what = "out of memory (a smaller --batch-chunk or --mem-cap needs less)";
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      std::lock_guard<std::mutex> lock(m_);
      if (!error_ && !stop_ && st_.fatal) st_.fatal(what);  // does not return
      if (!error_) error_ = std::current_exception();
      stop_ = true;
      cv_.notify_all();
    }
  }

  // Waits until `ready` holds or the run stops; false when stopped.
  template <class P>
  bool wait(std::unique_lock<std::mutex>& lock, P ready) {
    cv_.wait(lock, [&] { return stop_ || ready(); });
    return !stop_;
  }

  void check_interrupt() {
    if (st_.interrupted && st_.interrupted()) throw Error("interrupted");
  }

  void read_all(int64_t n) {
    trace().name_thread("reader");
    for (int64_t i = 0; i < n; ++i) {
      Slot& s = x_[size_t(i) % x_.size()];
      const int64_t k = g_.global_index(i);
      {
        Trace::Span span(trace(), "wait for a free input buffer", k);
        std::unique_lock<std::mutex> lock(m_);
        if (!wait(lock, [&] { return !s.full; })) return;
      }
      check_interrupt();
      const auto t = clock::now();
      {
        Trace::Span span(trace(), "read", k);  // ends before the chunk is handed on
        st_.read(g_.first_row(k), g_.rows(k), s.data.as<float>(), s.lengths.as<int32_t>());
      }
      std::lock_guard<std::mutex> lock(m_);
      stats_.read_s += since(t);
      s.full = true;
      s.filled = true;
      cv_.notify_all();
    }
  }

  void compute_all(int64_t n) {
    // Page-locking (which waits for the device's context) on a thread of its own, slot by slot in
    // the order of first use. Registering host memory holds up the engine's own CUDA calls, the
    // more so the more of its pages are not yet there (measured on an H200 host: ~22 ms per
    // untouched 64 MiB buffer, ~3 ms once the reader has filled it; 512 MiB registered beside the
    // engine made its constructor ~0.13 s longer, and faulting the pages in on another thread made
    // the context's creation as much longer). So: the first input buffer and both output buffers
    // beside `prepare` (the engine), every further input buffer once `prepare` has returned and
    // the reader has filled it. A chunk is computed once its two slots have been through it.
    std::vector<Slot*> order = {&x_[0], &y_[0], &y_[1]};
    for (size_t j = 1; j < x_.size(); ++j) order.push_back(&x_[j]);
    size_t pin_done = pin_device_ >= 0 && n > 0 ? 0 : order.size();  // slots of `order` through it (m_)
    bool prepared = false;                                         // `prepare` returned (m_)
    bool leaving = false;                                          // compute_all is leaving (m_)
    auto pin_ready = [&](const Slot& s) {
      for (size_t j = 0; j < pin_done; ++j)
        if (order[j] == &s) return true;
      return false;
    };
    auto is_input = [&](const Slot* s) { return s >= x_.data() && s < x_.data() + x_.size(); };
    std::thread pinner;
    if (pin_done < order.size())
      pinner = std::thread([&] {
        trace().name_thread("page-locking");
        int pinned = 0, tried = 0;
        double busy = 0;
        for (size_t j = 0; j < order.size(); ++j) {
          Slot& s = *order[j];
          {
            std::unique_lock<std::mutex> lock(m_);
            // An input slot after the first: once filled (its pages are there), after `prepare`.
            if (!wait(lock, [&] { return leaving || j < 3 || (prepared && (!is_input(&s) || s.filled)); })) break;
            if (leaving) break;  // the compute stage is done or failed: nothing more is needed
          }
          const auto t = clock::now();
          {
            Trace::Span span(trace(), "page-lock a chunk buffer", int64_t(j));
            pinned += int(s.data.pin(pin_device_)) + int(s.lengths.pin(pin_device_));
            tried += int(s.data.bytes() > 0) + int(s.lengths.bytes() > 0);
          }
          busy += since(t);
          std::lock_guard<std::mutex> lock(m_);
          pin_done = j + 1;
          stats_.pin_s = busy;
          stats_.pinned = pinned;
          stats_.pin_tried = tried;
          cv_.notify_all();
        }
        std::lock_guard<std::mutex> lock(m_);
        pin_done = order.size();  // also when the run stopped: nobody waits for the rest
        cv_.notify_all();
      });
    // On every way out (a failed `prepare` included) the page-locking thread is let go, then joined.
    struct Join {
      Pipeline& p;
      std::thread& t;
      bool& leaving;
      ~Join() {
        {
          std::lock_guard<std::mutex> lock(p.m_);
          leaving = true;
          p.cv_.notify_all();
        }
        if (t.joinable()) t.join();
      }
    } join{*this, pinner, leaving};
    if (n > 0) {
      auto t = clock::now();
      if (st_.prepare) {
        Trace::Span span(trace(), "prepare (engine wait)");
        st_.prepare();
      }
      const double prepare_s = since(t);
      std::lock_guard<std::mutex> lock(m_);
      stats_.prepare_s = prepare_s;
      prepared = true;
      cv_.notify_all();
    }
    for (int64_t i = 0; i < n; ++i) {
      Slot& in = x_[size_t(i) % x_.size()];
      Slot& out = y_[i % 2];
      const int64_t k = g_.global_index(i);
      {
        std::unique_lock<std::mutex> lock(m_);
        if (!pin_ready(in) || !pin_ready(out)) {
          Trace::Span span(trace(), "wait for page-locking", k);
          if (!wait(lock, [&] { return pin_ready(in) && pin_ready(out); })) return;
        }
      }
      {
        Trace::Span span(trace(), "wait for input and an output buffer", k);
        std::unique_lock<std::mutex> lock(m_);
        if (!wait(lock, [&] { return in.full && !out.full; })) return;
      }
      check_interrupt();
      const auto t = clock::now();
      {
        Trace::Span span(trace(), "compute", k);  // ends before the chunk is handed on
        st_.compute(g_.first_row(k), g_.rows(k), in.data.as<float>(), in.lengths.as<int32_t>(),
                    out.data.as<float>());
        // The lengths go with y: the input buffer is refilled before the write.
        std::memcpy(out.lengths.as<int32_t>(), in.lengths.as<int32_t>(), size_t(g_.rows(k)) * sizeof(int32_t));
      }
      std::lock_guard<std::mutex> lock(m_);
      stats_.compute_s += since(t);
      in.full = false;
      out.full = true;
      cv_.notify_all();
    }
  }

  void write_all(int64_t n) {
    trace().name_thread("writer");
    for (int64_t i = 0; i < n; ++i) {
      Slot& s = y_[i % 2];
      const int64_t k = g_.global_index(i);
      {
        Trace::Span span(trace(), "wait for output", k);
        std::unique_lock<std::mutex> lock(m_);
        if (!wait(lock, [&] { return s.full; })) return;
      }
      const auto t = clock::now();
      {
        Trace::Span span(trace(), "write", k);
        st_.write(g_.first_row(k), g_.rows(k), s.data.as<float>(), s.lengths.as<int32_t>());
      }
      PipelineStats snapshot;
      {
        std::lock_guard<std::mutex> lock(m_);
        stats_.write_s += since(t);
        stats_.sequences_done += g_.rows(k);
        s.full = false;
        snapshot = stats_;
        cv_.notify_all();
      }
      if (st_.progress) st_.progress(snapshot);
    }
    // The rounds in which this rank has no chunk: empty collective writes, so that every rank
    // makes the same number of write calls.
    for (int64_t i = n; i < g_.rounds(); ++i) {
      {
        std::lock_guard<std::mutex> lock(m_);
        if (stop_) return;
      }
      st_.write(0, 0, nullptr, nullptr);
    }
  }

  ChunkGrid g_;
  const PipelineStages& st_;
  int pin_device_ = -1;

 public:
  std::vector<Slot> x_ = std::vector<Slot>(2), y_ = std::vector<Slot>(2);  // handed over by `keep`

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::exception_ptr error_;
  PipelineStats stats_;
};

}  // namespace

int input_buffers(bool gpu) {
  static const int knob = [] {
    const std::string v = tune::knob_value("HK_INPUT_BUFFERS");
    if (v.empty() || v == "auto") return 0;
    if (v.size() == 1 && v[0] >= '2' && v[0] <= '8') return v[0] - '0';
    throw Error("HK_INPUT_BUFFERS=" + v + ": expected auto or a count of input chunk buffers from 2 to 8");
  }();
  return knob > 0 ? knob : gpu ? 3 : 2;
}

PipelineStats run_pipeline(const ChunkGrid& grid, int S, int D, int pin_device, const PipelineStages& stages,
                           std::shared_ptr<void>* keep) {
  auto p = std::make_shared<Pipeline>(grid, S, D, pin_device, stages);
  const PipelineStats st = p->run();
  if (keep) {
    // Only the buffers outlive the call (the rest refers to the caller's stages).
    struct Buffers {
      std::vector<Slot> x, y;
    };
    auto b = std::make_shared<Buffers>();
    b->x = std::move(p->x_);
    b->y = std::move(p->y_);
    *keep = std::move(b);
  }
  return st;
}

}  // namespace hk::app
