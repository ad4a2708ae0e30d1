// hk_generate: writes a seeded synthetic model and input (MODEL.md's standard distribution,
// hk/synthetic.hpp) for a row of cases.csv or for custom dimensions, as HDF5 files of
// FORMAT.md. The same seed gives the same files on any machine.
//
// Exit status: 0 success, 1 bad arguments / write failure, 2 command-line usage error.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "app_common.hpp"
#include "hk/build_config.hpp"
#include "hk/error.hpp"
#include "hk/io/io.hpp"
#include "hk/synthetic.hpp"

namespace {

constexpr const char* kProgram = "hk_generate";

struct Case {
  int id = 0;
  int64_t B = 0;
  int S = 0, D = 0, H = 0, F = 0, L = 0, causal = 1;
  std::string note;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

int64_t parse_int(const std::string& text, const std::string& where) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) throw hk::Error(where + ": expected an integer, found '" + text + "'");
  return v;
}

// cases.csv: case,B,S,D,H,F,L,causal,note
Case read_case(const std::string& path, int id) {
  std::ifstream f(path);
  if (!f) throw hk::Error(path + ": cannot open the cases file");
  std::string line;
  int line_no = 0;
  while (std::getline(f, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("case", 0) == 0) continue;  // blank or header
    const std::vector<std::string> cols = split(line, ',');
    const std::string where = path + ":" + std::to_string(line_no);
    if (cols.size() < 8) throw hk::Error(where + ": expected case,B,S,D,H,F,L,causal[,note], found '" + line + "'");
    if (parse_int(cols[0], where) != id) continue;
    Case c;
    c.id = id;
    c.B = parse_int(cols[1], where + " (B)");
    c.S = int(parse_int(cols[2], where + " (S)"));
    c.D = int(parse_int(cols[3], where + " (D)"));
    c.H = int(parse_int(cols[4], where + " (H)"));
    c.F = int(parse_int(cols[5], where + " (F)"));
    c.L = int(parse_int(cols[6], where + " (L)"));
    c.causal = int(parse_int(cols[7], where + " (causal)"));
    for (size_t i = 8; i < cols.size(); ++i) c.note += (i > 8 ? "," : "") + cols[i];
    return c;
  }
  throw hk::Error(path + ": no case " + std::to_string(id));
}

// "0,1,S,7" -> values; "S" stands for the sequence length.
std::vector<int32_t> parse_lengths_list(const std::string& text, int S) {
  std::vector<int32_t> out;
  for (const std::string& tok : split(text, ',')) {
    const int64_t v = tok == "S" ? S : parse_int(tok, "--lengths-list");
    if (v < 0 || v > S)
      throw hk::Error("--lengths-list: expected values in 0.." + std::to_string(S) + ", found " + std::to_string(v));
    out.push_back(int32_t(v));
  }
  return out;
}

// A file written under a temporary name and renamed into place, so that a failed run leaves
// no half-written file.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), temp_(path_ + ".tmp." + std::to_string(::getpid())) {}
  ~AtomicFile() {
    if (!done_) std::remove(temp_.c_str());
  }
  const std::string& temp() const { return temp_; }
  void commit() {
    if (std::rename(temp_.c_str(), path_.c_str()) != 0)
      throw hk::Error(path_ + ": /: cannot move " + temp_ + " into place");
    done_ = true;
  }

 private:
  std::string path_, temp_;
  bool done_ = false;
};

struct Options {
  std::optional<int> case_id;
  std::string cases;
  std::optional<int64_t> batch;
  std::optional<int> seq, d_model, heads, ffn, layers, causal;
  std::optional<double> eps;
  uint64_t seed = 1;
  std::string weights_dtype = "float32", input_dtype = "float32";
  bool nontrivial_ln = false, full_length = false, no_lengths = false, quiet = false;
  std::string lengths_list;
  std::string output, model_output, input_output;
};

int run(const Options& o) {
  Case c;
  if (o.case_id) {
    c = read_case(o.cases.empty() ? hk::app::find_data_file("cases.csv") : o.cases, *o.case_id);
  } else {
    if (!o.batch || !o.seq || !o.d_model || !o.heads)
      throw hk::Error("without --case, --batch, --seq, --d-model and --heads are required");
    c.L = 4;
    c.causal = 1;
  }
  if (o.batch) c.B = *o.batch;
  if (o.seq) c.S = *o.seq;
  if (o.d_model) c.D = *o.d_model;
  if (o.heads) c.H = *o.heads;
  if (o.ffn) c.F = *o.ffn;
  else if (!o.case_id) c.F = c.D;  // as in every row of cases.csv
  if (o.layers) c.L = *o.layers;
  if (o.causal) c.causal = *o.causal;
  if (c.B > std::numeric_limits<int32_t>::max())
    throw hk::Error("--batch: expected at most 2^31-1 sequences, found " + std::to_string(c.B));
  if (c.B < 1 || c.S < 1) throw hk::Error("expected --batch and --seq >= 1, found B=" + std::to_string(c.B) + " S=" + std::to_string(c.S));
  if (c.causal != 0 && c.causal != 1) throw hk::Error("--causal: expected 0 or 1, found " + std::to_string(c.causal));

  hk::ModelConfig cfg;
  cfg.d_model = c.D;
  cfg.n_heads = c.H;
  cfg.ffn_dim = c.F;
  cfg.n_layers = c.L;
  cfg.causal = c.causal == 1;
  if (o.eps) cfg.eps = *o.eps;
  cfg.validate("hk_generate");
  if (int64_t(c.S) * c.D > std::numeric_limits<int32_t>::max() ||
      c.B > std::numeric_limits<int64_t>::max() / 4 / (int64_t(c.S) * c.D))
    throw hk::Error("B * S * D is too large");

  std::string model_out = o.model_output, input_out = o.input_output;
  if (!o.output.empty()) {
    if (!model_out.empty() || !input_out.empty())
      throw hk::Error("--output writes model and input to one file; it excludes --model-output / --input-output");
    model_out = input_out = o.output;
  }
  if (model_out.empty() && input_out.empty())
    throw hk::Error("nothing to write: give --output, or --model-output and/or --input-output");

  const hk::io::DType wtype = hk::io::dtype_from_string(o.weights_dtype);
  const hk::io::DType xtype = hk::io::dtype_from_string(o.input_dtype);

  std::string lengths_note = "none (every position valid)";
  std::vector<int32_t> lengths;
  if (!o.no_lengths) {
    if (o.full_length) {
      lengths.assign(size_t(c.B), c.S);
      lengths_note = "all " + std::to_string(c.S);
    } else {
      lengths = hk::synthetic_lengths(int(c.B), c.S, o.seed);
      lengths_note = "uniform 1.." + std::to_string(c.S);
    }
    if (!o.lengths_list.empty()) {
      const std::vector<int32_t> head = parse_lengths_list(o.lengths_list, c.S);
      if (int64_t(head.size()) > c.B)
        throw hk::Error("--lengths-list has " + std::to_string(head.size()) + " values for B=" + std::to_string(c.B));
      std::copy(head.begin(), head.end(), lengths.begin());
      lengths_note += ", first " + std::to_string(head.size()) + " set to " + o.lengths_list;
    }
  } else if (!o.lengths_list.empty() || o.full_length) {
    throw hk::Error("--no-lengths excludes --lengths-list and --full-length");
  }

  std::map<std::string, std::unique_ptr<AtomicFile>> files;  // final path -> its temporary
  auto target = [&](const std::string& path) {
    std::unique_ptr<AtomicFile>& f = files[path];
    if (!f) f = std::make_unique<AtomicFile>(path);
    return f->temp();
  };
  if (!model_out.empty()) {
    const hk::Model model = hk::synthetic_model(cfg, o.seed, o.nontrivial_ln);
    hk::io::ModelWriteOptions mo;
    mo.dtype = wtype;
    hk::io::write_model(target(model_out), model, mo, hk::io::WriteMode::create);
  }
  if (!input_out.empty()) {
    const std::vector<float> x = hk::synthetic_input(int(c.B), c.S, c.D, o.seed);
    const bool same = !model_out.empty() && input_out == model_out;
    hk::io::write_input(target(input_out), c.B, c.S, c.D, x.data(), o.no_lengths ? nullptr : lengths.data(), xtype,
                        same ? hk::io::WriteMode::append : hk::io::WriteMode::create);
  }
  for (auto& [path, f] : files) f->commit();

  if (!o.quiet) {
    std::string where = model_out == input_out ? model_out
                        : model_out.empty()    ? input_out
                        : input_out.empty()    ? model_out
                                               : model_out + " and " + input_out;
    std::printf("%s: wrote %s:", kProgram, where.c_str());
    if (o.case_id) std::printf(" case %d (%s),", c.id, c.note.c_str());
    if (!model_out.empty())
      std::printf(" model D=%d H=%d F=%d L=%d causal=%d eps=%g (%s weights%s),", c.D, c.H, c.F, c.L, c.causal, cfg.eps,
                  hk::io::to_string(wtype), o.nontrivial_ln ? ", non-trivial LayerNorm" : "");
    if (!input_out.empty())
      std::printf(" input B=%lld S=%d (x %s, lengths %s),", (long long)c.B, c.S, hk::io::to_string(xtype),
                  lengths_note.c_str());
    std::printf(" seed %llu\n", (unsigned long long)o.seed);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGXFSZ, SIG_IGN);  // a file-size limit: an EFBIG error line instead of a kill
  CLI::App app{"Writes a seeded synthetic hk model and input (HDF5, FORMAT.md) for a row of cases.csv or custom "
               "dimensions.",
               kProgram};
  Options o;
  app.add_option("--case", o.case_id, "row of the cases file (1..13 in the shipped cases.csv)");
  app.add_option("--cases", o.cases, "cases file (default: the shipped cases.csv)");
  app.add_option("--batch", o.batch, "B (overrides the case's B, e.g. to shrink a big case)")->check(CLI::PositiveNumber);
  app.add_option("--seq", o.seq, "S")->check(CLI::PositiveNumber);
  app.add_option("--d-model", o.d_model, "D")->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "H (D % H == 0)")->check(CLI::PositiveNumber);
  app.add_option("--ffn", o.ffn, "F (default: D)")->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "L (default: 4)")->check(CLI::PositiveNumber);
  app.add_option("--causal", o.causal, "1 causal, 0 bidirectional (default: 1)")->check(CLI::Range(0, 1));
  app.add_option("--eps", o.eps, "LayerNorm epsilon (default 1e-5)");
  app.add_option("--seed", o.seed, "seed of the model, x and lengths")->capture_default_str();
  app.add_option("--weights-dtype", o.weights_dtype, "element type of the weights in the file")
      ->check(CLI::IsMember({"float32", "float16", "float64"}))
      ->capture_default_str();
  app.add_option("--input-dtype", o.input_dtype, "element type of x in the file")
      ->check(CLI::IsMember({"float32", "float16"}))
      ->capture_default_str();
  app.add_flag("--nontrivial-ln", o.nontrivial_ln, "LayerNorm weight ~ U(0.5, 1.5), bias ~ U(-0.5, 0.5)");
  app.add_flag("--full-length", o.full_length, "lengths all S (the dataset is still written)");
  app.add_flag("--no-lengths", o.no_lengths, "omit /input/lengths (every position valid)");
  app.add_option("--lengths-list", o.lengths_list,
                 "explicit first lengths, e.g. 0,1,S (S = the sequence length); the rest stay synthetic");
  app.add_option("--output", o.output, "one file holding /model and /input");
  app.add_option("--model-output", o.model_output, "file for /model");
  app.add_option("--input-output", o.input_output, "file for /input");
  app.add_flag("--quiet", o.quiet, "no summary line");
  app.set_version_flag("--version", std::string(kProgram) + " " + HK_VERSION + " (HDF5 " +
                                        hk::io::hdf5_library_version() + ")");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return run(o);
  } catch (const std::bad_alloc&) {
    return hk::app::report_error(kProgram, "out of memory (use --batch to shrink the case)");
  } catch (const std::exception& e) {
    return hk::app::report_error(kProgram, e.what());
  }
}
