# Install rules and the exported CMake package: `find_package(hk)` gives hk::hk.
# Included by the top-level CMakeLists.txt after every target exists.
#
# Layout under the prefix:
#   lib/                           libhk.a libhk_core.a libhk_kokkos.a [libhk_cuda.a]
#   include/hk/                    the core's public headers, io/, the generated build_config.hpp
#   include/hk/backends/kokkos/    backend.hpp     } include/hk/backends is on the exported include
#   include/hk/backends/cuda/      engine.hpp ...  } path, so `#include "kokkos/backend.hpp"` works
#                                  as in the build tree without claiming include/kokkos or
#                                  include/cuda (the CUDA toolkit owns the latter) in a shared prefix
#   bin/                           hk_forward hk_generate hk_reference.py (apps/CMakeLists.txt)
#   share/hk/                      data/: sample.h5, cases.csv, the goldens
#   lib/cmake/hk/                  hkConfig.cmake, hkConfigVersion.cmake, hkTargets*.cmake,
#                                  HkKokkos.cmake (re-finds Kokkos for the consumer)
include(CMakePackageConfigHelpers)

# <prefix>/lib/cmake/hk is where find_package(hk) looks given CMAKE_PREFIX_PATH=<prefix>.
set(HK_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/hk")
set(HK_INSTALL_DATADIR "${CMAKE_INSTALL_DATADIR}/hk")
set(HK_INSTALL_BACKEND_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}/hk/backends")

# ---- libraries and their export set -------------------------------------------------------------
set(_hk_exported hk hk_core hk_kokkos)
if(TARGET hk_cuda)
  list(APPEND _hk_exported hk_cuda)
endif()
# Every hk target links hk_core PUBLIC, so its interface carries the backend include root too.
set_property(TARGET hk_core APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES
             "$<INSTALL_INTERFACE:${HK_INSTALL_BACKEND_INCLUDEDIR}>")
install(TARGETS ${_hk_exported} EXPORT hkTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT hkTargets NAMESPACE hk:: DESTINATION ${HK_INSTALL_CMAKEDIR})

# ---- headers ---------------------------------------------------------------------------------------
# *_detail.hpp are internal to their directory (h5_detail.hpp is the one header that includes hdf5.h),
# and so is parallel_output_file.hpp (MPI-IO; its library is not installed).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/hk/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/hk
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*_detail.hpp" EXCLUDE
        # the MPI-IO writer includes mpi.h and its library (hk_io_mpi) is internal to the tools
        PATTERN "parallel_output_file.hpp" EXCLUDE)
install(FILES ${PROJECT_BINARY_DIR}/include/hk/build_config.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/hk)
install(FILES ${PROJECT_SOURCE_DIR}/backends/kokkos/backend.hpp
        DESTINATION ${HK_INSTALL_BACKEND_INCLUDEDIR}/kokkos)
if(TARGET hk_cuda)
  install(FILES ${PROJECT_SOURCE_DIR}/backends/cuda/backend.hpp ${PROJECT_SOURCE_DIR}/backends/cuda/engine.hpp
          DESTINATION ${HK_INSTALL_BACKEND_INCLUDEDIR}/cuda)
endif()

# ---- tools and data ----------------------------------------------------------------------------------
# apps/CMakeLists.txt installs the programs; an installed program keeps the RPATH of non-system
# libraries it linked (a user's Kokkos, Spack's HDF5), so it runs without LD_LIBRARY_PATH.
foreach(tool hk_forward hk_generate)
  if(TARGET ${tool})
    set_target_properties(${tool} PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  endif()
endforeach()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/data/ DESTINATION ${HK_INSTALL_DATADIR} USE_SOURCE_PERMISSIONS)

# ---- the package files ---------------------------------------------------------------------------
# What the config file needs to recreate the imported targets hk's own targets link to.
set(HK_CONFIG_KOKKOS_DIR "")
set(HK_CONFIG_KOKKOSKERNELS_DIR "")
if(TARGET Kokkos::kokkos)  # a Kokkos package (Kokkos_ROOT / Kokkos_DIR): pin the consumer to it
  set(HK_CONFIG_KOKKOS_DIR "${Kokkos_DIR}")
  set(HK_CONFIG_KOKKOSKERNELS_DIR "${KokkosKernels_DIR}")
endif()
set(HK_CONFIG_CUDA_ROOT "")
if(TARGET hk_cuda AND CUDAToolkit_BIN_DIR)
  get_filename_component(HK_CONFIG_CUDA_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
endif()
# Libraries linked by absolute path (e.g. cuDNN) are written into hkTargets.cmake as such; the
# config file checks they still exist and says which one is missing.
set(HK_CONFIG_LIBRARY_FILES "")
foreach(t IN LISTS _hk_exported)
  get_target_property(_libs ${t} INTERFACE_LINK_LIBRARIES)
  foreach(l IN LISTS _libs)
    if(l MATCHES "^\\$<LINK_ONLY:(.*)>$")
      set(l "${CMAKE_MATCH_1}")
    endif()
    if(IS_ABSOLUTE "${l}" AND NOT l MATCHES "\\$<")
      list(APPEND HK_CONFIG_LIBRARY_FILES "${l}")
    endif()
  endforeach()
endforeach()
list(REMOVE_DUPLICATES HK_CONFIG_LIBRARY_FILES)
set(HK_CONFIG_CUDA_ARCHITECTURES "")
if(TARGET hk_cuda)
  get_target_property(HK_CONFIG_CUDA_ARCHITECTURES hk_cuda CUDA_ARCHITECTURES)
endif()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/hkConfig.cmake.in
  ${PROJECT_BINARY_DIR}/package/hkConfig.cmake
  INSTALL_DESTINATION ${HK_INSTALL_CMAKEDIR}
  PATH_VARS HK_INSTALL_DATADIR CMAKE_INSTALL_BINDIR)
# 0.x: a minor release may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/hkConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/package/hkConfig.cmake ${PROJECT_BINARY_DIR}/package/hkConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/HkKokkos.cmake
        DESTINATION ${HK_INSTALL_CMAKEDIR})
