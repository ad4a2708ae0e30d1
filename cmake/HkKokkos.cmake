# Finds Kokkos and Kokkos Kernels and defines hk::kokkos / hk::kokkoskernels.
#
# A user's own Kokkos (4.x or 5.x, any host backend) comes through Kokkos_ROOT / Kokkos_DIR
# (and KokkosKernels_ROOT): its CMake package is used as is. Without those, Debian's Trilinos
# Kokkos 3.4 is found directly: its TriBITS package files name include directories that do
# not exist, so they are bypassed and imported targets are made from the headers and libraries.

if(DEFINED Kokkos_ROOT OR DEFINED Kokkos_DIR OR DEFINED ENV{Kokkos_ROOT})
  find_package(Kokkos REQUIRED CONFIG)
  find_package(KokkosKernels REQUIRED CONFIG)
  add_library(hk::kokkos INTERFACE IMPORTED)
  target_link_libraries(hk::kokkos INTERFACE Kokkos::kokkos)
  add_library(hk::kokkoskernels INTERFACE IMPORTED)
  target_link_libraries(hk::kokkoskernels INTERFACE Kokkos::kokkoskernels)
  set(HK_KOKKOS_SOURCE "package ${Kokkos_DIR} (Kokkos ${Kokkos_VERSION})")
  return()
endif()

find_path(HK_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp PATH_SUFFIXES trilinos kokkos
          DOC "directory holding Kokkos_Core.hpp")
find_path(HK_KOKKOSKERNELS_INCLUDE_DIR KokkosBlas3_gemm.hpp PATH_SUFFIXES trilinos kokkos-kernels
          DOC "directory holding KokkosBlas3_gemm.hpp")
find_library(HK_KOKKOSCORE_LIBRARY NAMES trilinos_kokkoscore kokkoscore)
find_library(HK_KOKKOSCONTAINERS_LIBRARY NAMES trilinos_kokkoscontainers kokkoscontainers)
find_library(HK_KOKKOSKERNELS_LIBRARY NAMES trilinos_kokkoskernels kokkoskernels)
find_package(BLAS REQUIRED)

foreach(v HK_KOKKOS_INCLUDE_DIR HK_KOKKOSKERNELS_INCLUDE_DIR HK_KOKKOSCORE_LIBRARY
          HK_KOKKOSCONTAINERS_LIBRARY HK_KOKKOSKERNELS_LIBRARY)
  if(NOT ${v})
    message(FATAL_ERROR "hk: Kokkos not found (${v}). Install libtrilinos-kokkos-dev and "
                        "libtrilinos-kokkos-kernels-dev, or point Kokkos_ROOT at your Kokkos.")
  endif()
endforeach()

add_library(hk::kokkos INTERFACE IMPORTED)
set_target_properties(hk::kokkos PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${HK_KOKKOS_INCLUDE_DIR}"
  INTERFACE_LINK_LIBRARIES "${HK_KOKKOSCONTAINERS_LIBRARY};${HK_KOKKOSCORE_LIBRARY};${CMAKE_DL_LIBS}")
add_library(hk::kokkoskernels INTERFACE IMPORTED)
set_target_properties(hk::kokkoskernels PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${HK_KOKKOSKERNELS_INCLUDE_DIR}"
  INTERFACE_LINK_LIBRARIES "${HK_KOKKOSKERNELS_LIBRARY};hk::kokkos;${BLAS_LIBRARIES}")
set(HK_KOKKOS_SOURCE "system headers ${HK_KOKKOS_INCLUDE_DIR}")
