# Driver of the install_package test (cmake -P). Steps, each fatal on failure:
#   1. cmake --install HK_BUILD_DIR into WORK_DIR/staging, then move it to WORK_DIR/prefix
#      (everything in the package must be relative to where it lies);
#   2. the expected files are there, internal headers are not;
#   3. configure consumer/ with CMAKE_PREFIX_PATH=<prefix> only, check it found this package,
#      build it (its main program and one unit per installed header) and run it;
#   4. run the installed hk_generate and hk_forward: the installed sample by path, the default
#      input (which must resolve to <prefix>/share/hk/sample.h5), a freshly generated file;
#   5. with a Python that has torch/h5py/numpy: the installed hk_reference.py compares the
#      sample's output with the installed golden.
# Inputs (-D): HK_BUILD_DIR WORK_DIR CONSUMER_DIR GENERATOR CXX_COMPILER BUILD_TYPE SANITIZE
#              HAVE_CUDA LIBDIR INCLUDEDIR BINDIR DATADIR PYTHON
cmake_minimum_required(VERSION 3.24)

string(TIMESTAMP _t0 "%s")
function(step msg)
  string(TIMESTAMP now "%s")
  math(EXPR dt "${now} - ${_t0}")
  message(STATUS "install_package [${dt}s] ${msg}")
endfunction()

# Runs a command; on failure prints its output and stops the test.
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  WORKING_DIRECTORY "${WORK_DIR}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_package: ${what} failed (exit ${rc}):\n${ARGN}\n--- stdout\n${out}\n--- stderr\n${err}")
  endif()
  set(run_output "${out}${err}" PARENT_SCOPE)
endfunction()

foreach(v HK_BUILD_DIR WORK_DIR CONSUMER_DIR GENERATOR CXX_COMPILER LIBDIR INCLUDEDIR BINDIR DATADIR)
  if(NOT DEFINED ${v} OR "${${v}}" STREQUAL "")
    message(FATAL_ERROR "install_package: -D${v}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(staging "${WORK_DIR}/staging")
set(prefix "${WORK_DIR}/prefix")

# ---- 1. install the already built tree, then relocate it ------------------------------------------
set(config_args "")
if(BUILD_TYPE)
  set(config_args --config "${BUILD_TYPE}")
endif()
run("cmake --install" "${CMAKE_COMMAND}" --install "${HK_BUILD_DIR}" --prefix "${staging}" ${config_args})
file(RENAME "${staging}" "${prefix}")
step("installed ${HK_BUILD_DIR} and moved it to ${prefix}")

# ---- 2. the layout ---------------------------------------------------------------------------------
set(expected
  ${LIBDIR}/libhk.a ${LIBDIR}/libhk_core.a ${LIBDIR}/libhk_kokkos.a
  ${INCLUDEDIR}/hk/engine.hpp ${INCLUDEDIR}/hk/model.hpp ${INCLUDEDIR}/hk/synthetic.hpp
  ${INCLUDEDIR}/hk/build_config.hpp ${INCLUDEDIR}/hk/io/io.hpp
  ${INCLUDEDIR}/hk/backends/kokkos/backend.hpp
  ${BINDIR}/hk_forward ${BINDIR}/hk_generate ${BINDIR}/hk_reference.py
  ${DATADIR}/hk/sample.h5 ${DATADIR}/hk/cases.csv ${DATADIR}/hk/goldens/sample.ref.h5
  ${LIBDIR}/cmake/hk/hkConfig.cmake ${LIBDIR}/cmake/hk/hkConfigVersion.cmake
  ${LIBDIR}/cmake/hk/hkTargets.cmake ${LIBDIR}/cmake/hk/HkKokkos.cmake)
set(unexpected ${INCLUDEDIR}/hk/io/h5_detail.hpp ${INCLUDEDIR}/kokkos ${INCLUDEDIR}/cuda)
if(HAVE_CUDA)
  list(APPEND expected ${LIBDIR}/libhk_cuda.a ${INCLUDEDIR}/hk/backends/cuda/engine.hpp
                       ${INCLUDEDIR}/hk/backends/cuda/backend.hpp)
else()
  list(APPEND unexpected ${LIBDIR}/libhk_cuda.a ${INCLUDEDIR}/hk/backends/cuda)
endif()
foreach(f IN LISTS expected)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "install_package: ${f} is not installed")
  endif()
endforeach()
foreach(f IN LISTS unexpected)
  if(EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "install_package: ${f} is installed but must not be")
  endif()
endforeach()
list(LENGTH expected n_expected)
step("layout: ${n_expected} expected files present, internal headers absent")

# ---- 3. a consumer project ---------------------------------------------------------------------------
set(consumer_build "${WORK_DIR}/consumer-build")
set(consumer_args
  -S "${CONSUMER_DIR}" -B "${consumer_build}" -G "${GENERATOR}"
  "-DCMAKE_PREFIX_PATH=${prefix}"
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(BUILD_TYPE)
  list(APPEND consumer_args "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
endif()
if(SANITIZE)
  # hk's static libraries were compiled with -fsanitize: their consumer must link the runtime.
  list(APPEND consumer_args "-DCMAKE_CXX_FLAGS=-fsanitize=${SANITIZE} -fno-omit-frame-pointer"
                            "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE}")
endif()
run("consumer configure" "${CMAKE_COMMAND}" ${consumer_args})
file(STRINGS "${consumer_build}/CMakeCache.txt" hk_dir_line REGEX "^hk_DIR:")
string(REGEX REPLACE "^hk_DIR:[A-Z]+=" "" found_dir "${hk_dir_line}")
get_filename_component(found_dir "${found_dir}" REALPATH)
get_filename_component(want_dir "${prefix}/${LIBDIR}/cmake/hk" REALPATH)
if(NOT found_dir STREQUAL want_dir)
  message(FATAL_ERROR "install_package: the consumer found hk in '${found_dir}', not in ${want_dir}")
endif()
step("consumer configured against ${found_dir}")
run("consumer build" "${CMAKE_COMMAND}" --build "${consumer_build}" ${config_args})
step("consumer built (main program + one unit per installed header)")
find_program(consumer_exe hk_consumer PATHS "${consumer_build}" "${consumer_build}/${BUILD_TYPE}" NO_DEFAULT_PATH)
if(NOT consumer_exe)
  message(FATAL_ERROR "install_package: hk_consumer not found under ${consumer_build}")
endif()
run("hk_consumer" "${consumer_exe}")
message("${run_output}")
step("hk_consumer passed")

# ---- 4. the installed tools ---------------------------------------------------------------------------
set(bin "${prefix}/${BINDIR}")
run("hk_forward on the installed sample" "${bin}/hk_forward" --backend kokkos
    --input "${prefix}/${DATADIR}/hk/sample.h5" --output "${WORK_DIR}/sample_out.h5")
message("${run_output}")
if(NOT EXISTS "${WORK_DIR}/sample_out.h5")
  message(FATAL_ERROR "install_package: hk_forward wrote no ${WORK_DIR}/sample_out.h5")
endif()
# With no --input hk_forward runs the shipped sample, found next to its bin/ in an installed tree.
run("hk_forward --explain (default input)" ${CMAKE_COMMAND} -E env --unset=HK_DATA_DIR
    "${bin}/hk_forward" --backend kokkos --explain)
get_filename_component(want_sample "${prefix}/${DATADIR}/hk/sample.h5" ABSOLUTE)
string(FIND "${run_output}" "${want_sample}" at)
if(at LESS 0)
  message(FATAL_ERROR "install_package: hk_forward's default input is not ${want_sample}:\n${run_output}")
endif()
run("hk_generate" "${bin}/hk_generate" --batch 3 --seq 7 --d-model 24 --heads 3 --ffn 40 --layers 1
    --causal 1 --lengths-list 0,1,7 --seed 5 --output "${WORK_DIR}/generated.h5")
run("hk_forward on a generated file" "${bin}/hk_forward" --backend kokkos --precision reference --quiet
    --input "${WORK_DIR}/generated.h5" --output "${WORK_DIR}/generated_out.h5")
step("installed hk_forward and hk_generate ran (sample by path, default sample, generated file)")

# ---- 5. the installed reference tool against the installed golden ---------------------------------
if(PYTHON)
  run("hk_reference.py --compare" "${PYTHON}" "${bin}/hk_reference.py" --compare "${WORK_DIR}/sample_out.h5"
      --reference "${prefix}/${DATADIR}/hk/goldens/sample.ref.h5")
  message("${run_output}")
  step("installed hk_reference.py: the sample's output is within budget of the installed golden")
else()
  step("skipped the golden comparison: no Python with torch, h5py and numpy")
endif()
step("PASS")
