#include "hk/tune/fingerprint.hpp"

#include <cstdint>
#include <cstdio>

namespace hk::tune {
namespace {

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(const std::string& s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
    h ^= 0xff;  // separator: ("ab","c") and ("a","bc") differ
    h *= 1099511628211ull;
  }
  std::string hex() const {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
    return b;
  }
};

}  // namespace

std::string fnv1a_hex(const std::string& s) {
  Fnv f;
  f.add(s);
  return f.hex();
}

std::string fingerprint(const std::vector<SourceHash>& table, const std::string& identity,
                        const std::vector<std::string>& prefixes) {
  Fnv f;
  f.add(identity);
  for (const std::string& p : prefixes) f.add("prefix:" + p);
  for (const SourceHash& s : table) {
    bool wanted = prefixes.empty();
    for (const std::string& p : prefixes)
      if (s.path.compare(0, p.size(), p) == 0) wanted = true;
    if (!wanted) continue;
    f.add(s.path);
    f.add(s.sha256);
  }
  return f.hex();
}

std::string fingerprint(const std::vector<std::string>& prefixes) {
  return fingerprint(source_hashes(), build_identity(), prefixes);
}

}  // namespace hk::tune
