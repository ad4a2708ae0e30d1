// The chooser: the one mechanism behind every route decision of hk (attention route, GEMM layout
// and algorithm, bias+GELU route, chain kernels and tiles, the CUDA graph itself).
//
// A decision is a candidate list whose first entry is the default route. decide():
//   1. one candidate, or a pin (an HK_* knob naming a candidate id), or tuning off (HK_TUNE=0):
//      no measurement; the pinned / first candidate.
//   2. memo: the same key decided earlier by this Chooser (e.g. layer 0 for layers 1..L-1).
//   3. the tune cache: a stored winner that is still among the candidates.
//   4. measurement, through the caller's Probe on the caller's real buffers:
//        run(0), keep_reference()          the default's outputs become the reference
//        for i > 0: run(i), difference()   max |out_i - ref| > tolerance (2e-3): rejected, logged
//        time(i) for each surviving i, `rounds` times interleaved, the minimum kept
//      winner: among the survivors, the first in list order whose time is within `margin` of the
//      fastest (the default wins ties). A candidate whose run or time throws is dropped.
//      The winner is memoised and stored in the cache.
// The Probe decides how a candidate runs and is timed (CUDA: inside a graph, median of events;
// host tests: plain functions). The Chooser itself is backend-neutral and single-threaded.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "hk/tune/tune_cache.hpp"

namespace hk::tune {

struct Candidate {
  std::string id;    // short, stable: cache entries and pins use it ("flash.q16", "kn.3", "epilogue")
  std::string name;  // what explain prints (profiler names of the kernels it runs)
};

// Every call starts from the same inputs: run(i) restores whatever a previous run changed in place.
struct Probe {
  std::function<void(int)> run;          // runs candidate i once, leaving its outputs in place
  std::function<void()> keep_reference;  // after run(0): saves the outputs as the reference
  std::function<double()> difference;    // max |outputs - reference| (inf when non-finite differs)
  std::function<double(int)> time;       // milliseconds of candidate i (lower is better)
};

struct ChooserOptions {
  bool tune = true;          // false: the default (or the pin), never measured
  std::string pin;           // a candidate id; "" = not pinned
  double tolerance = 2e-3;   // numeric guard
  double margin = 0.005;     // a later candidate must beat the earlier ones by more than this
  int rounds = 1;            // timing rounds (best of)
  bool check_numerics = true;  // false: no guard (candidates that compute the same bits by design)
  bool remeasure = false;    // ignore the cache (HK_TUNE_REMEASURE=1)
};

enum class Source { single, untuned, pinned, memo, cached, measured };
const char* to_string(Source s);

enum class Verdict { winner, accepted, rejected_numeric, failed, not_measured };
const char* to_string(Verdict v);

struct CandidateResult {
  Verdict verdict = Verdict::not_measured;
  double ms = -1;        // < 0: not timed
  double max_diff = -1;  // < 0: not compared
  std::string note;      // failure text, pin fallback reason
};

struct Decision {
  std::string key;  // TuneKey::to_string()
  std::string op;   // TuneKey::op, for explain
  std::vector<Candidate> candidates;
  std::vector<CandidateResult> results;
  int chosen = 0;
  Source source = Source::untuned;
  double tune_ms = 0;  // wall time spent measuring (0 unless measured)
  std::string note;
  const Candidate& winner() const { return candidates[size_t(chosen)]; }
  // "attention [measured 1.8 ms]: flash 0.210 ms*, flash.q16 0.190 ms <- winner, cudnn rejected (5e-2)"
  std::string describe() const;
};

// The selection rule (exposed for tests): times[i] < 0 marks a candidate out of the running.
// Returns the first i whose time is within (1 + margin) of the best, or 0 when none ran.
int pick_winner(const std::vector<double>& times, double margin);

class Chooser {
 public:
  // `cache` may be null (no persistence). `log` receives rejections (always) and, when
  // `verbose`, one line per decision; default: stderr with an "hk tune:" prefix.
  explicit Chooser(TuneCache* cache = nullptr, bool verbose = false,
                   std::function<void(const std::string&)> log = nullptr);

  Decision decide(const TuneKey& key, const std::vector<Candidate>& candidates, const Probe& probe,
                  const ChooserOptions& options);

  // True when decide() would answer without calling the probe (single candidate, pin, tuning
  // off, memo, or a usable cache entry): callers skip preparing a measurement then.
  bool answered(const TuneKey& key, const std::vector<Candidate>& candidates, const ChooserOptions& options) const;

  // Every decision made so far, in order (memo hits included), for explain.
  const std::vector<Decision>& history() const { return history_; }
  void clear_memo() { memo_.clear(); }
  double total_tune_ms() const;

 private:
  TuneCache* cache_;
  bool verbose_;
  std::function<void(const std::string&)> log_;
  std::map<std::string, Decision> memo_;
  std::vector<Decision> history_;
  void say(const std::string& line) const;
};

}  // namespace hk::tune
