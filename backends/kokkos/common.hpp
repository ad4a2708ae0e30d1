// Shared by every kernel of the Kokkos backend: execution and memory spaces, view types, and
// the few spellings that differ between Kokkos 3.x and 4.x. Nothing here launches work.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>

namespace hk::kokkos {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
using TeamPolicy = Kokkos::TeamPolicy<ExecSpace>;
using Member = TeamPolicy::member_type;

// Row-major matrices ([rows, cols], row r contiguous) and vectors in the execution space.
template <class T>
using Mat = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>;
template <class T>
using ConstMat = Kokkos::View<const T**, Kokkos::LayoutRight, MemSpace>;
template <class T>
using Vec = Kokkos::View<T*, MemSpace>;
template <class T>
using ConstVec = Kokkos::View<const T*, MemSpace>;
using Lengths = Kokkos::View<const int32_t*, MemSpace>;

// Scratch arrays inside team kernels.
template <class T>
using ScratchVec = Kokkos::View<T*, ExecSpace::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// Kokkos 3.x keeps the math functions in Kokkos::Experimental; 4.x moved them to Kokkos.
#if KOKKOS_VERSION >= 30700
namespace kmath = ::Kokkos;
#else
namespace kmath = ::Kokkos::Experimental;
#endif

// Scratch level for `bytes` per team: level 0 (on-chip on GPUs) when it fits, else level 1.
inline int scratch_level(size_t bytes) {
  return bytes <= size_t(TeamPolicy::scratch_size_max(0)) ? 0 : 1;
}

}  // namespace hk::kokkos
