// hk_forward: the transformer forward pass of MODEL.md on an HDF5 input (FORMAT.md), written
// to an HDF5 output. Everything is validated before any compute; the input streams through in
// batch chunks (the next chunk is read while the current one computes); the output appears
// atomically only when the whole run succeeded.
//
// Exit status: 0 success, 1 bad file / bad arguments / runtime failure (one line on stderr),
// 2 command-line usage error, 130 interrupted.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "app_common.hpp"
#include "validate_child.hpp"
#include "hk/build_config.hpp"
#include "hk/engine.hpp"
#include "hk/error.hpp"
#include "hk/io/io.hpp"
#include "hk/tune/knobs.hpp"

namespace {

constexpr const char* kProgram = "hk_forward";

struct Options {
  std::string input, model, output;
  std::string precision = "fast";
  std::string backend = "auto";
  int device = 0;
  int64_t batch_chunk = 0;  // 0: sized from the memory budget below
  bool quiet = false, progress = false, explain = false, knobs = false;
  bool no_fork_validate = false;
  int validate_timeout = 300;  // seconds without progress before the validation child counts as hung
};

// Activations of one chunk stay near this many bytes on the compute device by default.
constexpr double kChunkBudgetBytes = 256.0 * (1 << 20);

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_signal(int sig) {
  g_interrupted = 1;
  std::signal(sig, SIG_DFL);  // a second signal ends the process at once
}

std::string version_string() {
  std::string names;
  for (const hk::Backend* b : hk::backends()) names += (names.empty() ? "" : ", ") + b->name();
  return std::string(kProgram) + " " + HK_VERSION + " (backends: " + names + "; HDF5 " + hk::io::hdf5_library_version() +
         "; " + HK_BUILD_TYPE + ")";
}

// The backend "auto" resolves to, for sizing the default chunk ("" when none is usable).
std::string resolved_backend(const std::string& requested) {
  if (requested != "auto") return requested;
  for (const hk::Backend* b : hk::backends())
    if (b->unavailable_reason().empty()) return b->name();
  return "";
}

// Sequences per chunk so that one chunk's working set stays near kChunkBudgetBytes: the
// residual stream, LayerNorm output, q/k/v/o, projections and the FFN hidden layer per token,
// plus the [H, S, S] score matrix on the host backend (which materialises it).
int64_t default_batch_chunk(const hk::ModelConfig& c, int S, int64_t B, hk::Precision p, const std::string& backend) {
  const double elt = p == hk::Precision::reference ? 8.0 : 4.0;
  double per_seq = elt * double(S) * (16.0 * c.d_model + 2.0 * c.ffn_dim);
  if (backend == "kokkos") per_seq += elt * double(c.n_heads) * S * S;
  const int64_t n = int64_t(std::max(1.0, std::floor(kChunkBudgetBytes / per_seq)));
  return std::min(n, B);
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
// (--progress into a log) one line per second.
class Progress {
 public:
  Progress(bool enabled, int64_t total_tokens)
      : enabled_(enabled), tty_(::isatty(STDERR_FILENO) == 1), total_(total_tokens) {}
  void update(int64_t done, double elapsed) {
    if (!enabled_) return;
    if (done < total_ && elapsed - last_ < (tty_ ? 0.1 : 1.0)) return;
    last_ = elapsed;
    const double frac = total_ > 0 ? double(done) / double(total_) : 1.0;
    const int width = 30, fill = int(frac * width);
    const double rate = elapsed > 0 ? double(done) / elapsed : 0.0;
    const double eta = rate > 0 ? double(total_ - done) / rate : 0.0;
    std::fprintf(stderr, "%s%3d%% [%s%s] %s/%s tokens  %s tokens/s  ETA %s%s", tty_ ? "\r" : "", int(frac * 100.0),
                 std::string(size_t(fill), '#').c_str(), std::string(size_t(width - fill), '.').c_str(),
                 human(double(done)).c_str(), human(double(total_)).c_str(), human(rate).c_str(),
                 clock_string(eta).c_str(), tty_ ? " " : "\n");
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

// The first non-finite element of y [nb, S, D], as "[b, s, d]", or "".
std::string first_nonfinite(const std::vector<float>& y, int64_t n, int64_t b0, int S, int D) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(y[size_t(i)])) {
      const int64_t per = int64_t(S) * D;
      return "[" + std::to_string(b0 + i / per) + ", " + std::to_string((i / D) % S) + ", " + std::to_string(i % D) + "]";
    }
  return "";
}

int run(const Options& o) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const std::string input = o.input.empty() ? hk::app::find_data_file("sample.h5") : o.input;
  const std::string model_path = o.model.empty() ? input : o.model;
  const std::string output = o.output.empty() ? "hk_out.h5" : o.output;
  if (hk::app::same_file(output, input) || hk::app::same_file(output, model_path))
    throw hk::Error(output + ": /: expected an output path other than the input and model files, found the same file");
  const hk::Precision precision = hk::precision_from_string(o.precision);

  // ---- reliability: validate in a forked child first, so that a crash inside libhdf5 on a
  // crafted file becomes a clean error here (validate_child.hpp). No thread exists yet.
  if (!o.no_fork_validate) hk::app::validate_in_child(model_path, input, o.validate_timeout);
  // ---- end of the child validation

  // Validation: the whole model, the input's shapes, types and lengths (x is checked per chunk).
  const hk::Model model = hk::io::read_model(model_path);
  hk::io::InputFile in(input, model.config);
  const int64_t B = in.batch();
  const int S = in.seq_len(), D = in.d_model();
  const std::string backend_name = resolved_backend(o.backend);
  const int64_t chunk = o.batch_chunk > 0 ? std::min<int64_t>(o.batch_chunk, B)
                                          : default_batch_chunk(model.config, S, B, precision, backend_name);
  if (chunk > std::numeric_limits<int>::max())
    throw hk::Error("--batch-chunk " + std::to_string(chunk) + " is too large (at most 2^31-1 sequences)");

  hk::EngineOptions eo;
  eo.backend = o.backend;
  eo.precision = precision;
  eo.max_batch = int(chunk);
  eo.seq_len = S;
  eo.device = o.device;
  std::unique_ptr<hk::Engine> engine = hk::make_engine(model, eo);

  const int64_t n_chunks = (B + chunk - 1) / chunk;
  if (o.explain) {
    std::printf("%s: %s x [%lld, %d, %d] with %s (D=%d H=%d F=%d L=%d causal=%d), %lld chunk(s) of <= %lld sequences\n",
                kProgram, input.c_str(), (long long)B, S, D, model_path.c_str(), model.config.d_model,
                model.config.n_heads, model.config.ffn_dim, model.config.n_layers, int(model.config.causal),
                (long long)n_chunks, (long long)chunk);
    std::printf("backend %s, device %s, precision %s\n", engine->backend().c_str(), engine->device().c_str(),
                hk::to_string(engine->precision()));
    std::printf("%s", engine->explain(int(chunk)).c_str());
    return 0;
  }

  hk::io::OutputFile out(output, B, S, D);
  out.set_attribute("precision", hk::to_string(engine->precision()));
  out.set_attribute("backend", engine->backend());
  out.set_attribute("device", engine->device());
  out.set_attribute("program", std::string(kProgram) + " " + HK_VERSION);
  out.set_attribute("version", HK_VERSION);
  out.set_attribute("input_file", input);
  out.set_attribute("model_file", model_path);
  out.set_attribute("batch_chunk", std::to_string(chunk));

  // Two input buffers: chunk k + 1 is read on another thread while chunk k computes. The
  // buffers outlive the future, whose destructor waits for a read still in flight.
  const size_t chunk_elems = size_t(chunk) * size_t(S) * size_t(D);
  std::vector<float> x[2] = {std::vector<float>(chunk_elems), std::vector<float>(n_chunks > 1 ? chunk_elems : 0)};
  std::vector<int32_t> lengths[2] = {std::vector<int32_t>(size_t(chunk)), std::vector<int32_t>(size_t(chunk))};
  std::vector<float> y(chunk_elems);
  const bool has_lengths = in.has_lengths();
  auto read_chunk = [&](int64_t k) {
    const int64_t b0 = k * chunk, nb = std::min(chunk, B - b0);
    in.read(b0, nb, x[k % 2].data(), lengths[k % 2].data());
  };

  Progress progress(n_chunks > 1 && (o.progress || (!o.quiet && ::isatty(STDERR_FILENO))), B * S);
  double compute_s = 0.0;
  const auto t_loop = clock::now();
  std::future<void> pending = std::async(std::launch::async, read_chunk, int64_t(0));
  for (int64_t k = 0; k < n_chunks; ++k) {
    pending.get();  // rethrows a read or validation failure of chunk k
    if (k + 1 < n_chunks) pending = std::async(std::launch::async, read_chunk, k + 1);
    if (g_interrupted) throw hk::Error("interrupted");
    const int64_t b0 = k * chunk, nb = std::min(chunk, B - b0);
    const auto tc = clock::now();
    engine->forward(x[k % 2].data(), has_lengths ? lengths[k % 2].data() : nullptr, int(nb), y.data());
    compute_s += std::chrono::duration<double>(clock::now() - tc).count();
    // MODEL.md: a finite input never yields NaN/Inf. Refuse to write one rather than pass it on.
    const std::string bad = first_nonfinite(y, nb * S * D, b0, S, D);
    if (!bad.empty())
      throw hk::Error(output + ": /output/y: backend " + engine->backend() + " produced a non-finite value at " + bad +
                      " from a finite input (a bug; nothing was written)");
    out.write(b0, nb, y.data());
    progress.update((b0 + nb) * S, std::chrono::duration<double>(clock::now() - t_loop).count());
  }
  out.commit();
  progress.finish();

  const double total_s = std::chrono::duration<double>(clock::now() - t0).count();
  if (!o.quiet) {
    const double tokens = double(B) * S;
    std::printf("%s: %s tokens (B=%lld, S=%d) in %.3f s (%s tokens/s; compute %.3f s, %s tokens/s), backend %s, "
                "device %s, precision %s -> %s\n",
                kProgram, human(tokens).c_str(), (long long)B, S, total_s, human(tokens / total_s).c_str(), compute_s,
                human(compute_s > 0 ? tokens / compute_s : 0.0).c_str(), engine->backend().c_str(),
                engine->device().c_str(), hk::to_string(engine->precision()), output.c_str());
  }
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
  app.add_option("--device", o.device, "GPU ordinal for the cuda backend")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--batch-chunk", o.batch_chunk, "sequences per chunk (default: sized to ~256 MiB of activations)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--quiet", o.quiet, "no summary line (errors are still printed)");
  app.add_flag("--progress", o.progress, "show the progress bar even when stderr is not a terminal");
  app.add_flag("--explain", o.explain,
               "validate the files, print the kernel plan and exit without computing the input; a tuning "
               "engine (HK_TUNE) first measures its route decisions on a synthetic batch and prints each "
               "candidate's time");
  app.add_flag("--no-fork-validate", o.no_fork_validate,
               "skip validating the files in a forked child first (that child turns a crash of the HDF5 "
               "library on a damaged file into a clean error, at the cost of reading the input twice)");
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
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  try {
    return run(o);
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
