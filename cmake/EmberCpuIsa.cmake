# CPU vector ISA of the project's C++ code: EMBER_CPU_ISA=auto (default) | avx512 | avx2 | sse. Sets
# EMBER_CPU_ISA_RESOLVED (avx512, avx2 or sse) and EMBER_CPU_ISA_FLAGS, and adds the flags to every C++ compile of the
# targets defined after it.
# Invariant: one ISA for all of the project's C++ objects (library, tests, tools, bench), never for CUDA sources.

# Note [One CPU ISA for every target]
# Eigen (private to the library) picks its packet width and GEMM blocking from the -m flags, and ember's own inline
# headers (elementwise_math.h, the half/bfloat16 conversions) are compiled into the library and into every test or
# tool that includes them. Were the library built with AVX2 and a test without, the same inline function or template
# would have two different definitions (an ODR violation the linker resolves by picking one copy), so the flags go
# to every C++ target through add_compile_options, never to a single target. -ffp-contract=off goes with them: GCC
# (and clang) would otherwise fuse a * b + c into an FMA wherever it likes, so ember's scalar kernels and the tests'
# float64 references would round differently from the SSE build; with it, only code that asks for FMA explicitly
# (Eigen's GEMM kernels) changes numerics. A binary built with avx2 (or with auto on an AVX2 machine) needs a CPU
# with AVX2 and FMA (Haswell / Zen 1 or newer): build with EMBER_CPU_ISA=sse for older machines.
#
# Note [AVX-512 builds]
# avx512 adds -mavx512f -mavx512bw -mavx512dq -mavx512vl (Skylake-SP / Ice Lake / Sapphire Rapids, Zen 4): Eigen's
# GEMM runs 16-wide and GCC vectorises ember's loops at 512 bits. auto takes it when the build machine runs those
# four extensions. On a 2-core Sapphire Rapids machine (`ember bench train --threads 2`, 2026-11-23) the step times
# fell by 32% (mlp), 12-17% (cnn) and 17% (gpt) from the avx2 build; libtorch's OpenBLAS and oneDNN pick AVX-512 at
# run time there, so an avx2 build measured against it gives away the vector width. A binary built so needs such a
# CPU: scripts/pack-build records the ISA, and scripts/on-device refuses a pack the machine cannot run.
include(CheckCXXSourceCompiles)
include(CheckCXXSourceRuns)

set(EMBER_CPU_ISA "auto" CACHE STRING
    "Vector ISA of the CPU code: auto (the widest of avx512, avx2 the build machine runs), avx512, avx2, sse (compiler default)")
set_property(CACHE EMBER_CPU_ISA PROPERTY STRINGS auto avx512 avx2 sse)
string(TOLOWER "${EMBER_CPU_ISA}" _ember_isa)
if(NOT _ember_isa MATCHES "^(auto|avx512|avx2|sse)$")
  message(FATAL_ERROR "EMBER_CPU_ISA must be auto, avx512, avx2 or sse (got '${EMBER_CPU_ISA}')")
endif()

set(_ember_avx2_flags -mavx2 -mfma)
# An AVX2 + FMA instruction the compiler and assembler must accept; run, it also proves the CPU executes it.
set(_ember_avx2_source [=[
#include <immintrin.h>
int main() {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 1;
  volatile float in = 2.0f;
  __m256 a = _mm256_set1_ps(in);
  __m256i b = _mm256_add_epi32(_mm256_castps_si256(a), _mm256_setzero_si256());  // AVX2
  __m256 c = _mm256_fmadd_ps(a, _mm256_castsi256_ps(b), a);                       // FMA: 2 * 2 + 2
  float out[8];
  _mm256_storeu_ps(out, c);
  return out[7] == 6.0f ? 0 : 1;
}
]=])
set(_ember_avx512_flags ${_ember_avx2_flags} -mavx512f -mavx512bw -mavx512dq -mavx512vl)
# The four AVX-512 extensions of Note [AVX-512 builds], each asked of the CPU and one instruction of F, BW and VL run.
set(_ember_avx512_source [=[
#include <immintrin.h>
int main() {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("avx512f") ||
      !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512dq") ||
      !__builtin_cpu_supports("avx512vl"))
    return 1;
  volatile float in = 2.0f;
  __m512 a = _mm512_set1_ps(in);
  __m512 c = _mm512_fmadd_ps(a, a, a);                                                  // F: 2 * 2 + 2
  __m512i w = _mm512_add_epi16(_mm512_castps_si512(c), _mm512_setzero_si512());         // BW
  __m256 h = _mm256_mask_mov_ps(_mm256_setzero_ps(), 0xff, _mm512_castps512_ps256(_mm512_castsi512_ps(w)));  // VL
  float out[8];
  _mm256_storeu_ps(out, h);
  return out[7] == 6.0f ? 0 : 1;
}
]=])
set(_ember_saved_flags "${CMAKE_REQUIRED_FLAGS}")
set(_ember_saved_quiet "${CMAKE_REQUIRED_QUIET}")
set(CMAKE_REQUIRED_QUIET ON)

# ember_isa_check(RESULT FLAGS SOURCE RUN): whether the compiler accepts SOURCE with FLAGS (and, with RUN, whether
# this machine runs it); cached under RESULT, as the answer is about the build machine.
function(ember_isa_check result flags source run)
  list(JOIN flags " " CMAKE_REQUIRED_FLAGS)
  if(run)
    check_cxx_source_runs("${source}" ${result})
  else()
    check_cxx_source_compiles("${source}" ${result})
  endif()
  set(${result} ${${result}} PARENT_SCOPE)
endfunction()

set(EMBER_CPU_ISA_RESOLVED sse)
set(_ember_isa_why "")
if(_ember_isa STREQUAL "avx512" OR _ember_isa STREQUAL "avx2")
  if(_ember_isa STREQUAL "avx512")
    ember_isa_check(EMBER_CXX_ACCEPTS_AVX512 "${_ember_avx512_flags}" "${_ember_avx512_source}" FALSE)
    set(_ember_accepts ${EMBER_CXX_ACCEPTS_AVX512})
  else()
    ember_isa_check(EMBER_CXX_ACCEPTS_AVX2_FMA "${_ember_avx2_flags}" "${_ember_avx2_source}" FALSE)
    set(_ember_accepts ${EMBER_CXX_ACCEPTS_AVX2_FMA})
  endif()
  if(NOT _ember_accepts)
    message(FATAL_ERROR "EMBER_CPU_ISA=${_ember_isa} but ${CMAKE_CXX_COMPILER} does not accept its flags (x86-64 only)")
  endif()
  set(EMBER_CPU_ISA_RESOLVED ${_ember_isa})
  set(_ember_isa_why "requested")
elseif(_ember_isa STREQUAL "auto")
  if(CMAKE_CROSSCOMPILING AND NOT CMAKE_CROSSCOMPILING_EMULATOR)
    set(_ember_isa_why "cross-compiling: the target CPU cannot be probed")
  else()
    ember_isa_check(EMBER_CPU_RUNS_AVX512 "${_ember_avx512_flags}" "${_ember_avx512_source}" TRUE)
    if(EMBER_CPU_RUNS_AVX512)
      set(EMBER_CPU_ISA_RESOLVED avx512)
      set(_ember_isa_why "the build machine runs AVX-512 F/BW/DQ/VL")
    else()
      ember_isa_check(EMBER_CPU_RUNS_AVX2_FMA "${_ember_avx2_flags}" "${_ember_avx2_source}" TRUE)
      if(EMBER_CPU_RUNS_AVX2_FMA)
        set(EMBER_CPU_ISA_RESOLVED avx2)
        set(_ember_isa_why "the build machine runs AVX2 and FMA")
      else()
        set(_ember_isa_why "the build machine (or compiler) has no AVX2+FMA")
      endif()
    endif()
  endif()
else()
  set(_ember_isa_why "requested")
endif()
set(CMAKE_REQUIRED_FLAGS "${_ember_saved_flags}")
set(CMAKE_REQUIRED_QUIET "${_ember_saved_quiet}")

set(EMBER_CPU_ISA_FLAGS "")
if(EMBER_CPU_ISA_RESOLVED STREQUAL "avx512")
  set(EMBER_CPU_ISA_FLAGS ${_ember_avx512_flags} -ffp-contract=off)
elseif(EMBER_CPU_ISA_RESOLVED STREQUAL "avx2")
  set(EMBER_CPU_ISA_FLAGS ${_ember_avx2_flags} -ffp-contract=off)
endif()
if(EMBER_CPU_ISA_FLAGS)
  # C++ only: nvcc gets none of these (its host compiler keeps its defaults for the .cu files).
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${EMBER_CPU_ISA_FLAGS}>")
endif()
list(JOIN EMBER_CPU_ISA_FLAGS " " _ember_isa_shown)
message(STATUS "ember: CPU ISA ${EMBER_CPU_ISA_RESOLVED} (EMBER_CPU_ISA=${EMBER_CPU_ISA}: ${_ember_isa_why}),"
               " C++ flags '${_ember_isa_shown}'")

# Note [No trapping math]
# ember never unmasks floating-point exceptions and never reads errno after a math call, so neither needs to stay
# observable. Under GCC's default -ftrapping-math a loop that selects on a float comparison (x < 0 ? a : b) is not
# if-converted and does not vectorise (kernels/cpu/vec_math.h, the softmax lanes); under -fmath-errno every sqrt
# keeps a branch to the library call that would set errno for a negative argument (the AdamW and rsqrt loops).
# -fno-trapping-math and -fno-math-errno change no result (sqrt of a negative is NaN either way); they are Clang's
# defaults on some targets already. Every C++ target, every ISA (Note [One CPU ISA for every target]).
add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fno-trapping-math;-fno-math-errno>")
