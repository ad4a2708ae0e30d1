// hk_forward: the transformer forward pass of MODEL.md on an HDF5 input (FORMAT.md), written
// to an HDF5 output. Everything is validated before it is computed on; the input streams
// through in batch chunks (a reader thread, the compute and a writer thread overlap:
// pipeline.hpp) with bounded memory; under mpirun / srun (an MPI build) the ranks share the
// chunks and write one file through parallel HDF5. The output appears atomically only when
// the whole run succeeded.
//
// Exit status: 0 success, 1 bad file / bad arguments / runtime failure (one line on stderr),
// 2 command-line usage error, 130 interrupted.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "app_common.hpp"
#include "chunk_sizing.hpp"
#include "host_buffers.hpp"
#include "mpi_job.hpp"
#include "pipeline.hpp"
#include "trace.hpp"
#include "validate_child.hpp"
#include "hk/build_config.hpp"
#include "hk/engine.hpp"
#include "hk/error.hpp"
#include "hk/io/io.hpp"
#include "hk/tune/knobs.hpp"
#if HK_HAVE_MPI
#include "hk/io/parallel_output_file.hpp"
#endif

namespace {

constexpr const char* kProgram = "hk_forward";
using hk::app::cache_bytes_for;
using hk::app::ChunkSizing;
using hk::app::engine_batch_for;
using hk::app::planned_backend;
using hk::app::size_chunks;

struct Options {
  std::string trace;  // --trace FILE
  std::string input, model, output;
  std::string precision = "fast";
  std::string backend = "auto";
  int device = 0;
  bool device_given = false;
  int64_t batch_chunk = 0;   // 0: sized from the memory budget (chunk_sizing.hpp)
  int64_t engine_batch = 0;  // 0: sized from the memory the backend has
  std::string mem_cap;      // "" : the default budget
  bool quiet = false, progress = false, explain = false, knobs = false, stats = false;
  bool no_fork_validate = false;
  int validate_timeout = 300;  // seconds without progress before the validation child counts as hung
};

// Memory of the validation child (x buffer, float16 staging, HDF5 chunk cache) without --mem-cap.
constexpr size_t kChildBufferBytes = size_t(64) << 20;
// Seconds since the epoch (--stats lines, set against a launcher's own clock).
double unix_s(std::chrono::system_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_signal(int sig) {
  g_interrupted = 1;
  std::signal(sig, SIG_DFL);  // a second signal ends the process at once
}

std::string version_string() {
  std::string names;
  for (const hk::Backend* b : hk::backends()) names += (names.empty() ? "" : ", ") + b->name();
  return std::string(kProgram) + " " + HK_VERSION + " (backends: " + names + "; HDF5 " + hk::io::hdf5_library_version() +
         "; MPI " + (HK_HAVE_MPI ? "yes" : "no") + "; " + HK_BUILD_TYPE + ")";
}


// "64M", "1.5G", "4096" (K, M, G, T: powers of 1024; an optional trailing "B" or "iB").
int64_t parse_bytes(const std::string& text) {
  std::string t = text;
  for (const char* suffix : {"iB", "ib", "B", "b"})
    if (t.size() > std::strlen(suffix) && t.compare(t.size() - std::strlen(suffix), std::string::npos, suffix) == 0) {
      t.resize(t.size() - std::strlen(suffix));
      break;
    }
  double scale = 1;
  if (!t.empty()) {
    switch (t.back()) {
      case 'k': case 'K': scale = 1024.0; break;
      case 'm': case 'M': scale = 1024.0 * 1024; break;
      case 'g': case 'G': scale = 1024.0 * 1024 * 1024; break;
      case 't': case 'T': scale = 1024.0 * 1024 * 1024 * 1024; break;
      default: break;
    }
    if (scale != 1) t.pop_back();
  }
  char* end = nullptr;
  errno = 0;
  const double v = t.empty() ? -1 : std::strtod(t.c_str(), &end);
  if (errno != 0 || !end || *end != '\0' || !(v > 0) || v * scale > 9.0e18)
    throw hk::Error("--mem-cap " + text + ": expected a positive size in bytes, e.g. 512M or 8G");
  return int64_t(v * scale);
}

std::string human(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

std::string clock_string(double seconds) {
  const long s = long(std::lround(std::max(0.0, seconds)));
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

// Progress on stderr: a bar redrawn in place (at most every 0.1 s) on a terminal, otherwise
// (--progress into a log) one line per second. Tokens/s, the share of the wall time each stage
// was busy (they overlap: compute near 100% means the I/O is hidden) and the ETA. In a job of
// several ranks rank 0 draws it from its own chunks (the chunks are dealt round robin).
class Progress {
 public:
  Progress(bool enabled, int64_t total_tokens)
      : enabled_(enabled), tty_(::isatty(STDERR_FILENO) == 1), total_(total_tokens) {}
  void update(int64_t done, double elapsed, const hk::app::PipelineStats& st) {
    if (!enabled_) return;
    if (done < total_ && elapsed - last_ < (tty_ ? 0.1 : 1.0)) return;
    last_ = elapsed;
    const double frac = total_ > 0 ? double(done) / double(total_) : 1.0;
    const int width = 30, fill = int(frac * width);
    const double rate = elapsed > 0 ? double(done) / elapsed : 0.0;
    const double eta = rate > 0 ? double(total_ - done) / rate : 0.0;
    auto pct = [&](double busy) { return elapsed > 0 ? int(std::lround(std::min(100.0, 100.0 * busy / elapsed))) : 0; };
    std::fprintf(stderr, "%s%3d%% [%s%s] %s/%s tokens  %s tokens/s  read %d%% compute %d%% write %d%%  ETA %s%s",
                 tty_ ? "\r" : "", int(frac * 100.0), std::string(size_t(fill), '#').c_str(),
                 std::string(size_t(width - fill), '.').c_str(), human(double(done)).c_str(),
                 human(double(total_)).c_str(), human(rate).c_str(), pct(st.read_s), pct(st.compute_s),
                 pct(st.write_s), clock_string(eta).c_str(), tty_ ? " " : "\n");
    std::fflush(stderr);
    drawn_ = tty_;
  }
  void finish() {
    if (drawn_) std::fputc('\n', stderr);
    drawn_ = false;
  }
  ~Progress() { finish(); }

 private:
  bool enabled_, tty_, drawn_ = false;
  int64_t total_;
  double last_ = -1.0;
};

// The first non-finite element of y [nb, S, D], as "[b, s, d]", or "". A chunk of y is tens of
// megabytes: four threads share the scan (hk::io::first_nonfinite_parallel).
std::string first_nonfinite(const float* y, int64_t n, int64_t b0, int S, int D) {
  const int64_t i = hk::io::first_nonfinite_parallel(y, n);
  if (i < 0) return "";
  const int64_t per = int64_t(S) * D;
  return "[" + std::to_string(b0 + i / per) + ", " + std::to_string((i / D) % S) + ", " + std::to_string(i % D) + "]";
}

// Peak resident set size of this process (VmHWM of /proc/self/status), in KiB; -1 if unknown.
int64_t peak_rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6);
  return -1;
}

// The output file of a run: one process (OutputFile) or the ranks of an MPI job together.
class Output {
 public:
  Output(const std::string& path, int64_t B, int S, int D, const hk::app::Job& job) {
#if HK_HAVE_MPI
    if (job.size() > 1) {
      par_ = std::make_unique<hk::io::ParallelOutputFile>(path, B, S, D, job.comm());
      return;
    }
#else
    (void)job;
#endif
    ser_ = std::make_unique<hk::io::OutputFile>(path, B, S, D);
  }
  void set_attribute(const std::string& name, const std::string& value) {
#if HK_HAVE_MPI
    if (par_) return par_->set_attribute(name, value);
#endif
    ser_->set_attribute(name, value);
  }
  void write(int64_t b0, int64_t nb, const float* y, const int32_t* lengths) {
#if HK_HAVE_MPI
    if (par_) return par_->write(b0, nb, y, lengths);
#endif
    ser_->write(b0, nb, y, lengths);
  }
  void commit() {
#if HK_HAVE_MPI
    if (par_) return par_->commit();
#endif
    ser_->commit();
  }
  // Removes the temporary file now (a rank about to abort the job).
  void discard() noexcept {
#if HK_HAVE_MPI
    if (par_) par_->discard();
#endif
  }

 private:
  std::unique_ptr<hk::io::OutputFile> ser_;
#if HK_HAVE_MPI
  std::unique_ptr<hk::io::ParallelOutputFile> par_;
#endif
};

// Everything hk_forward does after the arguments are parsed. Setup failures are agreed between
// the ranks (one error line, every rank exits 1); once the output file exists a failing rank
// prints its error, removes the temporary file and aborts the job.
int run(const Options& o, int* argc, char*** argv) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const auto t0_unix = std::chrono::system_clock::now();  // --stats: the process's time before and after run()
  hk::app::Trace& tr = hk::app::trace();
  if (!o.trace.empty()) tr.enable(t0);
  tr.name_thread("main (set-up, compute stage)");
  using Span = hk::app::Trace::Span;
  std::string input = o.input, model_path, output = o.output.empty() ? "hk_out.h5" : o.output;
  double mem_cap = 0;

  // ---- reliability: validate in a forked child, so that a crash inside libhdf5 on a crafted
  // file becomes a clean error here (validate_child.hpp). It is forked now: no thread exists
  // yet, and MPI is not initialised (its runtime starts threads, and fork after MPI_Init is
  // unsafe). This process opens a file only after the child survived opening it, and reads a
  // chunk of x only after the child survived reading it; the child runs ahead of the pipeline.
  // The ranks of a job (as the launcher numbers them) split the reading of x.
  std::string setup_error;
  const hk::app::LaunchInfo launch = hk::app::launch_info();
  std::unique_ptr<hk::app::ValidationChild> child;
  const auto interrupted = [] { return g_interrupted != 0; };
  // CUDA's start-up (driver, and the context of the device this rank will use: a few tenths of a
  // second) runs on its own thread beside the validation child's first checks, MPI's start-up,
  // the model read and the first reads of x (the chunk grid does not wait for the device); the
  // engine then finds the context made, and the engine batch is sized from the context's figure
  // of free memory (cudaMemGetInfo). Started after the fork: the child must not inherit
  // threads. Not when the device is not known yet (a launcher that does not say the local rank).
  int node_gpu_count = 0;  // > 0: this rank was given one of that many GPUs of its node
  int first_device = o.device;  // --device's ordinal in this process (0 once restricted to that GPU)
  std::future<hk::app::DeviceMemory> early_device;
  const auto start_early_device = [&] {
    if (!HK_HAVE_CUDA || o.backend == "kokkos") return;
    const bool by_rank = !o.device_given && launch.launched;
    if (by_rank && launch.local_rank < 0) return;
    early_device = std::async(std::launch::async, [&o, launch, by_rank, &first_device, &tr] {
      tr.name_thread("start-up");
      // The backend's probe first (its answer is kept: the main thread's later question does not
      // wait behind the context creation), then the context. Failures are the main thread's to
      // report when it asks again.
      const hk::Backend* b = nullptr;
      int d = -1;
      try {
        {
          Span span(tr, "backend probe (CUDA driver start)");
          b = &hk::select_backend(o.backend);
        }
        const int gpus = b->name() == "cuda" ? hk::app::cuda_device_count() : 0;
        d = gpus < 1 ? -1 : by_rank ? launch.local_rank % gpus : first_device;
      } catch (...) {
        return hk::app::DeviceMemory{};
      }
      if (d < 0) return hk::app::DeviceMemory{};
      Span span(tr, "CUDA context and libraries");
      b->prepare(d);
      return hk::app::device_memory(d);
    });
  };
  try {
    if (input.empty()) input = hk::app::find_data_file("sample.h5");
    model_path = o.model.empty() ? input : o.model;
    if (!o.mem_cap.empty()) mem_cap = double(parse_bytes(o.mem_cap));
    if (hk::app::same_file(output, input) || hk::app::same_file(output, model_path))
      throw hk::Error(output + ": /: expected an output path other than the input and model files, found the same file");
    if (!o.no_fork_validate) {
      // The child's memory adds to this process's while both run: an eighth of the cap.
      const size_t child_bytes = mem_cap > 0 ? size_t(mem_cap / 8) : kChildBufferBytes;
      child = std::make_unique<hk::app::ValidationChild>(model_path, input, o.validate_timeout, launch.size > 1,
                                                         o.explain, child_bytes);
    }
    // A rank of a job sees only its own GPU of the node (CUDA_VISIBLE_DEVICES, set before CUDA
    // starts, after the fork): CUDA then sets up one GPU per process instead of every GPU in
    // every rank at once (measured: 0.36 s per process for two ranks on two H200s, 0.24 s for one).
    if (HK_HAVE_CUDA && o.backend != "kokkos" && !o.device_given && launch.launched && launch.local_rank >= 0) {
      Span span(tr, "GPUs of the node (NVML)");
      const std::vector<std::string> gpus = hk::app::node_gpus();
      if (gpus.size() > 1 && hk::app::restrict_to_gpu(gpus[size_t(launch.local_rank) % gpus.size()]))
        node_gpu_count = int(gpus.size());
    } else if (HK_HAVE_CUDA && o.backend != "kokkos" && (!launch.launched || o.device_given) && o.device >= 0 &&
               (std::getenv("CUDA_VISIBLE_DEVICES") || hk::app::nvidia_gpu_count() > 1)) {
      // One process on a node of several GPUs uses one (--device; also each rank of a job given
      // --device): the same restriction, so that CUDA's start-up sets up that GPU only (measured
      // on two H200s: the driver's start 0.34 s, 0.11 s with one GPU). Its ordinal in this process
      // becomes 0.
      Span span(tr, "GPUs of the node (NVML)");
      const std::vector<std::string> gpus = hk::app::node_gpus();
      if (gpus.size() > 1 && size_t(o.device) < gpus.size() && hk::app::restrict_to_gpu(gpus[size_t(o.device)]))
        first_device = 0;
    }
    start_early_device();
    Span span(tr, "validation child: model and input header");
    if (child) child->wait_header(interrupted);  // the model and the input's shapes and lengths
  } catch (const hk::Error& e) {
    setup_error = e.what();
  }
  const double header_s = std::chrono::duration<double>(clock::now() - t0).count();
  double device_query_s = 0, output_s = 0;  // --stats: parts of the set-up

  std::unique_ptr<Span> job_span = std::make_unique<Span>(tr, "MPI start-up");
  hk::app::Job job(argc, argv);
  job_span.reset();
  // The start-up thread ends before MPI does (a setup failure leaves run() at once).
  struct JoinFirst {
    std::future<hk::app::DeviceMemory>& f;
    ~JoinFirst() {
      if (f.valid()) f.wait();
    }
  } join_early{early_device};
  auto agree = [&](const std::string& err) {
    const bool stop = g_interrupted || err == "interrupted";
    const std::string first = job.agree(stop ? "interrupted; no output written" : err, kProgram);
    if (!first.empty()) throw hk::app::AgreedFailure{first.rfind("interrupted", 0) == 0 ? 130 : 1};
  };
  agree(setup_error);

  // Validation: the whole model, the input's shapes, types and lengths (x is checked per chunk).
  std::unique_ptr<hk::Model> model;
  std::unique_ptr<hk::io::InputFile> in;
  ChunkSizing sizing;
  const std::string planned = planned_backend(o.backend);
  const hk::Precision precision = hk::precision_from_string(o.precision);
  try {
    {
      Span span(tr, "read the model, open the input");
      model = std::make_unique<hk::Model>(hk::io::read_model(model_path));
      sizing.cache_bytes = cache_bytes_for(mem_cap);
      in = std::make_unique<hk::io::InputFile>(input, model->config, sizing.cache_bytes);
    }
    sizing = size_chunks(model->config, in->seq_len(), in->batch(), in->x_type() == hk::io::DType::float16, precision,
                         planned, mem_cap);
    if (o.batch_chunk > 0) {
      sizing.chunk = std::min<int64_t>(o.batch_chunk, in->batch());
      sizing.basis = "--batch-chunk";
    }
    if (sizing.chunk > std::numeric_limits<int>::max())
      throw hk::Error("--batch-chunk " + std::to_string(sizing.chunk) + " is too large (at most 2^31-1 sequences)");
    // The output's and the buffers' knobs, checked here so that a bad value is one agreed error
    // (they are read where they are used, which may be only on some paths).
#if HK_HAVE_MPI
    if (job.size() > 1) hk::tune::knob_choice("HK_MPIIO_WRITE", hk::io::ParallelOutputFile::write_modes());
#endif
    hk::tune::knob_choice("HK_WRITE_BACK", {"async", "inline", "off"});
    hk::tune::knob_choice("HK_HOST_HUGEPAGES", {"1", "0"});
    // The ranks create the output together; a directory one of them cannot write (another node's
    // view of it, a read-only mount) is found here, before anything collective, so that it is one
    // clean error naming that rank.
    if (job.size() > 1 && !o.explain) {
      std::filesystem::path dir = std::filesystem::path(output).parent_path();
      if (dir.empty()) dir = ".";
      if (::access(dir.c_str(), W_OK | X_OK) != 0)
        throw hk::Error(output + ": /: cannot create the temporary output file in " + dir.string() + " (" +
                        std::strerror(errno) + ")");
    }
  } catch (const std::bad_alloc&) {
    setup_error = "out of memory (a smaller --batch-chunk needs less)";
  } catch (const std::exception& e) {
    setup_error = e.what();
  }
  agree(setup_error);
  // One chunk grid for the whole job (the smallest any rank planned: the same on every rank
  // unless the ranks guessed different backends).
  const int64_t chunk = job.min(sizing.chunk);
  const int64_t B = in->batch();
  const int S = in->seq_len(), D = in->d_model();
  const bool x_half = in->x_type() == hk::io::DType::float16;
  const hk::app::ChunkGrid grid{B, chunk, job.rank(), job.size()};
  if (child) child->start(chunk, job.rank(), job.size());  // a rank's child reads that rank's chunks of x

  // The backend, the device and the engine: resolved while the reader already reads the first
  // chunks (the pipeline's set-up stage; --explain calls it alone). The CUDA engine (weights
  // upload, activation arena, library handles) is then built on its own thread while the output
  // file is created and the first chunks are read; the compute stage waits for it before its
  // first chunk. Its failures then end the run from there. The kokkos engine is built here
  // (Kokkos is initialised on the thread that uses it).
  std::string backend_name;
  int device = first_device;
  int64_t engine_batch = chunk;  // sequences per engine forward: a chunk is computed in pieces of this many
  std::unique_ptr<hk::Engine> engine;
  double engine_s = 0, warm_s = 0;  // before the future: the build thread writes them until it is joined
  std::future<std::unique_ptr<hk::Engine>> engine_future;
  const char* const kEngineOom = "out of memory creating the engine (a smaller --batch-chunk needs less)";
  const auto start_engine = [&] {
    try {
      // The backend "auto" resolves to; an unknown or unusable one is an agreed setup error here.
      {
        Span span(tr, "backend (waits for the probe)");
        backend_name = hk::select_backend(o.backend).name();
      }
      hk::app::DeviceMemory dev;
      int ranks_per_device = 1;
      if (backend_name == "cuda") {
        // One GPU per rank of a node, round robin (CUDA_VISIBLE_DEVICES set per rank gives 1 GPU each).
        const int gpus = hk::app::cuda_device_count();
        if (!o.device_given && job.mpi() && gpus > 0) device = job.local_rank() % gpus;
        const int node_gpus = node_gpu_count > 0 ? node_gpu_count : gpus;  // the ranks of a node share these
        if (node_gpus > 0) ranks_per_device = (job.local_size() + node_gpus - 1) / node_gpus;
        const auto t_query = clock::now();
        Span span(tr, "free device memory (wait)");
        if (early_device.valid()) dev = early_device.get();  // the context's figure, once it is made
        if (!dev.known || dev.device != device) dev = hk::app::device_memory_nvml(device);  // not the device it guessed
        if (!dev.known) dev = hk::app::device_memory(device);
        device_query_s = std::chrono::duration<double>(clock::now() - t_query).count();
      }
      // --batch-chunk fixes the pieces too (the same chunk gives the same bits); --engine-batch sets them.
      if (o.engine_batch > 0) {
        engine_batch = std::min(chunk, o.engine_batch);
        if (engine_batch < chunk) sizing.basis += std::string(sizing.basis.empty() ? "" : ", ") + "--engine-batch";
      } else if (o.batch_chunk == 0)
        engine_batch = engine_batch_for(model->config, S, x_half, precision, backend_name, planned, chunk, mem_cap,
                                        dev, ranks_per_device, &sizing.basis);
    } catch (const std::bad_alloc&) {
      setup_error = "out of memory (a smaller --batch-chunk needs less)";
    } catch (const std::exception& e) {
      setup_error = e.what();
    }
    agree(setup_error);
    engine_batch = job.min(engine_batch);  // the same pieces on every rank: the same bits
    try {
      hk::EngineOptions eo;
      eo.backend = o.backend;
      eo.precision = precision;
      eo.max_batch = int(engine_batch);
      eo.seq_len = S;
      eo.device = device;
      // The whole file, not this rank's share: every rank of a job makes the same library choice
      // (HK_LIBRARIES), so the output's bits do not depend on the number of ranks.
      eo.job_tokens = B * int64_t(S);
      const auto build = [&model, eo, &engine_s, &tr] {
        const auto t = clock::now();
        Span span(tr, "engine build");
        auto e = hk::make_engine(*model, eo);
        engine_s = std::chrono::duration<double>(clock::now() - t).count();
        return e;
      };
      if (backend_name == "cuda" && !o.explain) {
        // The engine thread also pays the first forward's one-time costs (planning, library set-up,
        // graph capture: ~0.2 s on an H200) for this rank's first piece, while the reader reads.
        int64_t warm_b = 0, warm_tokens = 0;
        if (grid.local_chunks() > 0) {
          const int64_t k = grid.global_index(0);
          warm_b = std::min(engine_batch, grid.rows(k));
          warm_tokens = in->valid_tokens(grid.first_row(k), warm_b);
        }
        engine_future = std::async(std::launch::async, [build, &tr, warm_b, warm_tokens, &warm_s] {
          tr.name_thread("engine");  // build by value: it is local to this block
          auto e = build();
          const auto t = clock::now();
          if (warm_b > 0) {
            Span span(tr, "engine warm-up (first chunk's plan)");
            e->warm_up(int(warm_b), warm_tokens);
          }
          warm_s = std::chrono::duration<double>(clock::now() - t).count();
          return e;
        });
      }
      else
        engine = build();
    } catch (const std::bad_alloc&) {
      setup_error = kEngineOom;
    } catch (const std::exception& e) {
      setup_error = e.what();
    }
    agree(setup_error);
  };
  // Waits for the engine when it is being built; then the model's host copy can go.
  const auto await_engine = [&] {
    if (engine_future.valid()) {
      try {
        engine = engine_future.get();
      } catch (const std::bad_alloc&) {
        throw hk::Error(kEngineOom);
      }
    }
    model.reset();  // the engine holds its own copy of the weights
  };

  const int64_t n_chunks = grid.chunks();
  if (o.explain) {
    start_engine();
    // --explain validates the files whole, as a run would, before printing the plan.
    if (child) {
      try {
        child->finish(interrupted);
      } catch (const hk::Error& e) {
        setup_error = e.what();
      }
      agree(setup_error);
    }
    if (job.rank() == 0) {
      std::printf("%s: %s x [%lld, %d, %d] with %s (D=%d H=%d F=%d L=%d causal=%d), %lld chunk(s) of <= %lld sequences "
                  "(%s)%s\n",
                  kProgram, input.c_str(), (long long)B, S, D, model_path.c_str(), model->config.d_model,
                  model->config.n_heads, model->config.ffn_dim, model->config.n_layers, int(model->config.causal),
                  (long long)n_chunks, (long long)chunk, sizing.basis.empty() ? "whole batch" : sizing.basis.c_str(),
                  job.size() > 1 ? (", " + std::to_string(job.size()) + " ranks").c_str() : "");
      std::printf("backend %s, device %s, precision %s\n", engine->backend().c_str(), engine->device().c_str(),
                  hk::to_string(engine->precision()));
      std::printf("%s", engine->explain(int(engine_batch)).c_str());
    }
    return 0;
  }

  // From here on a rank's failure ends the whole job (its peers may wait in a collective call).
  std::unique_ptr<Output> out;
  std::mutex out_m;  // `out` is made on the main thread while the reader (whose failure is fatal) runs
  auto fatal = [&](const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(out_m);
      if (out) out->discard();
    }
    job.abort(kProgram, g_interrupted ? "interrupted; no output written" : what, g_interrupted ? 130 : 1);
  };
  hk::app::PipelineStats st;
  std::shared_ptr<void> chunk_buffers;  // released after the commit (unpinning takes a while)
  std::atomic<int64_t> rows_read{0};  // the end of the furthest chunk the reader started reading
  // The child's share of the run, for --stats: its own time, the time this process was blocked
  // on it, and how far it had validated (rows of this rank's chunks).
  const auto validation_stats = [&] {
    char buf[160];
    const int64_t v = child ? std::min(child->rows_validated(), B) : B;
    std::snprintf(buf, sizeof buf, " validate_s=%.3f validate_wait_s=%.3f rows_validated=%lld rows_read=%lld",
                  child ? child->child_seconds() : 0.0, child ? child->blocked_seconds() : 0.0, (long long)v,
                  (long long)rows_read.load());
    return std::string(buf);
  };
  // A failed run's --stats line: how far each side got (single process; a failing rank of a job
  // ends the job from inside the pipeline).
  const auto print_failure_stats = [&] {
    if (!o.stats) return;
    std::printf("%s: stats: rank=%d ranks=%d chunk=%lld chunks=%lld failed=1%s\n", kProgram, job.rank(), job.size(),
                (long long)chunk, (long long)n_chunks, validation_stats().c_str());
    std::fflush(stdout);
  };
  Progress progress(job.rank() == 0 && n_chunks > 1 && (o.progress || (!o.quiet && ::isatty(STDERR_FILENO))), B * S);
  const auto t_loop = clock::now();
  double commit_s = 0, check_s = 0;  // check_s: the compute stage's finiteness scan of y
  try {
    const bool has_lengths = in->has_lengths();
    const int64_t local_tokens = std::max<int64_t>(1, [&] {
      int64_t t = 0;
      for (int64_t i = 0; i < grid.local_chunks(); ++i) t += grid.rows(grid.global_index(i));
      return t;
    }() * S);
    hk::app::PipelineStages stages;
    stages.setup = [&] {
      start_engine();
      const auto t_output = clock::now();
      Span span(tr, "create the output file");
      std::lock_guard<std::mutex> lock(out_m);  // a failing reader's `fatal` waits for it, then removes it
      out = std::make_unique<Output>(output, B, S, D, job);
      output_s = std::chrono::duration<double>(clock::now() - t_output).count();
      return backend_name == "cuda" ? device : -1;  // page-locked chunk buffers for the GPU
    };
    stages.prepare = await_engine;
    stages.read = [&](int64_t b0, int64_t nb, float* x, int32_t* lengths) {
      if (child) {
        Span span(tr, "wait for the validation child");
        child->wait_rows(b0 + nb, interrupted);  // never touch rows the child has not survived
      }
      rows_read.store(std::max<int64_t>(rows_read.load(), b0 + nb));
      Span span(tr, "HDF5 read and input check");
      in->read(b0, nb, x, lengths);
    };
    stages.compute = [&](int64_t b0, int64_t nb, const float* x, const int32_t* lengths, float* y) {
      for (int64_t p = 0; p < nb; p += engine_batch) {  // one piece unless the engine holds fewer
        Span span(tr, "engine forward (copies in and out)");
        const int64_t np = std::min(engine_batch, nb - p), at = p * S * D;
        engine->forward(x + at, has_lengths ? lengths + p : nullptr, int(np), y + at);
      }
      // MODEL.md: a finite input never yields NaN/Inf. Refuse to write one rather than pass it on.
      const auto t_check = clock::now();
      std::string bad;
      {
        Span span(tr, "finiteness check of y");
        bad = first_nonfinite(y, nb * S * D, b0, S, D);
      }
      check_s += std::chrono::duration<double>(clock::now() - t_check).count();
      if (!bad.empty())
        throw hk::Error(output + ": /output/y: backend " + engine->backend() + " produced a non-finite value at " + bad +
                        " from a finite input (a bug; nothing was written)");
    };
    // Whole rows, padded positions included (zero in y: MODEL.md). Leaving the padded positions
    // unwritten (the writer's lengths argument: one write per sequence prefix, holes in the file)
    // halves the bytes but measured slower on the GPU machine's ext4 page cache: case 6's chunk
    // writes went from ~22 ms to ~50 ms (perf/RESULTS.md, 2026-11-29): one contiguous write per
    // chunk is faster than a thousand short ones. Copying only the prefixes into the mapping of
    // HK_MPIIO_WRITE=mmap measured no better either (2 ranks: 1.46 s vs posix 1.36 s, one call).
    stages.write = [&](int64_t b0, int64_t nb, const float* y, const int32_t*) { out->write(b0, nb, y, nullptr); };
    stages.progress = [&](const hk::app::PipelineStats& s) {
      // Rank 0's share of the job stands for the whole (round robin keeps the ranks level).
      const int64_t done = int64_t(double(s.sequences_done) * S / double(local_tokens) * double(B * S));
      progress.update(std::min(done, B * S), std::chrono::duration<double>(clock::now() - t_loop).count(), s);
    };
    stages.interrupted = [] { return g_interrupted != 0; };
    if (job.mpi()) stages.fatal = fatal;
    {
      Span span(tr, "pipeline");
      st = hk::app::run_pipeline(grid, S, D, planned == "cuda" ? std::max(0, o.device) : -1, stages, &chunk_buffers);
    }
    await_engine();  // a rank without chunks never ran the compute stage
    std::unique_ptr<Span> attr_span = std::make_unique<Span>(tr, "output attributes");
    // Attributes now that the engine is known (collective in a job: every rank, same order).
    out->set_attribute("precision", hk::to_string(engine->precision()));
    out->set_attribute("backend", engine->backend());
    out->set_attribute("device", engine->device());
    out->set_attribute("program", std::string(kProgram) + " " + HK_VERSION);
    out->set_attribute("version", HK_VERSION);
    out->set_attribute("input_file", input);
    out->set_attribute("model_file", model_path);
    out->set_attribute("batch_chunk", std::to_string(chunk));
    out->set_attribute("engine_batch", std::to_string(engine_batch));  // the pieces: with the chunk, they fix the bits
    out->set_attribute("ranks", std::to_string(job.size()));
    attr_span.reset();
    if (child) {
      Span span(tr, "validation child: finish");
      child->finish(interrupted);  // the child's last word comes before the output is final
    }
    const auto t_commit = clock::now();
    Span span(tr, "commit (fsync, rename)");
    out->commit();
    commit_s = std::chrono::duration<double>(clock::now() - t_commit).count();
  } catch (const hk::CollectiveError& e) {
    // Every rank failed here with this message (a collective step: the output's creation): one
    // line for the job, from rank 0, and every rank leaves with status 1 (no MPI_Abort needed).
    {
      std::lock_guard<std::mutex> lock(out_m);
      if (out) out->discard();
    }
    print_failure_stats();
    if (job.rank() == 0) hk::app::report_error(kProgram, e.what());
    throw hk::app::AgreedFailure{1};
  } catch (const std::bad_alloc&) {
    if (job.mpi()) fatal("out of memory (a smaller --batch-chunk or --mem-cap needs less)");
    print_failure_stats();
    throw;
  } catch (const std::exception& e) {
    if (job.mpi()) fatal(e.what());
    print_failure_stats();
    throw;
  }
  progress.finish();

  const double total_s = std::chrono::duration<double>(clock::now() - t0).count();
  const double compute_max = job.max(st.compute_s);
  if (!o.quiet && job.rank() == 0) {
    const double tokens = double(B) * S;
    std::printf("%s: %s tokens (B=%lld, S=%d) in %.3f s (%s tokens/s; compute %.3f s, %s tokens/s; read %.3f s, "
                "write %.3f s), backend %s, device %s, precision %s%s -> %s\n",
                kProgram, human(tokens).c_str(), (long long)B, S, total_s, human(tokens / total_s).c_str(), compute_max,
                human(compute_max > 0 ? tokens / compute_max : 0.0).c_str(), st.read_s, st.write_s,
                engine->backend().c_str(), engine->device().c_str(), hk::to_string(engine->precision()),
                job.size() > 1 ? (", " + std::to_string(job.size()) + " ranks").c_str() : "", output.c_str());
  }
  // The engine's teardown (device memory, graphs, library handles), timed for --stats; the CUDA
  // context itself goes at process exit.
  const std::string engine_stats = engine->stats();  // its own set-up work (plans, graphs), for --stats
  const auto t_release = clock::now();
  {
    Span span(tr, "engine and chunk buffers release");
    engine.reset();
    chunk_buffers.reset();
  }
  const double release_s = std::chrono::duration<double>(clock::now() - t_release).count();
  if (o.stats) {
    std::printf("%s: stats: rank=%d ranks=%d chunk=%lld chunks=%lld engine_batch=%lld local_chunks=%lld mem_cap=%lld "
                "peak_rss_kib=%lld read_s=%.3f compute_s=%.3f write_s=%.3f wall_s=%.3f setup_s=%.3f header_s=%.3f "
                "device_query_s=%.3f output_s=%.3f engine_s=%.3f warm_s=%.3f "
                "engine_wait_s=%.3f pin_s=%.3f pinned=%d/%d check_s=%.3f commit_s=%.3f release_s=%.3f "
                "t0_unix=%.3f stats_unix=%.3f%s%s%s\n",
                kProgram, job.rank(), job.size(), (long long)chunk, (long long)n_chunks, (long long)engine_batch,
                (long long)grid.local_chunks(), (long long)mem_cap, (long long)peak_rss_kib(), st.read_s, st.compute_s,
                st.write_s, total_s, std::chrono::duration<double>(t_loop - t0).count(), header_s, device_query_s,
                output_s, engine_s, warm_s, st.prepare_s,
                st.pin_s, st.pinned, st.pin_tried, check_s, commit_s, release_s, unix_s(t0_unix),
                unix_s(std::chrono::system_clock::now()), validation_stats().c_str(),
                engine_stats.empty() ? "" : " ", engine_stats.c_str());
  }
  if (tr.on()) {
    std::string path = o.trace;
    if (job.size() > 1) {  // one file per rank: <stem>.rank<k><extension>
      const std::filesystem::path p(o.trace);
      path = (p.parent_path() / (p.stem().string() + ".rank" + std::to_string(job.rank()) + p.extension().string())).string();
    }
    const std::string why = tr.write(path, job.rank());
    if (!why.empty()) std::fprintf(stderr, "%s: warning: --trace: %s\n", kProgram, why.c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Runs the hk transformer forward pass (MODEL.md) on an HDF5 input of FORMAT.md and writes /output/y.\n"
               "With no --input, runs the shipped sample (sample.h5) and writes hk_out.h5.",
               kProgram};
  Options o;
  app.add_option("--input", o.input, "HDF5 file holding /input (and /model unless --model is given)");
  app.add_option("--model", o.model, "HDF5 file holding /model (default: the input file)");
  app.add_option("--output", o.output, "output HDF5 file to write (default: hk_out.h5)");
  app.add_option("--precision", o.precision, "fast (tensor cores, fp32 accumulation), fp32, or reference (float64)")
      ->check(CLI::IsMember({"fast", "fp32", "reference"}))
      ->capture_default_str();
  app.add_option("--backend", o.backend, "auto (cuda when a GPU is usable, else kokkos), kokkos or cuda")
      ->check(CLI::IsMember({"auto", "kokkos", "cuda"}))
      ->capture_default_str();
  app.add_option("--device", o.device,
                 "GPU ordinal for the cuda backend (default 0; under mpirun / srun: the node-local rank modulo "
                 "the GPUs visible)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch-chunk,--chunk", o.batch_chunk,
                 "sequences per chunk (default: sized from memory: kokkos within a host cap of 1 GiB or --mem-cap; "
                 "cuda about 64 MiB of x, computed in pieces the free device memory holds); the same chunk gives "
                 "the same bits whatever the rank count")
      ->check(CLI::PositiveNumber);
  app.add_option("--engine-batch", o.engine_batch,
                 "at most this many sequences per forward of the engine: a chunk is computed in pieces (default: "
                 "the chunk, or what the free device memory holds); the pieces fix the bits, as --batch-chunk does")
      ->check(CLI::PositiveNumber);
  app.add_option("--mem-cap", o.mem_cap,
                 "host memory (bytes; K, M, G suffixes) for what grows with the chunk: chunk buffers, the kokkos "
                 "engine's activations, the HDF5 chunk cache of x; the chunk is sized to fit (per rank)");
  app.add_flag("--stats", o.stats,
               "print a line of statistics per rank on stdout: chunking, peak resident memory (VmHWM), busy "
               "time of read, compute and write, the set-up before the pipeline (setup_s), the engine's build "
               "(engine_s, beside the first reads for cuda) and warm-up (warm_s) and the compute stage's wait for "
               "them (engine_wait_s), "
               "page-locking the chunk buffers (pin_s), the finiteness check of y (check_s), the commit, the "
               "validation child's time and the time spent waiting for it, the wall clock (unix seconds) when "
               "the run's clock started and when the line was printed (t0_unix, stats_unix: set against a "
               "launcher's clock, the process's start-up and exit) (a failed single-process run prints how far "
               "the child and the reader got)");
  app.add_option("--trace", o.trace,
                 "write a timeline of the run to FILE (Chrome trace-event JSON, for Perfetto or chrome://tracing): "
                 "set-up, start-up and engine threads, each chunk's read, compute and write and the waits between "
                 "them; per rank as FILE's stem + .rank<k> in a job of several ranks");
  app.add_flag("--quiet", o.quiet, "no summary line (errors are still printed)");
  app.add_flag("--progress", o.progress, "show the progress bar even when stderr is not a terminal");
  app.add_flag("--explain", o.explain,
               "validate the files, print the kernel plan and exit without computing the input; a tuning "
               "engine (HK_TUNE) first measures its route decisions on a synthetic batch and prints each "
               "candidate's time");
  app.add_flag("--no-fork-validate", o.no_fork_validate,
               "skip validating the files in a forked child (that child, running just ahead of the reading, "
               "turns a crash of the HDF5 library on a damaged file into a clean error, at the cost of a "
               "second pass over the input: a walk of x's chunk index when x has no filters, a second read "
               "when it has)");
  app.add_option("--validate-timeout", o.validate_timeout,
                 "seconds without progress after which the validation child counts as hung inside the HDF5 "
                 "library (a clean error; 0: wait forever)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--knobs", o.knobs, "print every HK_* environment variable (values, default, current value) and exit");
  app.set_version_flag("--version", version_string());
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help / --version: 0; usage errors: 2
  }

  if (o.knobs) {
    std::printf("%s", hk::tune::describe_knobs().c_str());
    return 0;
  }
  o.device_given = app.count("--device") > 0;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  // A file-size limit (ulimit -f) reached while writing: the write fails with EFBIG and the run
  // ends with its error line, instead of the default SIGXFSZ kill without one.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    return run(o, &argc, &argv);
  } catch (const hk::app::AgreedFailure& f) {
    return f.code;  // already reported, once for the whole job
  } catch (const hk::Error& e) {
    if (g_interrupted) {
      hk::app::report_error(kProgram, "interrupted; no output written");
      return 130;
    }
    return hk::app::report_error(kProgram, e.what());
  } catch (const std::bad_alloc&) {
    return hk::app::report_error(kProgram, "out of memory (a smaller --batch-chunk needs less)");
  } catch (const std::exception& e) {
    return hk::app::report_error(kProgram, e.what());
  }
}
