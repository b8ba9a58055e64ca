// Macros of kernel code that both nvcc and the CPU emulator of tests/harness/simt_emulator.h compile (the emulator
// defines its own EMBER_DYNAMIC_SHARED). Invariant: no CUDA header needed.
#pragma once

// Unrolling by a given factor, in device code only (EMBER_UNROLL, base/host_device.h, unrolls fully).
#if defined(__CUDA_ARCH__)
#define EMBER_PRAGMA(x) _Pragma(#x)
#define EMBER_UNROLL_N(n) EMBER_PRAGMA(unroll n)
#else
#define EMBER_UNROLL_N(n)
#endif

// The kernel's dynamic shared memory as `T name[]`, 128-byte aligned (the emulator defines its own form).
#if defined(__CUDACC__)
#define EMBER_DYNAMIC_SHARED(T, name) extern __shared__ __align__(128) T name[]
#endif
