# Third-party dependencies: Eigen (CPU math), nlohmann-json (trace files, safetensors headers), zlib (optional:
# gzipped datasets), GoogleTest (tests), Google Benchmark (bench).
# Each can come from the system or, on machines without the Debian packages, from a carried source tree.
set(EMBER_EIGEN_INCLUDE_DIR "" CACHE PATH "Directory holding Eigen/ (default: find_package(Eigen3))")
if(EMBER_EIGEN_INCLUDE_DIR)
  add_library(Eigen3::Eigen INTERFACE IMPORTED)
  set_target_properties(Eigen3::Eigen PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${EMBER_EIGEN_INCLUDE_DIR}")
else()
  find_package(Eigen3 3.3 REQUIRED NO_MODULE)
endif()

set(EMBER_JSON_INCLUDE_DIR "" CACHE PATH "Directory holding nlohmann/json.hpp (default: find_package(nlohmann_json))")
if(EMBER_JSON_INCLUDE_DIR)
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
  set_target_properties(nlohmann_json::nlohmann_json PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${EMBER_JSON_INCLUDE_DIR}")
else()
  find_package(nlohmann_json 3 REQUIRED)
endif()

find_package(Threads REQUIRED)

# zlib is optional: without it ember still builds, and reading a .gz dataset raises FormatError asking to gunzip it.
# -DCMAKE_DISABLE_FIND_PACKAGE_ZLIB=ON builds the fallback on a machine that has zlib.
find_package(ZLIB QUIET)
if(NOT ZLIB_FOUND)
  message(STATUS "ember: zlib not found: .gz datasets must be gunzipped first")
endif()

# CLI11 (header-only) for the `ember` command-line program in tools/.
if(EMBER_BUILD_EXAMPLES)
  set(EMBER_CLI11_INCLUDE_DIR "" CACHE PATH "Directory holding CLI/CLI.hpp (default: find_package(CLI11))")
  if(EMBER_CLI11_INCLUDE_DIR)
    add_library(CLI11::CLI11 INTERFACE IMPORTED)
    set_target_properties(CLI11::CLI11 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${EMBER_CLI11_INCLUDE_DIR}")
  else()
    find_package(CLI11 CONFIG REQUIRED)
  endif()
endif()

if(EMBER_BUILD_TESTS)
  if(EMBER_GTEST_SOURCE_DIR)
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
    add_subdirectory(${EMBER_GTEST_SOURCE_DIR} ${CMAKE_BINARY_DIR}/_deps/googletest EXCLUDE_FROM_ALL)
    if(NOT TARGET GTest::gtest)  # GoogleTest >= 1.11 defines these itself
      add_library(GTest::gtest ALIAS gtest)
      add_library(GTest::gtest_main ALIAS gtest_main)
    endif()
  else()
    find_package(GTest REQUIRED)
  endif()
endif()

if(EMBER_BUILD_BENCH)
  find_package(benchmark QUIET)
  if(NOT benchmark_FOUND)
    message(STATUS "ember: Google Benchmark not found: only the standalone benchmarks are built")
  endif()
endif()

# MPI and NCCL for dist/ (optional).
include(${CMAKE_CURRENT_LIST_DIR}/EmberMpi.cmake)
