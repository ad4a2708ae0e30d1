#include "kernel_timeline.hpp"

#include <cupti.h>
#include <cuda_runtime.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>

namespace hk::perf {
namespace {

// CUPTI's entry points, resolved from the loaded library.
struct Api {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiActivityGetNumDroppedRecords) dropped = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
  decltype(&cuptiGetTimestamp) timestamp = nullptr;
};
Api g_api;
bool g_registered = false;

// Filled by CUPTI's buffer-completed callback (CUPTI's own thread).
std::mutex g_mutex;
std::vector<KernelRecord> g_records;
size_t g_dropped = 0;

constexpr size_t kBufferBytes = 8u << 20;
constexpr size_t kAlign = 8;

std::string short_name(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  for (const char* drop : {"(anonymous namespace)::", "hk::cuda::", "hk::"}) {
    for (size_t p; (p = s.find(drop)) != std::string::npos;) s.erase(p, std::strlen(drop));
  }
  // The parameter list of a demangled function: from the '(' that closes the name at depth 0.
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0 && i > 0) {
      s.resize(i);
      break;
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  if (s.size() > 72) s = s.substr(0, 69) + "...";
  return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t* buffer, size_t size, size_t valid) {
  (void)size;
  std::vector<KernelRecord> got;
  CUpti_Activity* rec = nullptr;
  CUptiResult st = CUPTI_SUCCESS;
  while ((st = g_api.next_record(buffer, valid, &rec)) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET || rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      // Copies and fills in the stream show as rows of their own (no grid: grid and block 0).
      KernelRecord r;
      if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        r.name = "memset " + std::to_string(m->bytes) + " B";
        r.start_ns = m->start;
        r.end_ns = m->end;
      } else {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        r.name = "memcpy " + std::to_string(m->bytes) + " B";
        r.start_ns = m->start;
        r.end_ns = m->end;
      }
      got.push_back(std::move(r));
      continue;
    }
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    KernelRecord r;
    r.name = short_name(k->name);
    r.start_ns = k->start;
    r.end_ns = k->end;
    r.grid = k->gridX * k->gridY * k->gridZ;
    r.block = k->blockX * k->blockY * k->blockZ;
    r.cluster = int(k->clusterX * k->clusterY * k->clusterZ);
    r.registers = k->registersPerThread;
    r.dynamic_smem = k->dynamicSharedMemory;
    r.static_smem = k->staticSharedMemory;
    got.push_back(std::move(r));
  }
  size_t dropped = 0;
  if (g_api.dropped) g_api.dropped(ctx, stream_id, &dropped);
  if (st != CUPTI_ERROR_MAX_LIMIT_REACHED) ++dropped;  // the buffer's records ended on an unreadable one
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_dropped += dropped;
  for (auto& r : got) g_records.push_back(std::move(r));
}

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* s = nullptr;
  if (g_api.result_string) g_api.result_string(r, &s);
  throw std::runtime_error(std::string("CUPTI ") + what + ": " + (s ? s : "error " + std::to_string(int(r))));
}

template <class F>
bool resolve(void* lib, const char* sym, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, sym));
  return f != nullptr;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

}  // namespace

KernelTimeline::KernelTimeline() {
  std::vector<std::string> names;
  if (const char* e = std::getenv("HK_CUPTI_LIB")) names.push_back(e);
  names.insert(names.end(), {"libcupti.so.13", "libcupti.so", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
                             "/usr/local/cuda/lib64/libcupti.so"});
  for (const auto& n : names) {
    lib_ = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib_) break;
  }
  if (!lib_) {
    error_ = "libcupti not found (set HK_CUPTI_LIB to its path)";
    return;
  }
  const bool all = resolve(lib_, "cuptiActivityRegisterCallbacks", g_api.register_callbacks) &&
                   resolve(lib_, "cuptiActivityEnable", g_api.enable) &&
                   resolve(lib_, "cuptiActivityFlushAll", g_api.flush_all) &&
                   resolve(lib_, "cuptiActivityGetNextRecord", g_api.next_record) &&
                   resolve(lib_, "cuptiActivityGetNumDroppedRecords", g_api.dropped) &&
                   resolve(lib_, "cuptiGetResultString", g_api.result_string) &&
                   resolve(lib_, "cuptiGetTimestamp", g_api.timestamp);
  if (!all) {
    error_ = "libcupti lacks an activity API entry point";
    return;
  }
  ok_ = true;
}

KernelTimeline::~KernelTimeline() = default;  // CUPTI stays loaded: its thread may still run

void KernelTimeline::start() {
  if (!ok_) throw std::runtime_error("kernel timeline: " + error_);
  if (g_registered) return;
  check(g_api.register_callbacks(buffer_requested, buffer_completed), "register callbacks");
  check(g_api.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable concurrent-kernel records");
  check(g_api.enable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memset records");
  check(g_api.enable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable memcpy records");
  g_registered = true;  // only when every kind is on: collect() refuses otherwise
}

uint64_t KernelTimeline::now_ns() const {
  if (!ok_) throw std::runtime_error("kernel timeline: " + error_);
  uint64_t t = 0;
  check(g_api.timestamp(&t), "timestamp");
  return t;
}

std::vector<KernelRecord> KernelTimeline::collect(uint64_t t0, uint64_t t1) {
  if (!g_registered) throw std::runtime_error("kernel timeline: not started");
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("kernel timeline: device synchronisation failed");
  check(g_api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flush");
  std::vector<KernelRecord> all;
  size_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    all.swap(g_records);
    dropped = g_dropped;
    g_dropped = 0;
  }
  if (dropped) throw std::runtime_error("kernel timeline: CUPTI dropped " + std::to_string(dropped) + " records");
  std::vector<KernelRecord> out, later;
  for (auto& r : all) {
    if (r.start_ns > t1) {
      later.push_back(std::move(r));
    } else if (r.start_ns >= t0) {
      out.push_back(std::move(r));
    }
  }
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (auto& r : later) g_records.push_back(std::move(r));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  return out;
}

std::vector<std::vector<KernelRecord>> split_forwards(const std::vector<KernelRecord>& recs,
                                                      const std::vector<size_t>& counts) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  if (total != recs.size()) {
    throw std::runtime_error("kernel timeline: " + std::to_string(recs.size()) + " records, but the forwards ran " +
                             std::to_string(total) + " kernels");
  }
  std::vector<std::vector<KernelRecord>> out;
  size_t at = 0;
  for (size_t c : counts) {
    out.emplace_back(recs.begin() + std::ptrdiff_t(at), recs.begin() + std::ptrdiff_t(at + c));
    at += c;
  }
  return out;
}

namespace {

std::string one_table(const std::vector<const std::vector<KernelRecord>*>& group) {
  const std::vector<KernelRecord>& first = *group.front();
  const size_t nk = first.size();
  std::vector<std::vector<double>> dur(nk), beg(nk), fin(nk), adv(nk);
  std::vector<double> span, busy;
  for (const auto* fw : group) {
    const std::vector<KernelRecord>& r = *fw;
    const double t0 = double(r[0].start_ns);
    double last_end = t0, sum = 0;  // the latest end so far
    for (size_t k = 0; k < nk; ++k) {
      const double s = double(r[k].start_ns) - t0, e = double(r[k].end_ns) - t0;
      dur[k].push_back((e - s) * 1e-3);
      beg[k].push_back(s * 1e-3);
      fin[k].push_back(e * 1e-3);
      // What this kernel adds to the span: how far its end lies past every earlier end (0 when it
      // ended inside time already covered); the advances of a forward add up to its span.
      adv[k].push_back(std::max(0.0, double(r[k].end_ns) - last_end) * 1e-3);
      last_end = std::max(last_end, double(r[k].end_ns));
      sum += e - s;
    }
    span.push_back((last_end - t0) * 1e-3);
    busy.push_back(sum * 1e-3);
  }
  std::string out =
      "| # | kernel | grid x block (cluster) | regs | smem KB | us | start us | end us | advance us |\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  char line[512];
  for (size_t k = 0; k < nk; ++k) {
    const KernelRecord& r = first[k];
    char shape[64];
    if (r.cluster > 1) {
      std::snprintf(shape, sizeof shape, "%d x %d (%d)", r.grid, r.block, r.cluster);
    } else {
      std::snprintf(shape, sizeof shape, "%d x %d", r.grid, r.block);
    }
    std::snprintf(line, sizeof line, "| %zu | %s | %s | %d | %.1f | %.2f | %.2f | %.2f | %.2f |\n", k, r.name.c_str(), shape,
                  r.registers, (r.dynamic_smem + r.static_smem) / 1024.0, median(dur[k]), median(beg[k]), median(fin[k]),
                  median(adv[k]));
    out += line;
  }
  std::snprintf(line, sizeof line,
                "\nmedian span (first kernel start to last kernel end) %.2f us; median sum of kernel durations %.2f us\n",
                median(span), median(busy));
  out += line;
  return out;
}

}  // namespace

std::string timeline_tables(const std::vector<std::vector<KernelRecord>>& forwards) {
  if (forwards.empty()) throw std::runtime_error("kernel timeline: no forward traced");
  std::vector<std::vector<const std::vector<KernelRecord>*>> groups;
  for (const auto& fw : forwards) {
    if (fw.empty()) throw std::runtime_error("kernel timeline: a forward ran no kernel");
    auto same = [&](const std::vector<const std::vector<KernelRecord>*>& g) {
      const auto& r = *g.front();
      if (r.size() != fw.size()) return false;
      for (size_t k = 0; k < r.size(); ++k)
        if (r[k].name != fw[k].name || r[k].grid != fw[k].grid) return false;
      return true;
    };
    auto it = std::find_if(groups.begin(), groups.end(), same);
    if (it == groups.end()) {
      groups.push_back({&fw});
    } else {
      it->push_back(&fw);
    }
  }
  std::string out;
  char line[160];
  for (size_t g = 0; g < groups.size(); ++g) {
    std::snprintf(line, sizeof line, "%skernel sequence %zu of %zu: %zu of %zu forwards\n\n", g ? "\n" : "", g + 1,
                  groups.size(), groups[g].size(), forwards.size());
    out += line;
    out += one_table(groups[g]);
  }
  return out;
}

}  // namespace hk::perf
