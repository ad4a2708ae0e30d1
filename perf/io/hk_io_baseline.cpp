// hk_io_baseline: the HDF5 floor under an hk_forward run. Reads /input/x and /input/lengths of
// a contract file through hk's own io layer (InputFile, in batch chunks, as hk_forward does) and
// writes an output file of the same shape through OutputFile (temporary file, fsync, rename),
// with y a copy of x: no model, no compute. hk_forward's end-to-end time over this one is the
// cost of everything that is not reading and writing the files (perf/device/run.sh, phase e2e).
//
// Exit status: 0 success, 1 bad file / write failure (one line on stderr), 2 usage error.
#include <CLI/CLI.hpp>
#include <csignal>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>

#include "app_common.hpp"
#include "hk/build_config.hpp"
#include "hk/error.hpp"
#include "hk/io/io.hpp"

namespace {

constexpr const char* kProgram = "hk_io_baseline";

struct Options {
  std::string input, output;
  int64_t chunk = 0;  // 0: the whole batch
  bool quiet = false;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int run(const Options& o) {
  const auto t0 = Clock::now();
  if (hk::app::same_file(o.output, o.input))
    throw hk::Error(o.output + ": /: expected an output path other than the input file, found the same file");

  // Opening validates the shapes, types and every length, as hk_forward's InputFile does; the
  // chunk cache is the one hk_forward uses without --mem-cap.
  auto t = Clock::now();
  hk::io::InputFile in(o.input);
  double read_s = seconds_since(t);
  const int64_t B = in.batch();
  const int S = in.seq_len(), D = in.d_model();
  const int64_t per_seq = int64_t(S) * D;
  const int64_t chunk = std::min<int64_t>(o.chunk > 0 ? o.chunk : B, B);
  if (chunk > std::numeric_limits<int64_t>::max() / per_seq / int64_t(sizeof(float)))
    throw hk::Error("--chunk " + std::to_string(chunk) + " is too large for sequences of " + std::to_string(per_seq) +
                    " floats");
  // Left uninitialised: zero-filling 655 MB would add time that is not I/O to the floor.
  std::unique_ptr<float[]> x(new float[size_t(chunk * per_seq)]);
  std::unique_ptr<int32_t[]> lengths(new int32_t[size_t(chunk)]);

  t = Clock::now();
  hk::io::OutputFile out(o.output, B, S, D);
  out.set_attribute("program", std::string(kProgram) + " " + HK_VERSION);
  out.set_attribute("note", "y is a copy of /input/x: an I/O baseline, not a forward pass");
  out.set_attribute("input_file", o.input);
  out.set_attribute("batch_chunk", std::to_string(chunk));
  double write_s = seconds_since(t);

  int64_t chunks = 0;
  for (int64_t b0 = 0; b0 < B; b0 += chunk, ++chunks) {
    const int64_t nb = std::min(chunk, B - b0);
    t = Clock::now();
    in.read(b0, nb, x.get(), lengths.get());
    read_s += seconds_since(t);
    t = Clock::now();
    out.write(b0, nb, x.get());
    write_s += seconds_since(t);
  }
  t = Clock::now();
  out.commit();  // flush, fsync, rename: what hk_forward's output pays too
  write_s += seconds_since(t);
  const double total_s = seconds_since(t0);

  if (!o.quiet) {
    const double bytes = double(B) * double(per_seq) * sizeof(float);
    std::printf("%s: stats: B=%lld S=%d D=%d chunk=%lld chunks=%lld read_s=%.3f write_s=%.3f total_s=%.3f "
                "bytes=%.0f read_GBps=%.2f write_GBps=%.2f -> %s\n",
                kProgram, (long long)B, S, D, (long long)chunk, (long long)chunks, read_s, write_s, total_s, bytes,
                read_s > 0 ? bytes / read_s / 1e9 : 0.0, write_s > 0 ? bytes / write_s / 1e9 : 0.0, o.output.c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGXFSZ, SIG_IGN);  // a file-size limit: an EFBIG error line instead of a kill
  CLI::App app{"Reads /input/x (and /input/lengths) of an HDF5 input of FORMAT.md in batch chunks and writes an\n"
               "output file of the same shape with y a copy of x (no compute): the I/O floor of hk_forward.",
               kProgram};
  Options o;
  app.add_option("--input", o.input, "HDF5 file holding /input")->required();
  app.add_option("--output", o.output, "output HDF5 file to write (written beside it, then renamed)")->required();
  app.add_option("--batch-chunk,--chunk", o.chunk,
                 "sequences per chunk (default: the whole batch, as hk_forward --backend cuda on a GPU that holds "
                 "it; pass hk_forward's --stats chunk= to match another run)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--quiet", o.quiet, "no statistics line");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return run(o);
  } catch (const std::bad_alloc&) {
    return hk::app::report_error(kProgram, "out of memory (a smaller --chunk needs less)");
  } catch (const std::exception& e) {
    return hk::app::report_error(kProgram, e.what());
  }
}
