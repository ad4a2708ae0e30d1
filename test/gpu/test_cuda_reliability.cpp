// GPU reliability of the CUDA engine, built the way hk_forward builds it (the HK_* knobs read by
// routes_from_environment), for fast and fp32 precision, untuned (HK_TUNE=0) and tuned (HK_TUNE=1
// with a temporary tune cache), and every pinnable route (HK_ATTENTION flash / flash.q64 /
// flash.q16 / flash.k2 / flash.k4 / flash.g4 / cudnn, HK_GELU erf / epilogue, HK_CHAINS=off / post_attn_qkv / attention_chain / attention_model, HK_GRAPH 0 / 1, HK_PACK=1):
//   determinism  the same input gives the same bits run to run within one engine (the five inputs
//                below interleaved, so no state leaks from one call into the next), and in a
//                second engine built the same way (tuned: it reads the first one's cache and
//                measures nothing)
//   numerics     against the float64 naive_forward: N(0,1); 1e4 * N(0,1); 1e4 + N(0,1); rows of
//                one constant (sums exact in fp32, and sums that round: 12345.678, ...), lengths
//                0/1/S mixed in every batch; MODEL.md's budget (fp32: 1e-4), except that the
//                offset and constant inputs may sit at the fp32 residual floor of 1e-2 (an fp32
//                residual stream rounds each add to ulp(1e4) ~ 1e-3; README, reliability), 5e-2
//                for constant rows (no spread of their own: the final LayerNorm amplifies it);
//                padded rows exactly 0, nothing non-finite
//   memory       an engine whose max_batch needs more device memory than there is fails with an
//                hk::Error naming the memory (what and how much), leaks nothing, leaves no CUDA
//                error behind, and engines built before and after still give the same bits
//   tune cache   a corrupt, truncated, empty or foreign tune-v1.json is ignored and rebuilt: the
//                forward is correct, the file is valid afterwards, a second engine measures nothing
// Engines run with HK_CUDA_POISON=1 and every output buffer is NaN-filled before a call.
// Exits 77 (skipped) without a GPU (gpu_test_main.cpp).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "arena.hpp"
#include "cuda/engine.hpp"
#include "env_guard.hpp"
#include "gpu_util.hpp"
#include "hk/error.hpp"
#include "hk/synthetic.hpp"
#include "hk/tune/tune_cache.hpp"
#include "naive_forward.hpp"

namespace {

using hk::Precision;
using hk::cuda::CudaEngine;
using hk::gputest::DevBuf;

// ---- shapes, inputs, references ------------------------------------------------------------------

struct Shape {
  std::string name;
  int B, S, D, H, F, L;
  bool causal;
  bool fast_ok;  // head_dim a multiple of 8: the f16 attention routes take it
  std::vector<int32_t> lengths;
  int64_t tokens() const {
    int64_t t = 0;
    for (int32_t l : lengths) t += l;
    return t;
  }
};

// Tails everywhere: S not a multiple of any tile, head dims 8..64 and 25 (fp32 only), lengths
// 0/1/S in every batch. The last two have B*S > 256 rows with few valid tokens, so HK_PACK=1 runs
// them padding-free.
std::vector<Shape> shapes() {
  return {
      {"S=7 D=64 H=8 (hd 8) causal", 9, 7, 64, 8, 96, 2, true, true, {0, 1, 7, 3, 7, 1, 0, 5, 7}},
      {"S=33 D=100 H=4 (hd 25) bidir", 5, 33, 100, 4, 72, 2, false, false, {0, 1, 33, 17, 33}},
      {"S=33 D=128 H=4 (hd 32) bidir", 9, 33, 128, 4, 160, 2, false, true, {33, 0, 1, 20, 33, 1, 0, 7, 33}},
      {"S=128 D=128 H=2 (hd 64) causal", 3, 128, 128, 2, 128, 2, true, true, {128, 0, 1}},
  };
}

enum Kind { kNormal, kScaled, kOffset, kConst, kConstInexact, kKinds };
const char* const kKindName[kKinds] = {"N(0,1)", "1e4*N", "1e4+N", "const", "const~"};
// Row constants whose fp32 row sum is exact in any order (the mean is exact, x - mean is 0) ...
constexpr float kExact[] = {0.0f, 1.0f, -3.75f, 1e4f, -1e4f, 7.0f};
// ... and ones whose sum rounds: a mean off by ~ulp(x) is an O(1) error after the division by
// sqrt(var + eps), where the answer is the LayerNorm bias.
constexpr float kInexact[] = {12345.678f, 0.001f, 3.14159f, -9876.543f, 1.1f, 777.77f};

bool loose_kind(int k) { return k == kOffset || k == kConst || k == kConstInexact; }

std::vector<float> make_input(const Shape& s, int kind, uint64_t seed) {
  std::vector<float> x = hk::synthetic_input(s.B, s.S, s.D, seed + uint64_t(kind));
  if (kind == kScaled)
    for (float& v : x) v *= 1e4f;
  if (kind == kOffset)
    for (float& v : x) v += 1e4f;
  if (kind == kConst || kind == kConstInexact) {
    const float* c = kind == kConst ? kExact : kInexact;
    // The first five rows of a full-length sequence, and position 0 of a length-1 sequence.
    int full = -1, one = -1;
    for (int b = 0; b < s.B; ++b) {
      if (s.lengths[size_t(b)] == s.S && full < 0) full = b;
      if (s.lengths[size_t(b)] == 1 && one < 0) one = b;
    }
    for (int i = 0; i < std::min(5, s.S); ++i)
      std::fill_n(x.begin() + (ptrdiff_t(full) * s.S + i) * s.D, s.D, c[i]);
    if (one >= 0) std::fill_n(x.begin() + ptrdiff_t(one) * s.S * s.D, s.D, c[5]);
  }
  return x;
}

hk::Model make_model(const Shape& s, uint64_t seed) {
  hk::ModelConfig c;
  c.d_model = s.D;
  c.n_heads = s.H;
  c.ffn_dim = s.F;
  c.n_layers = s.L;
  c.causal = s.causal;
  return hk::synthetic_model(c, seed, /*nontrivial_ln=*/true);
}

// One shape's model, inputs and float64 references (computed once, shared by every config).
struct Fixture {
  Shape shape;
  hk::Model model;
  std::vector<std::vector<float>> x;
  std::vector<std::vector<double>> ref;
};
Fixture make_fixture(const Shape& s, uint64_t seed) {
  Fixture f{s, make_model(s, seed), {}, {}};
  for (int k = 0; k < kKinds; ++k) {
    f.x.push_back(make_input(s, k, seed * 16));
    f.ref.push_back(hk::test::naive_forward(f.model, std::vector<double>(f.x.back().begin(), f.x.back().end()), s.B,
                                            s.S, s.lengths));
  }
  return f;
}

// ---- the engine, as hk_forward makes it ------------------------------------------------------------

struct Route {
  const char* name;
  const char* knob;  // nullptr: no pin
  const char* value;
};
const Route kRoutes[] = {
    {"default", nullptr, nullptr},          {"attention=flash", "HK_ATTENTION", "flash"},
    {"attention=flash.q64", "HK_ATTENTION", "flash.q64"}, {"attention=flash.q16", "HK_ATTENTION", "flash.q16"},
    {"attention=flash.k2", "HK_ATTENTION", "flash.k2"}, {"attention=flash.k4", "HK_ATTENTION", "flash.k4"},
    {"attention=flash.g4", "HK_ATTENTION", "flash.g4"},
    {"attention=cudnn", "HK_ATTENTION", "cudnn"}, {"gelu=erf", "HK_GELU", "erf"},
    {"gelu=epilogue", "HK_GELU", "epilogue"}, {"chains=off", "HK_CHAINS", "off"},
    {"chains=post_attn_qkv", "HK_CHAINS", "post_attn_qkv"},
    {"chains=attention_chain", "HK_CHAINS", "attention_chain"},
    {"chains=attention_model", "HK_CHAINS", "attention_model"},
    {"graph=0", "HK_GRAPH", "0"},           {"graph=1", "HK_GRAPH", "1"},
    {"pack=1", "HK_PACK", "1"},             {"qkv_gemm=mma", "HK_QKV_GEMM", "mma"},
    {"libraries=own", "HK_LIBRARIES", "own"},
};

const char* const kKnobs[] = {"HK_TUNE",    "HK_TUNE_CACHE",  "HK_TUNE_REMEASURE", "HK_TUNE_VERBOSE",
                              "HK_ATTENTION", "HK_GELU",      "HK_GEMM_LAYOUT",    "HK_GEMM_ALGO",
                              "HK_CHAINS",  "HK_GRAPH",       "HK_PACK",           "HK_CUDA_POISON",
                              "HK_QKV_GEMM", "HK_LIBRARIES"};

struct Config {
  Precision precision;
  bool tuned;
  const Route* route;
  std::string cache_dir;  // tuned only
};

// Sets exactly the knobs of `c` (every other HK_* knob unset) for the engine's constructor and
// restores the environment afterwards.
std::unique_ptr<CudaEngine> make_engine(const hk::Model& m, int max_batch, int S, const Config& c) {
  std::vector<std::unique_ptr<hk::test::EnvGuard>> guards;
  for (const char* k : kKnobs) {
    guards.push_back(std::make_unique<hk::test::EnvGuard>(k));
    unsetenv(k);
  }
  setenv("HK_CUDA_POISON", "1", 1);
  setenv("HK_TUNE", c.tuned ? "1" : "0", 1);
  if (c.tuned) setenv("HK_TUNE_CACHE", c.cache_dir.c_str(), 1);
  if (c.route && c.route->knob) setenv(c.route->knob, c.route->value, 1);
  hk::EngineOptions o;
  o.backend = "cuda";
  o.precision = c.precision;
  o.max_batch = max_batch;
  o.seq_len = S;
  return std::make_unique<CudaEngine>(m, o);
}

// Device buffers of one shape, reused by every call (one graph per engine).
struct Dev {
  const Shape& s;
  cudaStream_t stream = nullptr;
  DevBuf x, y, len;
  explicit Dev(const Shape& sh)
      : s(sh), x(size_t(sh.B) * sh.S * sh.D * 4), y(size_t(sh.B) * sh.S * sh.D * 4), len(size_t(sh.B) * 4) {
    HK_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    HK_TEST_CUDA(cudaMemcpy(len.get(), sh.lengths.data(), sh.lengths.size() * 4, cudaMemcpyHostToDevice));
    HK_TEST_CUDA(cudaDeviceSynchronize());
  }
  ~Dev() { cudaStreamDestroy(stream); }
  // x uploaded and y NaN-filled on the call's stream (ordered before the forward), then the
  // forward with the valid-token count hk_forward's host path passes too.
  std::vector<float> call(CudaEngine& e, const std::vector<float>& xh) {
    const size_t bytes = xh.size() * 4;
    HK_TEST_CUDA(cudaMemcpyAsync(x.get(), xh.data(), bytes, cudaMemcpyHostToDevice, stream));
    HK_TEST_CUDA(cudaMemsetAsync(y.get(), hk::gputest::kPoisonByte, bytes, stream));
    HK_TEST_CUDA(cudaStreamSynchronize(stream));
    e.forward_device(x.get<float>(), len.get<int32_t>(), s.B, y.get<float>(), stream, s.tokens());
    HK_TEST_CUDA(cudaStreamSynchronize(stream));
    std::vector<float> out(xh.size());
    HK_TEST_CUDA(cudaMemcpy(out.data(), y.get(), bytes, cudaMemcpyDeviceToHost));
    return out;
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- checks --------------------------------------------------------------------------------------

struct Eval {
  double ratio = 0, max_abs = 0;  // over valid rows
  bool finite = true, pad_zero = true;
  std::string where;  // worst element, or the first bad one
};
Eval evaluate(const std::vector<float>& y, const std::vector<double>& ref, const Shape& s) {
  Eval e;
  double worst = -1;
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.S; ++t)
      for (int d = 0; d < s.D; ++d) {
        const size_t i = (size_t(b) * s.S + size_t(t)) * size_t(s.D) + size_t(d);
        const std::string at = "[" + std::to_string(b) + "," + std::to_string(t) + "," + std::to_string(d) + "]";
        if (t >= s.lengths[size_t(b)]) {
          if (y[i] != 0.0f && e.pad_zero) {
            e.pad_zero = false;
            e.where = "padded " + at + " = " + std::to_string(y[i]);
          }
          continue;
        }
        if (!std::isfinite(y[i])) {
          if (e.finite) e.where = "non-finite at " + at;
          e.finite = false;
          continue;
        }
        const double err = std::fabs(double(y[i]) - ref[i]);
        const double r = err / std::max(2e-3, 0.02 * std::fabs(ref[i]));
        e.max_abs = std::max(e.max_abs, err);
        if (r > worst) {
          worst = r;
          if (e.finite && e.pad_zero)
            e.where = "worst " + at + " y " + std::to_string(y[i]) + " ref " + std::to_string(ref[i]);
        }
      }
  e.ratio = std::max(worst, 0.0);
  return e;
}

bool passes(const Eval& e, int kind, Precision p) {
  if (!e.finite || !e.pad_zero) return false;
  // The fp32 residual floor at magnitude 1e4: each residual add rounds to ulp(1e4) ~ 1e-3 (2L adds),
  // and the final LayerNorm divides that by the row's spread. With 1e4 + N(0,1) the spread is ~1:
  // 1e-2. Constant rows have no spread of their own: what the layers add (~0.1-0.3 here) is all
  // there is, so the same rounding is amplified 3-10x: 5e-2 (fp32 and fast alike: measured 1.0e-2
  // to 1.7e-2 on an H200 in both precisions, so it is the residual, not the fp16 operands).
  const double floor = !loose_kind(kind) ? 1e-4 : kind == kOffset ? 1e-2 : 5e-2;
  if (p == Precision::fp32) return e.max_abs <= floor;
  return e.ratio <= 1.0 || (loose_kind(kind) && e.max_abs <= floor);
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// The routes a plan actually took ("att flash.q16, erf, graph on"), from explain().
std::string taken(const std::string& plan) {
  auto field = [&](const char* key) {
    const size_t at = plan.find(key);
    if (at == std::string::npos) return std::string("?");
    const size_t from = at + std::strlen(key);
    std::string v = plan.substr(from, plan.find('\n', from) - from);
    const size_t cut = v.find(" (");
    if (cut != std::string::npos) v = v.substr(0, cut);
    return v;
  };
  std::string g = field("gelu: ");
  g = g.rfind("cuBLASLt", 0) == 0 ? "tanh" : "erf";
  return "att " + field("attention: ") + ", " + g + ", graph " + field("graphs: ");
}

std::string temp_dir(const char* tag) {
  std::string t = std::string("/tmp/hk_rel_") + tag + "_XXXXXX";
  std::vector<char> b(t.begin(), t.end());
  b.push_back('\0');
  const char* d = ::mkdtemp(b.data());
  if (!d) throw std::runtime_error("mkdtemp failed");
  return d;
}

void remove_dir(const std::string& d) {
  std::error_code ec;
  std::filesystem::remove_all(d, ec);
}

// ---- determinism and numerics over every config ----------------------------------------------------

int run_config_shape(Fixture& f, Dev& dev, const Config& c) {
  const Shape& s = f.shape;
  const char* prec = hk::to_string(c.precision);
  std::printf("%-5s %-7s %-20s %-31s ", prec, c.tuned ? "tuned" : "untuned", c.route->name, s.name.c_str());
  std::vector<std::string> problems;
  std::string note;
  std::vector<std::vector<float>> y1(kKinds);
  bool repeat_ok = true, second_ok = true, cache_ok = true;
  try {
    auto e1 = make_engine(f.model, s.B, s.S, c);
    for (int k = 0; k < kKinds; ++k) y1[size_t(k)] = dev.call(*e1, f.x[size_t(k)]);
    for (int k = 0; k < kKinds; ++k)  // interleaved repeats: every input after every other
      if (!same_bits(dev.call(*e1, f.x[size_t(k)]), y1[size_t(k)])) {
        repeat_ok = false;
        problems.push_back(std::string("run to run: ") + kKindName[k] + " differs on the second call");
      }
    const int64_t rows = e1->plan_rows(s.B, s.tokens());
    const bool dense = rows == int64_t(s.B) * s.S;
    note = dense ? "dense" : "packed " + std::to_string(rows) + " rows";
    if (dense) note += "; " + taken(e1->explain(s.B));
    auto e2 = make_engine(f.model, s.B, s.S, c);
    for (int k = 0; k < kKinds; ++k)
      if (!same_bits(dev.call(*e2, f.x[size_t(k)]), y1[size_t(k)])) {
        second_ok = false;
        problems.push_back(std::string("second engine: ") + kKindName[k] + " differs from the first engine");
      }
    if (c.tuned) {
      const hk::cuda::TuneReport r1 = e1->tune_report(s.B), r2 = e2->tune_report(s.B);
      cache_ok = r1.measured >= 1 && r2.measured == 0 && r2.cached >= 1;
      note += "; tuned " + std::to_string(r1.measured) + " measured, 2nd engine " + std::to_string(r2.cached) +
              " cached/" + std::to_string(r2.measured) + " measured";
      if (!cache_ok) problems.push_back("tune cache: the second engine did not take every decision from the cache");
    }
  } catch (const hk::Error& e) {
    if (!s.fast_ok && c.precision == Precision::fast) {  // the f16 routes lack hd 25: a clean refusal
      // ... that says what runs it instead
      const bool hint = std::strstr(e.what(), "--precision fp32") != nullptr;
      std::printf("refused (hk::Error)            %s  %s\n", hint ? "ok" : "FAIL (no fp32 hint)", e.what());
      return hint ? 0 : 1;
    }
    std::printf("threw hk::Error FAIL  %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::printf("threw (not hk::Error) FAIL  %s\n", e.what());
    return 1;
  }
  if (!s.fast_ok && c.precision == Precision::fast) note += "; hd 25 ran in fast precision";
  std::string cols;
  for (int k = 0; k < kKinds; ++k) {
    const Eval e = evaluate(y1[size_t(k)], f.ref[size_t(k)], s);
    const bool ok = passes(e, k, c.precision);
    const double v = c.precision == Precision::fp32 ? e.max_abs : e.ratio;
    cols += fmt(c.precision == Precision::fp32 ? "%8.1e" : "%8.3f", v) + (ok ? " " : "!");
    if (!ok)
      problems.push_back(std::string(kKindName[k]) + ": " +
                         (!e.finite ? "non-finite" : !e.pad_zero ? "padded row not 0" : "over budget") + " (ratio " +
                         fmt("%.3g", e.ratio) + ", max abs " + fmt("%.3g", e.max_abs) + ", " + e.where + ")");
  }
  const bool ok = problems.empty();
  std::printf("%-6s %-6s %-5s %s %s  %s\n", repeat_ok ? "same" : "DIFF", second_ok ? "same" : "DIFF",
              c.tuned ? (cache_ok ? "ok" : "BAD") : "-", cols.c_str(), ok ? "ok" : "FAIL", note.c_str());
  for (const std::string& p : problems) std::printf("      FAIL: %s\n", p.c_str());
  return ok ? 0 : 1;
}

int run_matrix(Precision p, bool tuned) {
  const auto t0 = std::chrono::steady_clock::now();
  std::printf("%-5s %-7s %-20s %-31s %-6s %-6s %-5s", "prec", "tuning", "route", "shape", "repeat", "engine2", "cache");
  for (const char* n : kKindName) std::printf("%9s", n);
  std::printf("  result  (columns: %s; '!' = over)\n", p == Precision::fp32 ? "max abs error" : "budget ratio");
  std::vector<Fixture> fx;
  uint64_t seed = 1000;
  for (const Shape& s : shapes()) fx.push_back(make_fixture(s, seed++));
  int failures = 0;
  for (const Route& r : kRoutes) {
    const std::string dir = tuned ? temp_dir("tune") : std::string();
    for (Fixture& f : fx) {
      if (p == Precision::fast && !f.shape.fast_ok && std::strcmp(r.name, "default") != 0) continue;
      Dev dev(f.shape);
      failures += run_config_shape(f, dev, Config{p, tuned, &r, dir});
    }
    if (tuned) remove_dir(dir);
  }
  std::printf("%s %s: %d failure(s), %.1f s\n", hk::to_string(p), tuned ? "tuned" : "untuned", failures,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return failures;
}

TEST(CudaReliability, FastUntuned) { EXPECT_EQ(run_matrix(Precision::fast, false), 0); }
TEST(CudaReliability, FastTuned) { EXPECT_EQ(run_matrix(Precision::fast, true), 0); }
TEST(CudaReliability, Fp32Untuned) { EXPECT_EQ(run_matrix(Precision::fp32, false), 0); }
TEST(CudaReliability, Fp32Tuned) { EXPECT_EQ(run_matrix(Precision::fp32, true), 0); }

// ---- out of device memory ----------------------------------------------------------------------------

int g_rows_failed = 0;
bool row(const std::string& check, const std::string& value, bool ok, const std::string& note = "") {
  std::printf("%-44s %-26s %s%s%s\n", check.c_str(), value.c_str(), ok ? "ok" : "FAIL", note.empty() ? "" : "  ",
              note.c_str());
  g_rows_failed += !ok;
  return ok;
}
void info(const std::string& check, const std::string& value, const std::string& note = "") {
  std::printf("%-44s %-26s info%s%s\n", check.c_str(), value.c_str(), note.empty() ? "" : "  ", note.c_str());
}

std::string gib(double bytes) { return fmt("%.2f GiB", bytes / double(1ull << 30)); }

// "Names the memory": what (a buffer of the engine) and how much, in the message itself rather
// than in a source location like "(.../arena.cpp:43)".
bool names_the_memory(const std::string& msg) {
  const std::string text = std::regex_replace(msg, std::regex(R"(\([^()]*:[0-9]+\))"), "");
  const bool what = std::regex_search(text, std::regex(R"(arena|activation|weights|workspace|staging)", std::regex::icase));
  const bool how_much = std::regex_search(text, std::regex(R"([0-9][0-9.,]* ?(bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b)"));
  return what && how_much;
}
bool says_out_of_memory(const std::string& msg) {
  return std::regex_search(msg, std::regex(R"(out of (device )?memory)", std::regex::icase));
}

TEST(CudaReliability, OutOfDeviceMemory) {
  g_rows_failed = 0;
  const Shape s{"oom", 2, 128, 128, 4, 128, 1, true, true, {128, 5}};
  const Fixture f = make_fixture(s, 77);
  Dev dev(s);
  const Config plain{Precision::fast, false, &kRoutes[0], ""};
  std::unique_ptr<CudaEngine> before;
  std::vector<float> y0;
  try {
    before = make_engine(f.model, s.B, s.S, plain);
    y0 = dev.call(*before, f.x[kNormal]);
  } catch (const std::exception& e) {
    row("engine before the failures", "threw", false, e.what());
    FAIL();
  }
  row("engine before the failures", "ratio " + fmt("%.3f", evaluate(y0, f.ref[kNormal], s).ratio),
      passes(evaluate(y0, f.ref[kNormal], s), kNormal, Precision::fast));

  size_t free0 = 0, total = 0;
  HK_TEST_CUDA(cudaMemGetInfo(&free0, &total));
  info("device memory", gib(double(free0)) + " free", "of " + gib(double(total)));
  // Bytes of one sequence in the arena (the layout is pure host code).
  hk::ModelConfig cfg = f.model.config;
  const size_t ws = size_t(32) << 20;
  const double per_seq = double(hk::cuda::activation_layout(cfg, 1001, s.S, Precision::fast, ws).total -
                                hk::cuda::activation_layout(cfg, 1, s.S, Precision::fast, ws).total) /
                         1000.0;
  struct Variant {
    std::string name;
    int max_batch;
    size_t hog;  // bytes held by "another user" during the attempt
  };
  std::vector<Variant> variants;
  const double far = std::min(double(INT_MAX), 2.0 * double(total) / per_seq + 1);
  variants.push_back({"arena 2x the device", int(far), 0});
  variants.push_back({"arena free + 1 GiB", int(std::min(double(INT_MAX), (double(free0) + double(1 << 30)) / per_seq)), 0});
  variants.push_back({"small engine, memory held", 64, 0});  // hog sized below
  for (Variant& v : variants) {
    void* hog = nullptr;
    if (v.name == "small engine, memory held") {
      size_t fr = 0, tt = 0;
      HK_TEST_CUDA(cudaMemGetInfo(&fr, &tt));
      // Leave less than this engine's arena (64 sequences: ~60 MiB with the workspace) free.
      for (size_t leave_mib : {8, 16, 32}) {
        const size_t leave = leave_mib << 20;
        if (fr > leave && cudaMalloc(&hog, fr - leave) == cudaSuccess) {
          v.hog = fr - leave;
          break;
        }
        hog = nullptr;
        (void)cudaGetLastError();  // the test's own failed allocation must not count against the engine
      }
      if (!hog) {
        info(v.name, "n/a", "could not hold the device memory");
        continue;
      }
    }
    const double need = double(hk::cuda::activation_layout(cfg, v.max_batch, s.S, Precision::fast, ws).total);
    const std::string label = "OOM: " + v.name;
    size_t free_before = 0;
    HK_TEST_CUDA(cudaMemGetInfo(&free_before, &total));
    std::string msg;
    bool hk_error = false, constructed = false;
    try {
      auto e = make_engine(f.model, v.max_batch, s.S, plain);
      constructed = true;
      (void)dev.call(*e, f.x[kNormal]);  // a lazily failing engine must fail here, cleanly
    } catch (const hk::Error& e) {
      hk_error = true;
      msg = e.what();
    } catch (const std::exception& e) {
      msg = std::string("not an hk::Error: ") + e.what();
    }
    if (hog) cudaFree(hog);
    size_t free_after = 0;
    HK_TEST_CUDA(cudaMemGetInfo(&free_after, &total));
    std::printf("%s: max_batch %d, arena %s: %s\n", label.c_str(), v.max_batch, gib(need).c_str(),
                msg.empty() ? "(no error)" : msg.c_str());
    row(label + ": hk::Error", constructed ? "at the forward" : "at construction", hk_error);
    // Held memory may run out inside cuBLASLt or a module load rather than in an hk allocation.
    row(label + ": says out of memory", "",
        v.hog ? std::regex_search(msg, std::regex("memory|alloc", std::regex::icase)) : says_out_of_memory(msg));
    // The memory held by the test itself cannot be named by the engine; the others must be.
    if (v.hog == 0) row(label + ": names the memory", "", names_the_memory(msg), "what and how much");
    const double leaked = double(free_before) + double(v.hog) - double(free_after);
    row(label + ": nothing leaked", fmt("%.1f MiB", leaked / (1 << 20)), leaked < double(64 << 20));
    const cudaError_t pending = cudaPeekAtLastError();
    info(label + ": pending CUDA error", cudaGetErrorName(pending), "cudaPeekAtLastError (not cleared here)");

    // After the failure: the engine built before still works and gives the same bits, and so
    // do new engines (a stale error of the failed allocation would surface at their first launch).
    try {
      row(label + ": then the earlier engine", "same bits", same_bits(dev.call(*before, f.x[kNormal]), y0));
    } catch (const std::exception& e) {
      row(label + ": then the earlier engine", "threw", false, e.what());
    }
    try {
      auto e = make_engine(f.model, s.B, s.S, plain);
      row(label + ": then a new engine", "same bits", same_bits(dev.call(*e, f.x[kNormal]), y0));
    } catch (const std::exception& e) {
      row(label + ": then a new engine", "threw", false, e.what());
    }
  }
  try {
    Config tuned{Precision::fast, true, &kRoutes[0], temp_dir("oom")};
    auto t = make_engine(f.model, s.B, s.S, tuned);
    const std::vector<float> yt = dev.call(*t, f.x[kNormal]);
    row("after all: a new tuned engine", "ratio " + fmt("%.3f", evaluate(yt, f.ref[kNormal], s).ratio),
        passes(evaluate(yt, f.ref[kNormal], s), kNormal, Precision::fast));
    remove_dir(tuned.cache_dir);
  } catch (const std::exception& e) {
    row("after all: a new tuned engine", "threw", false, e.what());
  }
  EXPECT_EQ(g_rows_failed, 0);
}

// ---- a corrupt tune cache --------------------------------------------------------------------------

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

TEST(CudaReliability, CorruptTuneCacheIsIgnoredAndRebuilt) {
  g_rows_failed = 0;
  const Shape s{"cache", 4, 16, 64, 4, 64, 1, true, true, {0, 1, 16, 9}};
  const Fixture f = make_fixture(s, 91);
  Dev dev(s);
  const std::string file = "tune-v1.json";

  // A valid file to corrupt. (Its engine's bits are no reference for the engines below: they
  // measure anew, and timing may pick other winners.)
  const std::string good_dir = temp_dir("cache");
  std::string good;
  try {
    auto e = make_engine(f.model, s.B, s.S, Config{Precision::fast, true, &kRoutes[0], good_dir});
    (void)dev.call(*e, f.x[kNormal]);
    good = read_text(good_dir + "/" + file);
  } catch (const std::exception& e) {
    row("first tuned engine", "threw", false, e.what());
    FAIL();
  }
  row("first tuned engine writes the cache", std::to_string(good.size()) + " bytes", good.size() > 16);
  remove_dir(good_dir);

  std::string wrong_entries = good;  // the right format, entries of the wrong type
  const size_t at = good.find("\"entries\"");
  if (at != std::string::npos) wrong_entries = good.substr(0, good.find(':', at) + 1) + " 5}";
  struct Variant {
    std::string name, text;
    bool directory = false, unreadable = false;
  };
  const std::vector<Variant> variants = {
      {"garbage bytes", std::string("\x00\xff{\"format\": [", 14) + "\x01 not json"},
      {"empty file", ""},
      {"truncated (first half)", good.substr(0, good.size() / 2)},
      {"another format", "{\"format\": \"hk-tune-v0\", \"entries\": {}}"},
      {"entries of the wrong type", wrong_entries},
      {"unreadable (mode 000)", good, false, true},
      {"a directory in its place", "", true},
  };
  for (const Variant& v : variants) {
    if (v.unreadable && ::geteuid() == 0) {
      info("cache " + v.name, "n/a", "running as root: permissions do not stop reads");
      continue;
    }
    const std::string dir = temp_dir("cache");
    const std::string path = dir + "/" + file;
    if (v.directory) {
      std::filesystem::create_directory(path);
    } else {
      write_text(path, v.text);
      if (v.unreadable) ::chmod(path.c_str(), 0);
    }
    const Config c{Precision::fast, true, &kRoutes[0], dir};
    const std::string label = "cache " + v.name;
    try {
      auto e1 = make_engine(f.model, s.B, s.S, c);
      const std::vector<float> y1 = dev.call(*e1, f.x[kNormal]);
      const Eval ev = evaluate(y1, f.ref[kNormal], s);
      row(label + ": forward", "ratio " + fmt("%.3f", ev.ratio), passes(ev, kNormal, Precision::fast));
      row(label + ": measured anew", std::to_string(e1->tune_report(s.B).measured) + " measured",
          e1->tune_report(s.B).measured >= 1);
      if (v.directory) {
        info(label + ": left as it is", "", "cannot be replaced by a file; decisions stay in memory");
      } else {
        hk::tune::TuneCache reread(dir);
        row(label + ": file valid afterwards", std::to_string(reread.size()) + " entries",
            reread.warnings().empty() && reread.size() >= 1,
            reread.warnings().empty() ? "" : reread.warnings().front());
        auto e2 = make_engine(f.model, s.B, s.S, c);
        const std::vector<float> y2 = dev.call(*e2, f.x[kNormal]);
        const hk::cuda::TuneReport r2 = e2->tune_report(s.B);
        row(label + ": next engine from the cache",
            std::to_string(r2.cached) + " cached, " + std::to_string(r2.measured) + " measured",
            r2.measured == 0 && r2.cached >= 1 && same_bits(y2, y1));
      }
    } catch (const std::exception& e) {
      row(label, "threw", false, e.what());
    }
    remove_dir(dir);
  }
  EXPECT_EQ(g_rows_failed, 0);
}

}  // namespace
