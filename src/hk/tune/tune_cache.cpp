#include "hk/tune/tune_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hk/tune/knobs.hpp"

namespace hk::tune {
namespace {

constexpr const char* kFormat = "hk-tune-1";
constexpr const char* kFileName = "tune-v1.json";

// mkdir -p; false on failure.
bool make_directories(const std::string& dir) {
  if (dir.empty()) return false;
  std::string partial;
  std::stringstream ss(dir);
  std::string part;
  if (dir[0] == '/') partial = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    partial += part + "/";
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  struct stat st{};
  return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

nlohmann::json to_json(const TuneEntry& e) {
  nlohmann::json j;
  j["winner"] = e.winner;
  j["candidates"] = e.candidates;
  j["times_ms"] = e.times_ms;
  j["rejected"] = e.rejected;
  j["written"] = e.written;
  return j;
}

TuneEntry from_json(const nlohmann::json& j) {
  TuneEntry e;
  e.winner = j.at("winner").get<std::string>();
  if (j.contains("candidates")) e.candidates = j.at("candidates").get<std::vector<std::string>>();
  if (j.contains("times_ms")) e.times_ms = j.at("times_ms").get<std::map<std::string, double>>();
  if (j.contains("rejected")) e.rejected = j.at("rejected").get<std::vector<std::string>>();
  if (j.contains("written")) e.written = j.at("written").get<std::string>();
  return e;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

}  // namespace

std::string DeviceIdentity::to_string() const {
  return name + " " + arch + " " + std::to_string(sm_count) + "SM driver " + driver + " runtime " + runtime +
         (libraries.empty() ? "" : " " + libraries);
}

std::string TuneKey::to_string() const {
  return op + "|" + shape + "|" + dtype + "|" + device.to_string() + "|" + fingerprint;
}

std::string TuneCache::default_directory() {
  const std::string v = knob_value("HK_TUNE_CACHE");
  if (v == "off") return "";
  if (!v.empty()) return v;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/hk";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/hk";
  return "";
}

TuneCache::TuneCache() : TuneCache(default_directory()) {}

TuneCache::TuneCache(std::string directory) {
  if (!directory.empty()) {
    while (directory.size() > 1 && directory.back() == '/') directory.pop_back();
    path_ = directory + "/" + kFileName;
  }
  reload();
}

void TuneCache::warn(const std::string& w) {
  warnings_.push_back(w);
  if (sink_) {
    sink_(w);
  } else {
    std::fprintf(stderr, "hk tune: %s\n", w.c_str());
  }
}

bool TuneCache::read_file(std::map<std::string, TuneEntry>& out, std::string& why) const {
  why.clear();
  std::ifstream in(path_, std::ios::binary);
  if (!in) return false;  // absent: nothing cached yet
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    const nlohmann::json j = nlohmann::json::parse(ss.str());
    if (!j.is_object() || j.value("format", std::string()) != kFormat)
      throw std::runtime_error(std::string("not a ") + kFormat + " file");
    std::map<std::string, TuneEntry> parsed;
    for (const auto& [k, v] : j.at("entries").items()) parsed[k] = from_json(v);
    out = std::move(parsed);
    return true;
  } catch (const std::exception& e) {
    why = path_ + " is unreadable (" + e.what() + "); ignoring it, it will be rebuilt";
    return false;
  }
}

void TuneCache::reload() {
  if (path_.empty()) return;
  std::map<std::string, TuneEntry> disk;
  std::string why;
  if (read_file(disk, why)) {
    for (auto& [k, v] : disk) entries_[k] = std::move(v);
  } else if (!why.empty() && !warned_read_) {
    warned_read_ = true;
    warn(why);
  }
}

std::optional<TuneEntry> TuneCache::lookup(const TuneKey& key) const {
  const auto it = entries_.find(key.to_string());
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void TuneCache::store(const TuneKey& key, const TuneEntry& entry) {
  TuneEntry e = entry;
  if (e.written.empty()) e.written = utc_now();
  entries_[key.to_string()] = e;
  if (path_.empty()) return;

  auto fail = [this](const std::string& what) {
    if (!warned_write_) {
      warned_write_ = true;
      warn("cannot write the tune cache " + path_ + " (" + what + "); decisions stay in memory");
    }
  };
  const std::string dir = path_.substr(0, path_.rfind('/'));
  if (!make_directories(dir)) return fail("cannot create " + dir + ": " + std::strerror(errno));
  const std::string lock_path = path_ + ".lock";
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0) return fail(lock_path + ": " + std::strerror(errno));
  while (::flock(lock, LOCK_EX) != 0) {
    if (errno != EINTR) {
      ::close(lock);
      return fail(std::string("flock: ") + std::strerror(errno));
    }
  }
  // Under the lock: merge whatever other processes stored, then replace the file atomically.
  std::map<std::string, TuneEntry> disk;
  std::string why;
  if (!read_file(disk, why) && !why.empty() && !warned_read_) {
    warned_read_ = true;
    warn(why);
  }
  for (auto& [k, v] : disk)
    if (!entries_.count(k)) entries_[k] = std::move(v);
  entries_[key.to_string()] = e;  // ours wins for its own key

  nlohmann::json j;
  j["format"] = kFormat;
  j["entries"] = nlohmann::json::object();
  for (const auto& [k, v] : entries_) j["entries"][k] = to_json(v);
  const std::string text = j.dump(1);
  const std::string tmp = path_ + ".tmp." + std::to_string(::getpid());
  bool ok = false;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += size_t(n);
    }
    ok = done == text.size() && ::fsync(fd) == 0;
    ok = (::close(fd) == 0) && ok;
    ok = ok && ::rename(tmp.c_str(), path_.c_str()) == 0;
    if (!ok) ::unlink(tmp.c_str());
  }
  const int err = errno;
  ::flock(lock, LOCK_UN);
  ::close(lock);
  if (!ok) fail(tmp + ": " + std::strerror(err));
}

}  // namespace hk::tune
