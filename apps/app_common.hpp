// Small helpers shared by hk_forward and hk_generate: where the shipped data lives, and
// one-line error reporting.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "hk/error.hpp"

namespace hk::app {

// The directory of the running executable ("" when /proc is unavailable).
inline std::filesystem::path executable_dir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : exe.parent_path();
}

// `name` from the shipped data: $HK_DATA_DIR, then <prefix>/share/hk of an installed tree (next
// to bin/), then the source tree's data/ this binary was built from.
inline std::string find_data_file(const std::string& name) {
  std::vector<std::filesystem::path> dirs;
  if (const char* env = std::getenv("HK_DATA_DIR"); env && *env) dirs.emplace_back(env);
  if (const auto exe = executable_dir(); !exe.empty()) dirs.push_back(exe / ".." / "share" / "hk");
#ifdef HK_DATA_DIR
  dirs.emplace_back(HK_DATA_DIR);
#endif
  std::string tried;
  for (const auto& d : dirs) {
    const auto p = d / name;
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) return p.lexically_normal().string();
    tried += (tried.empty() ? "" : ", ") + d.lexically_normal().string();
  }
  throw Error(name + ": /: expected the shipped file, found it in none of: " + (tried.empty() ? "(no candidates)" : tried) +
              " (set HK_DATA_DIR)");
}

// Messages stay one line whatever a library put in them.
inline std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  return s;
}

inline int report_error(const char* program, const std::string& what) {
  std::fprintf(stderr, "%s: error: %s\n", program, one_line(what).c_str());
  return 1;
}

// True when `a` and `b` name the same existing file.
inline bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return std::filesystem::exists(a, ec) && std::filesystem::exists(b, ec) && std::filesystem::equivalent(a, b, ec);
}

}  // namespace hk::app
