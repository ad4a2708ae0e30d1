// The on-disk tune cache: the winner of each measured decision, so that a later process on the
// same machine starts without measuring.
//
// One JSON file, <dir>/tune-v1.json, dir = $HK_TUNE_CACHE, else $XDG_CACHE_HOME/hk, else
// ~/.cache/hk (HK_TUNE_CACHE=off: no file). Keys name everything an answer depends on
// (TuneKey): op, shape, dtype, the device's identity (name, SM count, compute capability,
// driver, runtime and library versions) and the fingerprint of the kernel sources and build, so
// another GPU, another library or an edited kernel never reuses a stale answer.
//
// Concurrency (Slurm array jobs sharing a home directory): a store takes an exclusive flock on
// <file>.lock, re-reads the file, merges its entries and replaces the file by rename of a
// temporary in the same directory, so readers (who take no lock) see either the old or the new
// file, never a torn one, and concurrent writers lose no entries. A file that does not parse (or
// has another format) is ignored with one warning and rebuilt by the next store. I/O failures
// never fail a forward: the cache degrades to in-memory and warns once.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hk::tune {

// The device a decision was measured on; a backend fills it (e.g. tune_cuda's device_identity).
struct DeviceIdentity {
  std::string name;      // "NVIDIA H200"
  int sm_count = 0;
  std::string arch;      // "sm_90"
  std::string driver;    // "13.0" (driver API version)
  std::string runtime;   // "13.0"
  std::string libraries; // "cublasLt 130100 cudnn 91400"
  std::string to_string() const;
};

struct TuneKey {
  std::string op;           // "attention", "gemm.qkv_proj", "plan.out_proj..ln1", "graph"
  std::string shape;        // "B=64 S=128 D=128 H=4 hd=32 causal"
  std::string dtype;        // "f16"
  DeviceIdentity device;
  std::string fingerprint;  // fingerprint() of the sources the candidates depend on
  std::string to_string() const;  // the cache key: every field, '|'-separated
};

struct TuneEntry {
  std::string winner;                      // the winning candidate's id
  std::vector<std::string> candidates;     // ids measured, in order (the first is the default)
  std::map<std::string, double> times_ms;  // id -> measured time (guard-rejected ids absent)
  std::vector<std::string> rejected;       // ids the numeric guard or a failure dropped
  std::string written;                     // UTC time of the measurement
};

class TuneCache {
 public:
  // The default location (see above); "" when HK_TUNE_CACHE=off or no home directory is known.
  static std::string default_directory();

  // `directory` "" -> no disk file (in-memory only). Reads the file if present.
  explicit TuneCache(std::string directory);
  // Default location.
  TuneCache();

  const std::string& path() const { return path_; }  // "" when in-memory only
  bool persistent() const { return !path_.empty(); }

  std::optional<TuneEntry> lookup(const TuneKey& key) const;
  // Records the entry in memory and (persistent) merges it into the file. Never throws for I/O.
  void store(const TuneKey& key, const TuneEntry& entry);
  // Re-reads the file (entries other processes stored since).
  void reload();
  size_t size() const { return entries_.size(); }
  // Warnings so far (corrupt file, unwritable directory), each also printed once on stderr.
  const std::vector<std::string>& warnings() const { return warnings_; }
  // Where warnings go (default: stderr with an "hk tune:" prefix). Tests capture them.
  void set_warning_sink(std::function<void(const std::string&)> sink) { sink_ = std::move(sink); }

 private:
  std::string path_;
  std::map<std::string, TuneEntry> entries_;
  std::vector<std::string> warnings_;
  std::function<void(const std::string&)> sink_;
  bool warned_read_ = false, warned_write_ = false;

  void warn(const std::string& w);
  // Parses the file into `out`; false (and `why`) when it is absent-but-fine (why empty) or bad.
  bool read_file(std::map<std::string, TuneEntry>& out, std::string& why) const;
};

}  // namespace hk::tune
