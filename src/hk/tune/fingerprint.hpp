// Fingerprints of the kernel sources and of the build, for tune-cache keys: an answer measured
// for one version of a kernel must never be reused for an edited one.
//
// The build generates a table of SHA-256 hashes of every source under backends/ and src/hk/tune
// (src/hk/tune/fingerprint.cmake, re-run whenever one of them changes), plus a build identity
// (compiler, build type, CUDA architectures, hk version). A decision names the files its
// candidates depend on (by path prefix); its fingerprint hashes the build identity with exactly
// those files' hashes, so editing the flash kernel invalidates attention decisions and leaves the
// GEMM decisions cached.
#pragma once

#include <string>
#include <vector>

namespace hk::tune {

struct SourceHash {
  std::string path;    // relative to the source root, e.g. "backends/cuda/attention_flash.cu"
  std::string sha256;  // lowercase hex
};

// The table generated at build time, sorted by path.
const std::vector<SourceHash>& source_hashes();
// "GNU 12.2.0 Release cuda 80;90 hk 0.1.0" (generated).
const std::string& build_identity();

// 16 hex digits: a 64-bit FNV-1a over `identity` and the (path, hash) of every entry of `table`
// whose path starts with one of `prefixes` (all entries when `prefixes` is empty). A prefix that
// matches nothing still enters the hash (a missing file differs from an absent requirement).
std::string fingerprint(const std::vector<SourceHash>& table, const std::string& identity,
                        const std::vector<std::string>& prefixes);
// Same over the generated table and build identity.
std::string fingerprint(const std::vector<std::string>& prefixes);

// FNV-1a 64 of a string, as 16 hex digits (exposed for tests and cache keys).
std::string fnv1a_hex(const std::string& s);

}  // namespace hk::tune
