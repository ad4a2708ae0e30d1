// The measured-dispatch mechanism on the host: the chooser's selection rule, its numeric guard,
// pins and HK_TUNE=0, the tune cache (round trip, keys, concurrent writers, corrupt files), the
// source fingerprints (an edited kernel invalidates its entries), the knob registry and the
// plan choices over a toy kernel table. Probes are plain functions with scripted times and
// outputs, so every branch is exercised deterministically.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "env_guard.hpp"
#include "hk/error.hpp"
#include "hk/plan.hpp"
#include "hk/tune/chooser.hpp"
#include "hk/tune/fingerprint.hpp"
#include "hk/tune/knobs.hpp"
#include "hk/tune/plan_choice.hpp"
#include "hk/tune/tune_cache.hpp"

namespace {

namespace fs = std::filesystem;
using hk::tune::Candidate;
using hk::tune::Chooser;
using hk::tune::ChooserOptions;
using hk::tune::Decision;
using hk::tune::Probe;
using hk::tune::Source;
using hk::tune::TuneCache;
using hk::tune::TuneKey;
using hk::tune::Verdict;

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/hk_tune_test_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

using hk::test::EnvGuard;

hk::tune::DeviceIdentity gpu(const std::string& name = "NVIDIA H200", int sms = 132) {
  hk::tune::DeviceIdentity d;
  d.name = name;
  d.sm_count = sms;
  d.arch = "sm_90";
  d.driver = "13.0";
  d.runtime = "13.0";
  d.libraries = "cublasLt 130100 cudnn 91400";
  return d;
}

TuneKey key(const std::string& op = "attention", const std::string& fp = "0123456789abcdef") {
  return {op, "B=64 S=128 D=128", "f16", gpu(), fp};
}

std::vector<Candidate> cands(std::initializer_list<const char*> ids) {
  std::vector<Candidate> c;
  for (const char* id : ids) c.push_back({id, std::string("kernel ") + id});
  return c;
}

// A scripted probe: candidate i "computes" outputs[i] and takes times[i] ms; counts every call.
struct Script {
  std::vector<double> times;
  std::vector<std::vector<double>> outputs;
  std::vector<bool> throws;
  std::vector<double> current, reference;
  int runs = 0, timings = 0;
  Probe probe() {
    Probe p;
    p.run = [this](int i) {
      ++runs;
      if (!throws.empty() && throws[size_t(i)]) throw std::runtime_error("launch failed");
      current = outputs[size_t(i)];
    };
    p.keep_reference = [this] { reference = current; };
    p.difference = [this] {
      double m = 0;
      for (size_t k = 0; k < current.size(); ++k) m = std::max(m, std::fabs(current[k] - reference[k]));
      return m;
    };
    p.time = [this](int i) {
      ++timings;
      return times[size_t(i)];
    };
    return p;
  }
};

Script same_outputs(std::vector<double> times) {
  Script s;
  s.times = times;
  s.outputs.assign(times.size(), std::vector<double>{1.0, 2.0, 3.0});
  return s;
}

struct Quiet {
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& l) { lines.push_back(l); };
  }
};

// ---- selection rule ---------------------------------------------------------------------------

TEST(Chooser, PickWinnerRule) {
  EXPECT_EQ(hk::tune::pick_winner({1.0, 0.5, 0.7}, 0.005), 1);
  // The default wins ties within the margin...
  EXPECT_EQ(hk::tune::pick_winner({1.0, 0.997, 0.998}, 0.005), 0);
  // ...and beyond it loses.
  EXPECT_EQ(hk::tune::pick_winner({1.0, 0.99}, 0.005), 1);
  // Among later candidates too, the earlier one within the margin of the best wins.
  EXPECT_EQ(hk::tune::pick_winner({1.0, 0.901, 0.9}, 0.005), 1);
  // Out-of-the-running candidates (< 0) never win; nothing timed -> the default.
  EXPECT_EQ(hk::tune::pick_winner({-1, 2.0, -1}, 0.005), 1);
  EXPECT_EQ(hk::tune::pick_winner({-1, -1}, 0.005), 0);
}

TEST(Chooser, PicksTheFastest) {
  Quiet q;
  Chooser ch(nullptr, false, q.sink());
  Script s = same_outputs({0.30, 0.10, 0.20});
  const Decision d = ch.decide(key(), cands({"flash", "flash.q16", "cudnn"}), s.probe(), ChooserOptions{});
  EXPECT_EQ(d.chosen, 1);
  EXPECT_EQ(d.source, Source::measured);
  EXPECT_EQ(d.winner().id, "flash.q16");
  EXPECT_EQ(d.results[0].verdict, Verdict::accepted);
  EXPECT_EQ(d.results[1].verdict, Verdict::winner);
  EXPECT_DOUBLE_EQ(d.results[2].ms, 0.20);
  EXPECT_EQ(s.runs, 3);     // each candidate once for the guard
  EXPECT_EQ(s.timings, 3);  // and timed once (rounds = 1)
  EXPECT_NE(d.describe().find("flash.q16 0.1 ms <- chosen"), std::string::npos) << d.describe();
}

TEST(Chooser, DescribeShortensLongLists) {
  // 40 candidates: the first, the chosen, the eight fastest and the rejected are named, the rest
  // counted; a short list names every candidate.
  Quiet q;
  Chooser ch(nullptr, false, q.sink());
  std::vector<double> times;
  std::vector<Candidate> list;
  for (int i = 0; i < 40; ++i) {
    times.push_back(1.0 + 0.01 * ((i * 17) % 40));  // distinct; i = 0 -> 1.0
    list.push_back({"c" + std::to_string(i), "kernel " + std::to_string(i)});
  }
  times[25] = 0.5;  // the winner
  Script s = same_outputs(times);
  s.outputs[31] = {1.0, 2.0, 9.0};  // rejected by the guard
  const Decision d = ch.decide(key("many"), list, s.probe(), ChooserOptions{});
  ASSERT_EQ(d.chosen, 25);
  const std::string text = d.describe();
  EXPECT_NE(text.find(" c0 1 ms"), std::string::npos) << text;
  EXPECT_NE(text.find("c25 0.5 ms <- chosen"), std::string::npos) << text;
  EXPECT_NE(text.find("c31 rejected"), std::string::npos) << text;
  // Eight fastest timed: c25 and the seven next (1.0 + 0.01 k for the smallest (17 i mod 40)).
  int named = 0;
  for (int i = 0; i < 40; ++i)
    named += text.find(" c" + std::to_string(i) + " ") != std::string::npos ||
             text.find(" c" + std::to_string(i) + ",") != std::string::npos;
  // c25, c0, c33, c26, c19, c12, c5, c38 (the eight fastest; c0 also the first) and c31 (rejected).
  EXPECT_EQ(named, 9) << text;
  EXPECT_NE(text.find("and " + std::to_string(40 - named) + " more"), std::string::npos) << text;
  const Decision small = ch.decide(key("few"), cands({"a", "b", "c"}), same_outputs({0.3, 0.1, 0.2}).probe(),
                                   ChooserOptions{});
  EXPECT_EQ(small.describe().find("more"), std::string::npos) << small.describe();
}

TEST(Chooser, FirstCandidateWinsTiesWithinMargin) {
  Chooser ch(nullptr);
  Script s = same_outputs({1.000, 0.996});
  EXPECT_EQ(ch.decide(key(), cands({"graph", "eager"}), s.probe(), ChooserOptions{}).chosen, 0);
  Script t = same_outputs({1.000, 0.990});
  EXPECT_EQ(ch.decide(key("other"), cands({"graph", "eager"}), t.probe(), ChooserOptions{}).chosen, 1);
}

TEST(Chooser, RoundsKeepTheBestTime) {
  Chooser ch(nullptr);
  Script s = same_outputs({1.0, 1.0});
  int calls = 0;
  Probe p = s.probe();
  p.time = [&](int i) {
    ++calls;
    // Candidate 1 is slow in the first round only (a clock ramp): best of three sees 0.5.
    return i == 0 ? 0.8 : (calls <= 2 ? 2.0 : 0.5);
  };
  ChooserOptions o;
  o.rounds = 3;
  const Decision d = ch.decide(key(), cands({"a", "b"}), p, o);
  EXPECT_EQ(calls, 6);
  EXPECT_EQ(d.chosen, 1);
  EXPECT_DOUBLE_EQ(d.results[1].ms, 0.5);
}

TEST(Chooser, NumericGuardRejectsAWrongCandidate) {
  Quiet q;
  Chooser ch(nullptr, false, q.sink());
  Script s;
  s.times = {1.0, 0.1, 0.5};
  s.outputs = {{1.0, 2.0, 3.0}, {1.0, 2.01, 3.0}, {1.001, 2.0, 3.0015}};  // 1e-2 off: wrong; 1.5e-3: fine
  const Decision d = ch.decide(key(), cands({"default", "fast_but_wrong", "close"}), s.probe(), ChooserOptions{});
  EXPECT_EQ(d.results[1].verdict, Verdict::rejected_numeric);
  EXPECT_NEAR(d.results[1].max_diff, 1e-2, 1e-12);
  EXPECT_LT(d.results[1].ms, 0);  // never timed
  EXPECT_EQ(d.winner().id, "close");
  EXPECT_EQ(s.timings, 2);
  ASSERT_EQ(q.lines.size(), 1u);  // the rejection is logged even when not verbose
  EXPECT_NE(q.lines[0].find("fast_but_wrong rejected"), std::string::npos) << q.lines[0];
  // A non-finite difference (NaN) is a rejection, not a pass.
  Script n = same_outputs({1.0, 0.1});
  Probe p = n.probe();
  p.difference = [] { return std::nan(""); };
  EXPECT_EQ(ch.decide(key("nan"), cands({"a", "b"}), p, ChooserOptions{}).chosen, 0);
}

TEST(Chooser, FailingCandidatesAreDropped) {
  Quiet q;
  Chooser ch(nullptr, false, q.sink());
  Script s = same_outputs({1.0, 0.1, 0.5});
  s.throws = {false, true, false};
  const Decision d = ch.decide(key(), cands({"a", "b", "c"}), s.probe(), ChooserOptions{});
  EXPECT_EQ(d.results[1].verdict, Verdict::failed);
  EXPECT_EQ(d.winner().id, "c");
  // A failing default: nothing can be compared, the default is kept unmeasured.
  Script t = same_outputs({1.0, 0.1});
  t.throws = {true, false};
  const Decision e = ch.decide(key("x"), cands({"a", "b"}), t.probe(), ChooserOptions{});
  EXPECT_EQ(e.chosen, 0);
  EXPECT_EQ(t.timings, 0);
}

TEST(Chooser, PinsAndTuneOffNeverMeasure) {
  Chooser ch(nullptr);
  Script s = same_outputs({1.0, 0.1, 0.2});
  ChooserOptions off;
  off.tune = false;
  Decision d = ch.decide(key(), cands({"a", "b", "c"}), s.probe(), off);
  EXPECT_EQ(d.chosen, 0);
  EXPECT_EQ(d.source, Source::untuned);
  ChooserOptions pin;
  pin.pin = "c";
  d = ch.decide(key(), cands({"a", "b", "c"}), s.probe(), pin);
  EXPECT_EQ(d.chosen, 2);
  EXPECT_EQ(d.source, Source::pinned);
  pin.pin = "missing";
  d = ch.decide(key(), cands({"a", "b", "c"}), s.probe(), pin);
  EXPECT_EQ(d.chosen, 0);
  EXPECT_NE(d.note.find("not a candidate"), std::string::npos);
  d = ch.decide(key(), cands({"only"}), s.probe(), ChooserOptions{});
  EXPECT_EQ(d.source, Source::single);
  EXPECT_EQ(s.runs + s.timings, 0);
  EXPECT_TRUE(ch.answered(key(), cands({"a", "b"}), off));
  EXPECT_FALSE(ch.answered(key("fresh"), cands({"a", "b"}), ChooserOptions{}));
}

TEST(Chooser, MemoAnswersTheSameKeyOnce) {
  Chooser ch(nullptr);
  Script s = same_outputs({1.0, 0.5});
  ch.decide(key(), cands({"a", "b"}), s.probe(), ChooserOptions{});
  const int runs = s.runs, timings = s.timings;
  const Decision d = ch.decide(key(), cands({"a", "b"}), s.probe(), ChooserOptions{});
  EXPECT_EQ(d.source, Source::memo);
  EXPECT_EQ(d.chosen, 1);
  EXPECT_EQ(s.runs, runs);
  EXPECT_EQ(s.timings, timings);
  EXPECT_EQ(ch.history().size(), 2u);
}

// ---- HK_TUNE=0 and the knob registry ------------------------------------------------------------

TEST(Knobs, TuneZeroPinsDefaults) {
  EnvGuard g("HK_TUNE");
  unsetenv("HK_TUNE");
  EXPECT_TRUE(hk::tune::tune_enabled());
  setenv("HK_TUNE", "0", 1);
  EXPECT_FALSE(hk::tune::tune_enabled());
  // What an engine does with it: every decision untuned -> the first candidate, nothing run.
  Chooser ch(nullptr);
  Script s = same_outputs({5.0, 0.1});
  ChooserOptions o;
  o.tune = hk::tune::tune_enabled();
  EXPECT_EQ(ch.decide(key(), cands({"default", "faster"}), s.probe(), o).chosen, 0);
  EXPECT_EQ(s.runs + s.timings, 0);
  setenv("HK_TUNE", "yes", 1);
  try {
    hk::tune::tune_enabled();
    ADD_FAILURE() << "HK_TUNE=yes was accepted";
  } catch (const hk::Error& e) {
    EXPECT_NE(std::string(e.what()).find("HK_TUNE"), std::string::npos);
  }
}

TEST(Knobs, RegistryIsCompleteAndDocumented) {
  EXPECT_THROW(hk::tune::knob_value("HK_NOT_A_KNOB"), hk::Error);
  for (const char* k : {"HK_TUNE", "HK_TUNE_CACHE", "HK_TUNE_REMEASURE", "HK_TUNE_VERBOSE", "HK_ATTENTION", "HK_GELU",
                        "HK_GEMM_LAYOUT", "HK_GEMM_ALGO", "HK_QKV_GEMM", "HK_CHAINS", "HK_LIBRARIES", "HK_GRAPH", "HK_CUDA_POISON", "HK_DATA_DIR"})
    EXPECT_NE(hk::tune::find_knob(k), nullptr) << k;
  const std::string text = hk::tune::describe_knobs();
  std::ifstream doc(HK_TUNE_KNOBS_DOC);
  ASSERT_TRUE(doc) << HK_TUNE_KNOBS_DOC;
  std::stringstream ss;
  ss << doc.rdbuf();
  for (const hk::tune::Knob& k : hk::tune::knobs()) {
    EXPECT_NE(text.find(k.name), std::string::npos) << k.name;
    EXPECT_NE(ss.str().find(std::string("`") + k.name), std::string::npos) << k.name << " missing from docs/KNOBS.md";
  }
}

// ---- the tune cache -------------------------------------------------------------------------------

TEST(TuneCache, RoundTripAcrossProcessesObjects) {
  TempDir dir;
  {
    TuneCache cache(dir.path());
    EXPECT_TRUE(cache.persistent());
    Chooser ch(&cache);
    Script s = same_outputs({1.0, 0.4, 0.6});
    EXPECT_EQ(ch.decide(key(), cands({"a", "b", "c"}), s.probe(), ChooserOptions{}).winner().id, "b");
  }
  TuneCache again(dir.path());
  EXPECT_EQ(again.size(), 1u);
  Chooser ch(&again);
  Script s = same_outputs({1.0, 0.4, 0.6});
  const Decision d = ch.decide(key(), cands({"a", "b", "c"}), s.probe(), ChooserOptions{});
  EXPECT_EQ(d.source, Source::cached);
  EXPECT_EQ(d.winner().id, "b");
  EXPECT_DOUBLE_EQ(d.results[2].ms, 0.6);  // the stored times come back for explain
  EXPECT_EQ(s.runs + s.timings, 0);
  // A cached winner that is no longer a candidate (e.g. cuDNN missing now) is measured anew.
  Script t = same_outputs({1.0, 0.4});
  EXPECT_EQ(ch.decide(key(), cands({"a", "c"}), t.probe(), ChooserOptions{}).source, Source::measured);
  // HK_TUNE_REMEASURE: the cache is ignored and overwritten.
  Chooser fresh(&again);
  Script u = same_outputs({0.1, 0.4, 0.6});
  ChooserOptions re;
  re.remeasure = true;
  EXPECT_EQ(fresh.decide(key(), cands({"a", "b", "c"}), u.probe(), re).winner().id, "a");
  EXPECT_EQ(TuneCache(dir.path()).lookup(key())->winner, "a");
}

TEST(TuneCache, KeyNamesDeviceLibrariesAndFingerprint) {
  TempDir dir;
  TuneCache cache(dir.path());
  hk::tune::TuneEntry e;
  e.winner = "b";
  cache.store(key(), e);
  EXPECT_TRUE(cache.lookup(key()).has_value());
  TuneKey other_fp = key("attention", "fedcba9876543210");
  EXPECT_FALSE(cache.lookup(other_fp).has_value());
  TuneKey other_gpu = key();
  other_gpu.device = gpu("NVIDIA A100-SXM4-80GB", 108);
  EXPECT_FALSE(cache.lookup(other_gpu).has_value());
  TuneKey other_sms = key();
  other_sms.device.sm_count = 114;  // same name, another SKU / MIG slice
  EXPECT_FALSE(cache.lookup(other_sms).has_value());
  TuneKey other_lib = key();
  other_lib.device.libraries = "cublasLt 130100 cudnn 91900";
  EXPECT_FALSE(cache.lookup(other_lib).has_value());
  TuneKey other_driver = key();
  other_driver.device.driver = "12.8";
  EXPECT_FALSE(cache.lookup(other_driver).has_value());
  TuneKey other_shape = key();
  other_shape.shape = "B=65 S=128 D=128";
  EXPECT_FALSE(cache.lookup(other_shape).has_value());
}

TEST(TuneCache, CorruptFileIsIgnoredAndRebuilt) {
  TempDir dir;
  const std::string file = dir.path() + "/tune-v1.json";
  for (const char* junk : {"{\"format\": \"hk-tune-1\", \"entries\": {\"k\": {\"winn", "not json at all",
                           "{\"format\": \"something-else\", \"entries\": {}}", "[1, 2, 3]",
                           "{\"format\": \"hk-tune-1\", \"entries\": {\"k\": {\"no_winner\": 1}}}"}) {
    { std::ofstream(file) << junk; }
    std::vector<std::string> warned;
    TuneCache real(dir.path());
    EXPECT_EQ(real.size(), 0u) << junk;
    ASSERT_EQ(real.warnings().size(), 1u) << junk;
    EXPECT_NE(real.warnings()[0].find("ignoring it"), std::string::npos);
    real.set_warning_sink([&](const std::string& w) { warned.push_back(w); });
    real.reload();  // warned once per cache object, not per read
    EXPECT_TRUE(warned.empty());
    hk::tune::TuneEntry e;
    e.winner = "a";
    real.store(key(), e);  // rebuilds the file
    EXPECT_EQ(TuneCache(dir.path()).lookup(key())->winner, "a") << junk;
  }
}

TEST(TuneCache, UnwritableDirectoryDegradesToMemory) {
  TuneCache cache("/proc/hk-cannot-exist/cache");
  std::vector<std::string> warned;
  cache.set_warning_sink([&](const std::string& w) { warned.push_back(w); });
  hk::tune::TuneEntry e;
  e.winner = "a";
  cache.store(key(), e);
  cache.store(key("second"), e);
  EXPECT_EQ(warned.size(), 1u);  // once
  EXPECT_EQ(cache.lookup(key())->winner, "a");
}

TEST(TuneCache, DefaultDirectoryFollowsTheKnobs) {
  EnvGuard g1("HK_TUNE_CACHE"), g2("XDG_CACHE_HOME"), g3("HOME");
  setenv("HK_TUNE_CACHE", "/scratch/tune", 1);
  EXPECT_EQ(TuneCache::default_directory(), "/scratch/tune");
  setenv("HK_TUNE_CACHE", "off", 1);
  EXPECT_EQ(TuneCache::default_directory(), "");
  unsetenv("HK_TUNE_CACHE");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(TuneCache::default_directory(), "/xdg/hk");
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "/home/u", 1);
  EXPECT_EQ(TuneCache::default_directory(), "/home/u/.cache/hk");
  EXPECT_EQ(TuneCache("/tmp/x/").path(), "/tmp/x/tune-v1.json");
}

TEST(TuneCache, ConcurrentWritersLoseNothing) {
  TempDir dir;
  constexpr int kProcs = 6, kKeys = 25;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Each writer stores its own keys through its own cache object (its own view of the
      // file), interleaving with the others, and re-reads now and then like a new job would.
      TuneCache cache(dir.path());
      for (int k = 0; k < kKeys; ++k) {
        hk::tune::TuneEntry e;
        e.winner = "w" + std::to_string(p);
        e.times_ms["w" + std::to_string(p)] = k;
        cache.store(key("op." + std::to_string(p) + "." + std::to_string(k)), e);
        if (k % 7 == 0) cache.reload();
      }
      ::_exit(cache.warnings().empty() ? 0 : 3);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer failed, status " << status;
  }
  TuneCache all(dir.path());
  EXPECT_TRUE(all.warnings().empty());
  EXPECT_EQ(all.size(), size_t(kProcs * kKeys));
  for (int p = 0; p < kProcs; ++p)
    for (int k = 0; k < kKeys; ++k) {
      auto e = all.lookup(key("op." + std::to_string(p) + "." + std::to_string(k)));
      ASSERT_TRUE(e.has_value()) << p << " " << k;
      EXPECT_EQ(e->winner, "w" + std::to_string(p));
    }
  // No temporary files left behind.
  for (const auto& f : fs::directory_iterator(dir.path()))
    EXPECT_EQ(f.path().filename().string().find(".tmp."), std::string::npos) << f.path();
}

// ---- source fingerprints --------------------------------------------------------------------------

TEST(Fingerprint, EditedSourceInvalidatesOnlyItsEntries) {
  std::vector<hk::tune::SourceHash> table = {{"backends/cuda/attention_flash.cu", "aaaa"},
                                             {"backends/cuda/engine.cpp", "bbbb"},
                                             {"backends/cuda/gemm_cublaslt.cu", "cccc"}};
  const std::string id = "GNU 12 Release";
  const std::vector<std::string> attention = {"backends/cuda/engine.", "backends/cuda/attention_flash"};
  const std::vector<std::string> gemm = {"backends/cuda/engine.", "backends/cuda/gemm_cublaslt"};
  const std::string a0 = hk::tune::fingerprint(table, id, attention), g0 = hk::tune::fingerprint(table, id, gemm);
  table[0].sha256 = "aaab";  // the flash kernel was edited
  const std::string a1 = hk::tune::fingerprint(table, id, attention), g1 = hk::tune::fingerprint(table, id, gemm);
  EXPECT_NE(a0, a1);
  EXPECT_EQ(g0, g1);
  EXPECT_NE(hk::tune::fingerprint(table, "GNU 12 Debug", gemm), g1);  // another build
  EXPECT_EQ(a1.size(), 16u);

  // Through the cache: the entry measured before the edit is not found after it.
  TempDir dir;
  TuneCache cache(dir.path());
  Chooser ch(&cache);
  Script s = same_outputs({1.0, 0.5});
  ch.decide(key("attention", a0), cands({"flash", "cudnn"}), s.probe(), ChooserOptions{});
  Chooser later(&cache);
  EXPECT_EQ(later.decide(key("attention", a0), cands({"flash", "cudnn"}), s.probe(), ChooserOptions{}).source,
            Source::cached);
  EXPECT_EQ(later.decide(key("attention", a1), cands({"flash", "cudnn"}), s.probe(), ChooserOptions{}).source,
            Source::measured);
}

TEST(Fingerprint, GeneratorHashesFileContents) {
  // The build's generator script on scratch files: an edit changes that file's hash.
  TempDir dir;
  const std::string src = dir.path() + "/backends/cuda";
  fs::create_directories(src);
  { std::ofstream(src + "/kernel.cu") << "__global__ void k() {}\n"; }
  { std::ofstream(src + "/other.cu") << "// unchanged\n"; }
  {
    std::ofstream in(dir.path() + "/inputs.cmake");
    in << "set(HK_FP_ROOT \"" << dir.path() << "\")\nset(HK_FP_FILES \"backends/cuda/kernel.cu;backends/cuda/other.cu\")\n"
       << "set(HK_FP_IDENTITY \"test \\\"quoted\\\" id\")\n";
  }
  auto generate = [&](const std::string& out) {
    const std::string cmd = std::string(HK_TUNE_CMAKE) + " -DINPUTS=" + dir.path() + "/inputs.cmake -DOUTPUT=" + out +
                            " -P " + HK_TUNE_FINGERPRINT_SCRIPT;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream f(out);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  auto line_of = [](const std::string& text, const std::string& file) {
    const size_t at = text.find(file);
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
  };
  const std::string before = generate(dir.path() + "/a.cpp");
  { std::ofstream(src + "/kernel.cu") << "__global__ void k() { /* faster */ }\n"; }
  const std::string after = generate(dir.path() + "/b.cpp");
  ASSERT_FALSE(line_of(before, "kernel.cu").empty()) << before;
  EXPECT_NE(line_of(before, "kernel.cu"), line_of(after, "kernel.cu"));
  EXPECT_EQ(line_of(before, "other.cu"), line_of(after, "other.cu"));
  EXPECT_NE(after.find("test \\\"quoted\\\" id"), std::string::npos) << after;
}

TEST(Fingerprint, BuildTableCoversTheKernelSources) {
  // The table compiled into this binary lists the CUDA backend's and the tune mechanism's files.
  bool tune = false, any_backend = false;
  for (const auto& s : hk::tune::source_hashes()) {
    EXPECT_EQ(s.sha256.size(), 64u) << s.path;
    tune |= s.path == "src/hk/tune/chooser.cpp";
    any_backend |= s.path.rfind("backends/", 0) == 0;
  }
  EXPECT_TRUE(tune);
  EXPECT_TRUE(any_backend);
  EXPECT_FALSE(hk::tune::build_identity().empty());
}

// ---- plan choices -------------------------------------------------------------------------------

struct Log {
  std::vector<std::string> calls;
};

hk::Kernel<Log> chain(const std::string& name, std::initializer_list<hk::StepKind> kinds) {
  std::vector<hk::StepKind> ks(kinds);
  hk::Kernel<Log> k;
  k.name = name;
  k.covers = [ks](const std::vector<hk::Step>& steps, size_t at, const hk::Shape&) {
    if (at + ks.size() > steps.size()) return 0;
    for (size_t i = 0; i < ks.size(); ++i)
      if (steps[at + i].kind != ks[i]) return 0;
    return int(ks.size());
  };
  k.run = [name](Log& log, const hk::Step*, int) { log.calls.push_back(name); };
  return k;
}

std::vector<hk::Kernel<Log>> toy_table() {
  using K = hk::StepKind;
  std::vector<hk::Kernel<Log>> t;
  for (K k : {K::ln1, K::qkv_proj, K::attention, K::out_proj, K::ln2, K::ffn_in, K::ffn_out, K::final_ln})
    t.push_back(chain(std::string("single.") + hk::to_string(k), {k}));
  t.push_back(chain("alt.attention", {K::attention}));
  t.push_back(chain("chain.post", {K::out_proj, K::ln2, K::ffn_in, K::ffn_out, K::ln1}));
  t.push_back(chain("chain.tail", {K::out_proj, K::ln2, K::ffn_in, K::ffn_out, K::final_ln}));
  return t;
}

TEST(PlanChoice, SegmentsCompareChainsWithTheKernelsTheyReplace) {
  const auto steps = hk::forward_steps(2);
  const auto table = toy_table();
  const hk::Shape shape{2, 8, {}, hk::Precision::fast};
  // At layer 0's out_proj: the default (single out_proj + the singles up to layer 1's ln1) vs
  // the chain; both cover the same 5 steps.
  const auto seg = hk::tune::segment_options(steps, table, shape, 3);
  EXPECT_EQ(seg.count, 5);
  ASSERT_EQ(seg.options.size(), 2u);
  EXPECT_EQ(seg.options[0].name,
            "single.out_proj + single.ln2 + single.ffn_in + single.ffn_out + single.ln1");
  EXPECT_EQ(seg.options[0].head_count(), 1);
  EXPECT_EQ(seg.options[1].name, "chain.post");
  EXPECT_EQ(hk::tune::segment_label(steps, 3, 5), "out_proj..ln1'");
  // At the attention: two single-step alternatives, the table's first is the default.
  const auto att = hk::tune::segment_options(steps, table, shape, 2);
  ASSERT_EQ(att.options.size(), 2u);
  EXPECT_EQ(att.options[0].name, "single.attention");
  EXPECT_EQ(att.options[1].name, "alt.attention");
  // The last layer's out_proj meets the tail chain, not the cross-layer one.
  const auto tail = hk::tune::segment_options(steps, table, shape, 10);
  ASSERT_EQ(tail.options.size(), 2u);
  EXPECT_EQ(tail.options[1].name, "chain.tail");
}

TEST(PlanChoice, DefaultChoicesReproduceMakePlan) {
  const auto steps = hk::forward_steps(3);
  auto table = toy_table();
  const hk::Shape shape{2, 8, {}, hk::Precision::fast};
  int segments = 0;
  std::vector<std::string> committed;
  const auto plan = hk::tune::make_plan_by_choice(
      steps, table, shape,
      [&](const hk::tune::Segment<Log>&) {
        ++segments;
        return 0;
      },
      [&](const hk::PlannedKernel<Log>& k) { committed.push_back(k.kernel->name); });
  const auto greedy = hk::make_plan(steps, table, shape);
  ASSERT_EQ(plan.size(), greedy.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    EXPECT_EQ(plan[i].kernel, greedy[i].kernel);
    EXPECT_EQ(plan[i].first, greedy[i].first);
  }
  EXPECT_EQ(committed.size(), plan.size());
  EXPECT_EQ(segments, int(steps.size()));
}

TEST(PlanChoice, ChosenChainsCommitOnlyTheirSteps) {
  const auto steps = hk::forward_steps(2);
  auto table = toy_table();
  const hk::Shape shape{2, 8, {}, hk::Precision::fast};
  const auto plan = hk::tune::make_plan_by_choice(
      steps, table, shape, [](const hk::tune::Segment<Log>& s) { return int(s.options.size()) - 1; },
      [](const hk::PlannedKernel<Log>&) {});
  Log log;
  hk::run_plan(plan, steps, log);
  const std::vector<std::string> want = {"single.ln1",    "single.qkv_proj", "alt.attention", "chain.post",
                                         "single.qkv_proj", "alt.attention", "chain.tail"};
  EXPECT_EQ(log.calls, want);
  // Every step covered exactly once, in order.
  size_t next = 0;
  for (const auto& k : plan) {
    EXPECT_EQ(k.first, next);
    next += size_t(k.count);
  }
  EXPECT_EQ(next, steps.size());
}

TEST(PlanChoice, UncoveredStepIsAnError) {
  const auto steps = hk::forward_steps(1);
  std::vector<hk::Kernel<Log>> table = {chain("only.ln1", {hk::StepKind::ln1})};
  EXPECT_THROW(hk::tune::segment_options(steps, table, hk::Shape{}, 1), hk::Error);
}

}  // namespace
