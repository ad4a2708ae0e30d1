// Plan choices: where hk/plan.hpp's make_plan takes the first kernel of the table that covers a
// position, a tuned plan considers every kernel that covers it. Kernels of different lengths are
// compared over the same steps: each option is a *segment* as long as the longest covering
// kernel, made of that kernel followed by the first-match kernels (that fit) of the remaining
// steps, so a chain of 5 steps is timed against the 5 single kernels it replaces. Option 0 is
// the table's first covering kernel: the untuned plan's choice.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "hk/error.hpp"
#include "hk/plan.hpp"

namespace hk::tune {

template <class Ctx>
struct SegmentOption {
  std::vector<PlannedKernel<Ctx>> kernels;  // kernels[0] starts at the position
  std::string name;                         // kernel names joined by " + "
  int head_count() const { return kernels.front().count; }
};

template <class Ctx>
struct Segment {
  size_t first = 0;
  int count = 0;  // steps every option covers
  std::vector<SegmentOption<Ctx>> options;
};

// The options at `at`. An option whose remainder cannot be filled exactly is left out; the
// table's first covering kernel always yields one (its segment is what make_plan would run).
template <class Ctx>
Segment<Ctx> segment_options(const std::vector<Step>& steps, const std::vector<Kernel<Ctx>>& table,
                             const Shape& shape, size_t at) {
  struct Cover {
    const Kernel<Ctx>* k;
    int n;
  };
  std::vector<Cover> covers;
  int widest = 0;
  for (const auto& k : table) {
    const int n = k.covers(steps, at, shape);
    if (n <= 0) continue;
    if (at + size_t(n) > steps.size()) throw Error("kernel " + k.name + " overruns the plan");
    covers.push_back({&k, n});
    if (n > widest) widest = n;
  }
  if (covers.empty())
    throw Error(std::string("no kernel covers step ") + to_string(steps[at].kind) + " of layer " +
                std::to_string(steps[at].layer) + " for this shape");
  Segment<Ctx> seg;
  seg.first = at;
  seg.count = widest;
  const size_t end = at + size_t(widest);
  for (const Cover& c : covers) {
    SegmentOption<Ctx> o;
    o.kernels.push_back({c.k, at, c.n});
    o.name = c.k->name;
    size_t pos = at + size_t(c.n);
    bool filled = true;
    while (pos < end) {
      const Kernel<Ctx>* fill = nullptr;
      int n = 0;
      for (const auto& k : table) {
        n = k.covers(steps, pos, shape);
        if (n > 0 && pos + size_t(n) <= end) {
          fill = &k;
          break;
        }
      }
      if (!fill) {
        filled = false;
        break;
      }
      o.kernels.push_back({fill, pos, n});
      o.name += " + " + fill->name;
      pos += size_t(n);
    }
    if (filled) seg.options.push_back(std::move(o));
  }
  if (seg.options.empty())
    throw Error(std::string("no complete segment at step ") + to_string(steps[at].kind) + " of layer " +
                std::to_string(steps[at].layer));
  return seg;
}

// "out_proj..ln1" style label of a segment's steps (layer-free, for decision keys).
inline std::string segment_label(const std::vector<Step>& steps, size_t first, int count) {
  std::string s = to_string(steps[first].kind);
  if (count > 1) s += std::string("..") + to_string(steps[first + size_t(count) - 1].kind);
  if (count > 1 && steps[first + size_t(count) - 1].layer != steps[first].layer) s += "'";  // crosses a layer
  return s;
}

// A plan built by choosing at each position: `choose(segment)` returns the option index; only
// that option's first kernel is committed (the next position chooses again), and `after` sees
// each committed kernel in order (a tuning warm-up runs it there, so the next choice measures on
// the data this one produced). With choose = 0 everywhere this is make_plan's plan.
template <class Ctx, class Choose, class After>
std::vector<PlannedKernel<Ctx>> make_plan_by_choice(const std::vector<Step>& steps,
                                                    const std::vector<Kernel<Ctx>>& table, const Shape& shape,
                                                    Choose&& choose, After&& after) {
  std::vector<PlannedKernel<Ctx>> plan;
  for (size_t at = 0; at < steps.size();) {
    const Segment<Ctx> seg = segment_options(steps, table, shape, at);
    const int i = choose(seg);
    if (i < 0 || size_t(i) >= seg.options.size()) throw Error("plan choice out of range");
    const PlannedKernel<Ctx> k = seg.options[size_t(i)].kernels.front();
    plan.push_back(k);
    after(k);
    at += size_t(k.count);
  }
  return plan;
}

}  // namespace hk::tune
