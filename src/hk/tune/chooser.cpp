#include "hk/tune/chooser.hpp"

#include <algorithm>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <stdexcept>

namespace hk::tune {
namespace {

std::string ms_text(double ms) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g ms", ms);
  return b;
}

std::string sci(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2g", v);
  return b;
}

// Memo entries are per key and candidate list: the same op offered other candidates (a route
// missing on this shape) is another question.
std::string memo_key(const TuneKey& key, const std::vector<Candidate>& candidates) {
  std::string k = key.to_string();
  for (const Candidate& c : candidates) k += "|" + c.id;
  return k;
}

}  // namespace

const char* to_string(Source s) {
  switch (s) {
    case Source::single: return "single candidate";
    case Source::untuned: return "untuned default";
    case Source::pinned: return "pinned";
    case Source::memo: return "same as earlier";
    case Source::cached: return "tune cache";
    case Source::measured: return "measured";
  }
  return "?";
}

const char* to_string(Verdict v) {
  switch (v) {
    case Verdict::winner: return "winner";
    case Verdict::accepted: return "slower";
    case Verdict::rejected_numeric: return "rejected (numeric guard)";
    case Verdict::failed: return "failed";
    case Verdict::not_measured: return "not measured";
  }
  return "?";
}

std::string Decision::describe() const {
  std::string s = op + " [" + to_string(source);
  if (source == Source::measured) s += ", " + ms_text(tune_ms) + " of tuning";
  s += "]:";
  // Long lists (cuBLASLt configurations around the heuristic's): the first candidate, the chosen
  // one, the eight fastest and the rejected or failed, then how many more were left out.
  std::vector<bool> shown(candidates.size(), candidates.size() <= 16);
  if (candidates.size() > 16) {
    std::vector<size_t> timed;
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (results[i].ms >= 0) timed.push_back(i);
      if (i == 0 || int(i) == chosen || results[i].verdict == Verdict::rejected_numeric ||
          results[i].verdict == Verdict::failed)
        shown[i] = true;
    }
    std::stable_sort(timed.begin(), timed.end(), [&](size_t a, size_t b) { return results[a].ms < results[b].ms; });
    for (size_t j = 0; j < timed.size() && j < 8; ++j) shown[timed[j]] = true;
  }
  size_t hidden = 0;
  bool first = true;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!shown[i]) {
      ++hidden;
      continue;
    }
    const CandidateResult& r = results[i];
    s += (first ? " " : ", ") + candidates[i].id;
    first = false;
    if (r.ms >= 0) s += " " + ms_text(r.ms);
    if (r.verdict == Verdict::rejected_numeric) s += " rejected (max diff " + sci(r.max_diff) + ")";
    if (r.verdict == Verdict::failed) s += " failed (" + r.note + ")";
    if (int(i) == chosen) s += " <- chosen";
  }
  if (hidden) s += ", and " + std::to_string(hidden) + " more";
  if (!note.empty()) s += " (" + note + ")";
  return s;
}

int pick_winner(const std::vector<double>& times, double margin) {
  double best = -1;
  for (double t : times)
    if (t >= 0 && (best < 0 || t < best)) best = t;
  if (best < 0) return 0;
  for (size_t i = 0; i < times.size(); ++i)
    if (times[i] >= 0 && times[i] <= best * (1.0 + margin)) return int(i);
  return 0;
}

Chooser::Chooser(TuneCache* cache, bool verbose, std::function<void(const std::string&)> log)
    : cache_(cache), verbose_(verbose), log_(std::move(log)) {}

void Chooser::say(const std::string& line) const {
  if (log_) {
    log_(line);
  } else {
    std::fprintf(stderr, "hk tune: %s\n", line.c_str());
  }
}

double Chooser::total_tune_ms() const {
  double t = 0;
  for (const Decision& d : history_) t += d.tune_ms;
  return t;
}

bool Chooser::answered(const TuneKey& key, const std::vector<Candidate>& candidates,
                       const ChooserOptions& o) const {
  if (candidates.size() <= 1 || !o.pin.empty() || !o.tune) return true;
  if (memo_.count(memo_key(key, candidates))) return true;
  if (cache_ && !o.remeasure)
    if (auto e = cache_->lookup(key))
      for (const Candidate& c : candidates)
        if (c.id == e->winner) return true;
  return false;
}

Decision Chooser::decide(const TuneKey& key, const std::vector<Candidate>& candidates, const Probe& probe,
                         const ChooserOptions& o) {
  Decision d;
  d.key = key.to_string();
  d.op = key.op;
  d.candidates = candidates;
  d.results.assign(candidates.size(), CandidateResult{});
  auto finish = [&](Source s, int chosen) {
    d.source = s;
    d.chosen = chosen;
    d.results[size_t(chosen)].verdict = Verdict::winner;
    if (verbose_) say(d.describe());
    history_.push_back(d);
    return d;
  };
  if (candidates.empty()) {
    d.candidates.push_back({"none", "none"});
    d.results.resize(1);
    d.note = "no candidate";
    return finish(Source::single, 0);
  }
  if (!o.pin.empty()) {
    for (size_t i = 0; i < candidates.size(); ++i)
      if (candidates[i].id == o.pin) return finish(Source::pinned, int(i));
    d.note = "pinned '" + o.pin + "' is not a candidate here; using the default";
    return finish(Source::pinned, 0);
  }
  if (candidates.size() == 1) return finish(Source::single, 0);
  if (!o.tune) return finish(Source::untuned, 0);

  const std::string mk = memo_key(key, candidates);
  if (auto it = memo_.find(mk); it != memo_.end()) {
    Decision m = it->second;
    m.source = Source::memo;
    m.tune_ms = 0;
    history_.push_back(m);
    return m;
  }
  if (cache_ && !o.remeasure) {
    if (auto e = cache_->lookup(key)) {
      for (size_t i = 0; i < candidates.size(); ++i) {
        if (candidates[i].id != e->winner) continue;
        for (size_t j = 0; j < candidates.size(); ++j) {
          auto t = e->times_ms.find(candidates[j].id);
          if (t != e->times_ms.end()) d.results[j].ms = t->second;
          for (const std::string& r : e->rejected)
            if (r == candidates[j].id) d.results[j].verdict = Verdict::rejected_numeric;
        }
        Decision out = finish(Source::cached, int(i));
        memo_[mk] = out;
        return out;
      }
    }
  }

  const auto t0 = std::chrono::steady_clock::now();
  const size_t n = candidates.size();
  std::vector<bool> alive(n, true);
  // The guard: every candidate's outputs against the default's, on the same inputs.
  try {
    probe.run(0);
    if (o.check_numerics) probe.keep_reference();
  } catch (const std::exception& e) {
    // Without a working default there is nothing to compare with: keep it, measure nothing.
    d.results[0].verdict = Verdict::failed;
    d.results[0].note = e.what();
    d.note = "the default route failed while tuning: " + std::string(e.what());
    say(d.op + ": " + d.note);
    return finish(Source::untuned, 0);
  }
  for (size_t i = 1; i < n; ++i) {
    try {
      probe.run(int(i));
      if (!o.check_numerics) continue;
      const double diff = probe.difference();
      d.results[i].max_diff = diff;
      if (!(diff <= o.tolerance)) {  // NaN-safe
        alive[i] = false;
        d.results[i].verdict = Verdict::rejected_numeric;
        say(d.op + " (" + key.shape + "): candidate " + candidates[i].id + " rejected: max |diff| " + sci(diff) +
            " > " + sci(o.tolerance) + " against " + candidates[0].id);
      }
    } catch (const std::exception& e) {
      alive[i] = false;
      d.results[i].verdict = Verdict::failed;
      d.results[i].note = e.what();
      say(d.op + " (" + key.shape + "): candidate " + candidates[i].id + " failed: " + e.what());
    }
  }
  if (o.check_numerics) d.results[0].max_diff = 0;
  std::vector<double> best(n, -1);
  for (int r = 0; r < (o.rounds < 1 ? 1 : o.rounds); ++r) {
    for (size_t i = 0; i < n; ++i) {
      if (!alive[i]) continue;
      try {
        const double t = probe.time(int(i));
        if (!(t >= 0)) throw std::runtime_error("no time");
        if (best[i] < 0 || t < best[i]) best[i] = t;
      } catch (const std::exception& e) {
        alive[i] = false;
        best[i] = -1;
        d.results[i].verdict = Verdict::failed;
        d.results[i].note = e.what();
        say(d.op + " (" + key.shape + "): timing " + candidates[i].id + " failed: " + e.what());
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    d.results[i].ms = best[i];
    if (alive[i] && best[i] >= 0) d.results[i].verdict = Verdict::accepted;
  }
  const int chosen = pick_winner(best, o.margin);
  d.tune_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  Decision out = finish(Source::measured, chosen);
  memo_[mk] = out;
  if (cache_) {
    TuneEntry e;
    e.winner = candidates[size_t(chosen)].id;
    for (size_t i = 0; i < n; ++i) {
      e.candidates.push_back(candidates[i].id);
      if (best[i] >= 0) e.times_ms[candidates[i].id] = best[i];
      if (out.results[i].verdict == Verdict::rejected_numeric || out.results[i].verdict == Verdict::failed)
        e.rejected.push_back(candidates[i].id);
    }
    cache_->store(key, e);
  }
  return out;
}

}  // namespace hk::tune
