// plan.hpp: the step list, chain matching, the greedy first-match planner, run order and the
// explain text, on toy kernel tables whose kernels record what they were asked to run.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "hk/error.hpp"
#include "hk/plan.hpp"

namespace {

using hk::Kernel;
using hk::Shape;
using hk::Step;
using hk::StepKind;

// The context of the toy tables: every kernel appends "name:first_index+count".
struct Log {
  const std::vector<Step>* steps;
  std::vector<std::string> calls;
};

Kernel<Log> recording_chain(const std::string& name, std::initializer_list<StepKind> kinds) {
  std::vector<StepKind> ks(kinds);
  Kernel<Log> k;
  k.name = name;
  k.covers = [ks](const std::vector<Step>& steps, size_t at, const Shape&) {
    if (at + ks.size() > steps.size()) return 0;
    for (size_t i = 0; i < ks.size(); ++i)
      if (steps[at + i].kind != ks[i]) return 0;
    return int(ks.size());
  };
  k.run = [name](Log& log, const Step* first, int count) {
    log.calls.push_back(name + ":" + std::to_string(first - log.steps->data()) + "+" + std::to_string(count));
  };
  return k;
}

Kernel<Log> recording_single(const std::string& name, StepKind kind,
                             std::function<bool(const Shape&)> supported = nullptr) {
  return hk::single_step_kernel<Log>(
      name, kind,
      [name](Log& log, const Step& s) {
        log.calls.push_back(name + ":" + std::to_string(&s - log.steps->data()) + "+1");
      },
      supported);
}

std::vector<Kernel<Log>> all_singles() {
  std::vector<Kernel<Log>> t;
  for (StepKind k : {StepKind::ln1, StepKind::qkv_proj, StepKind::attention, StepKind::out_proj, StepKind::ln2,
                     StepKind::ffn_in, StepKind::ffn_out, StepKind::final_ln})
    t.push_back(recording_single(std::string("single.") + hk::to_string(k), k));
  return t;
}

Shape shape(int B = 2) {
  Shape s;
  s.batch = B;
  s.seq_len = 8;
  s.config.d_model = 16;
  s.config.n_heads = 2;
  s.config.n_layers = 2;
  s.config.ffn_dim = 32;
  return s;
}

TEST(ForwardSteps, SevenStepsPerLayerThenTheTail) {
  for (int L : {1, 2, 4}) {
    const auto steps = hk::forward_steps(L);
    ASSERT_EQ(steps.size(), size_t(7 * L + 1));
    const StepKind order[] = {StepKind::ln1, StepKind::qkv_proj, StepKind::attention, StepKind::out_proj,
                              StepKind::ln2, StepKind::ffn_in, StepKind::ffn_out};
    for (int l = 0; l < L; ++l)
      for (int i = 0; i < 7; ++i) {
        EXPECT_EQ(steps[size_t(7 * l + i)].kind, order[i]);
        EXPECT_EQ(steps[size_t(7 * l + i)].layer, l);
      }
    EXPECT_EQ(steps.back().kind, StepKind::final_ln);
    EXPECT_EQ(steps.back().layer, -1);
  }
}

TEST(ForwardSteps, NamesAreDistinct) {
  std::vector<std::string> names;
  for (StepKind k : {StepKind::ln1, StepKind::qkv_proj, StepKind::attention, StepKind::out_proj, StepKind::ln2,
                     StepKind::ffn_in, StepKind::ffn_out, StepKind::final_ln}) {
    const std::string n = hk::to_string(k);
    EXPECT_NE(n, "?");
    for (const auto& m : names) EXPECT_NE(n, m);
    names.push_back(n);
  }
}

TEST(MatchChain, MatchesOnlyTheExactRun) {
  const auto steps = hk::forward_steps(2);
  EXPECT_EQ(hk::match_chain(steps, 3, {StepKind::out_proj, StepKind::ln2}), 2);
  EXPECT_EQ(hk::match_chain(steps, 2, {StepKind::out_proj, StepKind::ln2}), 0) << "wrong start";
  EXPECT_EQ(hk::match_chain(steps, 6, {StepKind::ffn_out, StepKind::ln1}), 2) << "across the layer boundary";
  EXPECT_EQ(hk::match_chain(steps, 13, {StepKind::ffn_out, StepKind::final_ln}), 2);
  EXPECT_EQ(hk::match_chain(steps, 13, {StepKind::ffn_out, StepKind::final_ln, StepKind::ln1}), 0)
      << "a chain longer than what is left never matches";
  EXPECT_EQ(hk::match_chain(steps, 14, {StepKind::final_ln}), 1);
}

// Chains listed first win where they match; singles cover the rest; every step once, in order.
TEST(MakePlan, GreedyFirstMatchWithChainsBeforeSingles) {
  const auto steps = hk::forward_steps(2);
  std::vector<Kernel<Log>> table = {recording_chain("chain.post", {StepKind::out_proj, StepKind::ln2}),
                                    recording_chain("chain.tail", {StepKind::ffn_out, StepKind::final_ln})};
  for (auto& k : all_singles()) table.push_back(k);
  const auto plan = hk::make_plan(steps, table, shape());
  Log log{&steps, {}};
  hk::run_plan(plan, steps, log);
  const std::vector<std::string> expected = {
      "single.ln1:0+1",     "single.qkv_proj:1+1", "single.attention:2+1", "chain.post:3+2",
      "single.ffn_in:5+1",  "single.ffn_out:6+1",  "single.ln1:7+1",      "single.qkv_proj:8+1",
      "single.attention:9+1", "chain.post:10+2",   "single.ffn_in:12+1",  "chain.tail:13+2"};
  EXPECT_EQ(log.calls, expected);
}

// The first kernel in table order that covers anything wins, even if a later one covers more.
TEST(MakePlan, TableOrderBeatsChainLength) {
  const auto steps = hk::forward_steps(1);
  std::vector<Kernel<Log>> table = {recording_single("first.out_proj", StepKind::out_proj),
                                    recording_chain("later.chain", {StepKind::out_proj, StepKind::ln2})};
  for (auto& k : all_singles()) table.push_back(k);
  const auto plan = hk::make_plan(steps, table, shape());
  ASSERT_EQ(plan.size(), steps.size());
  EXPECT_EQ(plan[3].kernel->name, "first.out_proj");
}

// A kernel whose support predicate rejects the shape falls through to the next one.
TEST(MakePlan, UnsupportedShapeFallsBack) {
  const auto steps = hk::forward_steps(1);
  std::vector<Kernel<Log>> table = {recording_single("big_batch_attention", StepKind::attention,
                                                     [](const Shape& s) { return s.batch >= 64; })};
  for (auto& k : all_singles()) table.push_back(k);
  EXPECT_EQ(hk::make_plan(steps, table, shape(2))[2].kernel->name, "single.attention");
  EXPECT_EQ(hk::make_plan(steps, table, shape(64))[2].kernel->name, "big_batch_attention");
}

TEST(MakePlan, UncoveredStepThrowsNamingIt) {
  const auto steps = hk::forward_steps(2);
  std::vector<Kernel<Log>> table;
  for (auto& k : all_singles())
    if (k.name != "single.ffn_in") table.push_back(k);
  try {
    hk::make_plan(steps, table, shape());
    FAIL() << "a step without a kernel must throw";
  } catch (const hk::Error& e) {
    EXPECT_NE(std::string(e.what()).find("ffn_in"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("layer 0"), std::string::npos) << e.what();
  }
}

TEST(MakePlan, KernelOverrunningTheStepsThrows) {
  const auto steps = hk::forward_steps(1);
  Kernel<Log> greedy;
  greedy.name = "greedy";
  greedy.covers = [](const std::vector<Step>& s, size_t at, const Shape&) {
    return s[at].kind == StepKind::final_ln ? 3 : 0;
  };
  greedy.run = [](Log&, const Step*, int) {};
  std::vector<Kernel<Log>> table = {greedy};
  for (auto& k : all_singles()) table.push_back(k);
  EXPECT_THROW(hk::make_plan(steps, table, shape()), hk::Error);
}

TEST(DescribePlan, OneLinePerKernelWithChainsAndTail) {
  const auto steps = hk::forward_steps(1);
  std::vector<Kernel<Log>> table = {recording_chain("chain.tail", {StepKind::ffn_out, StepKind::final_ln})};
  for (auto& k : all_singles()) table.push_back(k);
  const auto plan = hk::make_plan(steps, table, shape());
  const std::string text = hk::describe_plan(plan, steps);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), long(plan.size()));
  EXPECT_NE(text.find("layer 0  ln1"), std::string::npos) << text;
  EXPECT_NE(text.find("ffn_out..final_ln"), std::string::npos) << text;
  EXPECT_NE(text.find("chain.tail"), std::string::npos) << text;
  EXPECT_EQ(text.find("\ntail"), std::string::npos) << "the chain from layer 0 also covers the tail:\n" << text;

  const auto singles = all_singles();
  const std::string plain = hk::describe_plan(hk::make_plan(steps, singles, shape()), steps);
  const size_t last = plain.rfind('\n', plain.size() - 2);
  EXPECT_EQ(plain.compare(last + 1, 4, "tail"), 0) << "a lone final_ln is listed as the tail:\n" << plain;
}

}  // namespace
