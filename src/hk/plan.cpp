#include "hk/plan.hpp"

namespace hk {

const char* to_string(StepKind k) {
  switch (k) {
    case StepKind::ln1: return "ln1";
    case StepKind::qkv_proj: return "qkv_proj";
    case StepKind::attention: return "attention";
    case StepKind::out_proj: return "out_proj";
    case StepKind::ln2: return "ln2";
    case StepKind::ffn_in: return "ffn_in";
    case StepKind::ffn_out: return "ffn_out";
    case StepKind::final_ln: return "final_ln";
  }
  return "?";
}

std::vector<Step> forward_steps(int n_layers) {
  std::vector<Step> s;
  s.reserve(size_t(n_layers) * 7 + 1);
  for (int l = 0; l < n_layers; ++l)
    for (StepKind k : {StepKind::ln1, StepKind::qkv_proj, StepKind::attention, StepKind::out_proj,
                       StepKind::ln2, StepKind::ffn_in, StepKind::ffn_out})
      s.push_back({k, l});
  s.push_back({StepKind::final_ln, -1});
  return s;
}

int match_chain(const std::vector<Step>& steps, size_t at, std::initializer_list<StepKind> kinds) {
  if (at + kinds.size() > steps.size()) return 0;
  size_t i = at;
  for (StepKind k : kinds)
    if (steps[i++].kind != k) return 0;
  return int(kinds.size());
}

}  // namespace hk
