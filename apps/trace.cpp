#include "trace.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace hk::app {

Trace& trace() {
  static Trace t;
  return t;
}

void Trace::enable(Clock::time_point origin) {
  std::lock_guard<std::mutex> lock(m_);
  origin_ = origin;
  on_.store(true, std::memory_order_relaxed);
}

int Trace::tid_locked() {
  // Per thread, not by std::thread::id: an id is reused once its thread has ended, and a new
  // thread must get a track of its own.
  thread_local int track = -1;
  if (track < 0) {
    track = int(names_.size());
    names_.push_back("thread " + std::to_string(track));
  }
  return track;
}

void Trace::name_thread(const std::string& name) {
  if (!on()) return;
  std::lock_guard<std::mutex> lock(m_);
  names_[size_t(tid_locked())] = name;
}

void Trace::add(const char* name, Clock::time_point begin, Clock::time_point end, int64_t chunk) {
  if (!on()) return;
  using us = std::chrono::duration<double, std::micro>;
  std::lock_guard<std::mutex> lock(m_);
  events_.push_back(Event{name, tid_locked(), us(begin - origin_).count(), us(end - begin).count(), chunk});
}

std::string Trace::write(const std::string& path, int rank) const {
  nlohmann::json events = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> lock(m_);
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"args", {{"name", "hk_forward rank " + std::to_string(rank)}}}});
    for (size_t k = 0; k < names_.size(); ++k)
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", k}, {"args", {{"name", names_[k]}}}});
    for (const Event& e : events_) {
      nlohmann::json j = {{"name", e.name}, {"ph", "X"}, {"pid", rank}, {"tid", e.tid}, {"ts", e.begin_us}, {"dur", e.dur_us}};
      if (e.chunk >= 0) j["args"] = {{"chunk", e.chunk}};
      events.push_back(std::move(j));
    }
  }
  errno = 0;
  std::ofstream f(path);
  if (!f) return "cannot create " + path + (errno ? std::string(" (") + std::strerror(errno) + ")" : std::string());
  f << nlohmann::json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump() << '\n';
  f.close();
  if (!f) return "cannot write " + path;
  return "";
}

}  // namespace hk::app
