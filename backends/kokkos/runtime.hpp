// Kokkos lifetime for hk. The first engine initialises Kokkos unless the application already
// did; Kokkos is finalised once, after exit() has begun AND the last engine (with all its
// views) is gone, whichever comes second. So engines held in static objects are safe, and an
// application that initialises Kokkos itself keeps that duty (it must destroy its engines
// before calling Kokkos::finalize). Kokkos cannot be initialised again after finalize: an
// engine created after that point throws hk::Error.
#pragma once

namespace hk::kokkos {

// Held as the first member of every object owning Kokkos views, so it is destroyed last.
class RuntimeRef {
 public:
  RuntimeRef();   // initialises Kokkos if needed; throws hk::Error when it was already finalised
  ~RuntimeRef();  // may finalise Kokkos (see above)
  RuntimeRef(const RuntimeRef&) = delete;
  RuntimeRef& operator=(const RuntimeRef&) = delete;
};

// "Kokkos 3.4.1 Serial" and the like, for Engine::device().
const char* runtime_description();

}  // namespace hk::kokkos
