// The knob registry: every HK_* environment variable hk reads at run time, in one table with its
// values and a doc string (docs/KNOBS.md is this table in prose; `hk_forward --knobs` prints it).
// Code reads a knob through knob_value(), which refuses names that are not registered, so an
// undocumented variable cannot creep in.
#pragma once

#include <string>
#include <vector>

namespace hk::tune {

struct Knob {
  const char* name;      // "HK_TUNE"
  const char* values;    // "1|0"
  const char* fallback;  // value when unset
  const char* area;      // "tuning", "cuda", "data", "tests"
  const char* doc;       // one or two sentences
};

// Every registered knob, grouped by area in a stable order.
const std::vector<Knob>& knobs();
const Knob* find_knob(const std::string& name);  // null when not registered

// The variable's value, or "" when unset. Throws hk::Error for a name not in knobs().
std::string knob_value(const char* name);

// The value when it is one of `allowed` ("" counts as unset and gives ""); otherwise throws
// hk::Error naming the variable and the values it takes.
std::string knob_choice(const char* name, const std::vector<std::string>& allowed);

// HK_TUNE: false when "0" (every chooser pinned to its default, nothing timed), true otherwise.
bool tune_enabled();

// The table as aligned text (one block per knob), for --knobs.
std::string describe_knobs();

}  // namespace hk::tune
