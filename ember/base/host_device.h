// EMBER_HD marks element math that both the CPU reference and the CUDA kernels compile (DESIGN.md §3).
// Invariant: expands to nothing in host-only translation units, so the same header builds with g++ and nvcc.
#pragma once

#if defined(__CUDACC__)
#define EMBER_HD __host__ __device__
#define EMBER_HD_INLINE __host__ __device__ __forceinline__
#else
#define EMBER_HD
#define EMBER_HD_INLINE inline
#endif

// Loop unrolling hint for device code only (host compilers do not know the pragma).
#if defined(__CUDA_ARCH__)
#define EMBER_UNROLL _Pragma("unroll")
#else
#define EMBER_UNROLL
#endif
