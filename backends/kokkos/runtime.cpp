#include "kokkos/runtime.hpp"

#include <cstdlib>
#include <mutex>
#include <string>

#include "hk/error.hpp"
#include "kokkos/common.hpp"

namespace hk::kokkos {
namespace {

struct State {
  std::mutex mutex;
  int live = 0;             // RuntimeRef objects alive
  bool we_initialised = false;
  bool exiting = false;     // exit() has run our handler
  bool finalised = false;   // by us
};

State& state() {
  // Leaked on purpose: the exit handler and late destructors may still use it.
  static State* s = new State;
  return *s;
}

void finalise_locked(State& s) {
  if (s.we_initialised && !s.finalised && s.live == 0 && s.exiting && Kokkos::is_initialized()) {
    Kokkos::finalize();
    s.finalised = true;
  }
}

void on_exit() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.exiting = true;
  finalise_locked(s);
}

}  // namespace

RuntimeRef::RuntimeRef() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.finalised) throw Error("kokkos backend: Kokkos was already finalised in this process");
  if (!Kokkos::is_initialized()) {
#if KOKKOS_VERSION >= 40000
    if (Kokkos::is_finalized()) throw Error("kokkos backend: Kokkos was already finalised in this process");
#endif
    // The (argc, argv) form exists in Kokkos 3.x and 4.x alike; Kokkos still reads its
    // KOKKOS_* environment variables (e.g. the thread count of a threaded host backend).
    int argc = 1;
    char name[] = "hk";
    char* argv[] = {name, nullptr};
    Kokkos::initialize(argc, argv);
    s.we_initialised = true;
    std::atexit(on_exit);
  }
  ++s.live;
}

RuntimeRef::~RuntimeRef() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  --s.live;
  finalise_locked(s);
}

const char* runtime_description() {
  static const std::string d = "Kokkos " + std::to_string(KOKKOS_VERSION / 10000) + "." +
                               std::to_string(KOKKOS_VERSION / 100 % 100) + "." +
                               std::to_string(KOKKOS_VERSION % 100) + " " + ExecSpace::name();
  return d.c_str();
}

}  // namespace hk::kokkos
