// 16-bit float storage types: Half (IEEE binary16) and BFloat16, bit-compatible with CUDA's __half/__nv_bfloat16.
// Invariant: conversion from float rounds to nearest even and preserves inf/nan; both devices share this code (EMBER_HD),
// so fp16/bf16 storage behaves the same on CPU and GPU (DESIGN.md §5). Arithmetic is done in float.
#pragma once

#include <cstdint>
#include <cstring>

#include "ember/base/host_device.h"

namespace ember {

namespace detail {
EMBER_HD_INLINE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
EMBER_HD_INLINE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Note [Half conversions on the device]
// On the GPU a float <-> f16 conversion is one instruction (cvt.rn.f16.f32, cvt.f32.f16), where the portable code
// below takes about fifteen integer operations each way: on an H100, GPT-2 trained 20% slower under autocast-fp16
// than under autocast-bf16 (whose conversions are shifts). Both round to nearest even, overflow to inf and keep
// subnormals (no .ftz), so they give the same bits for every non-NaN value; a NaN's bits are the portable code's
// (float -> f16: sign kept, quiet, payload dropped; f16 -> float: sign and payload kept, made quiet as IEEE 754's
// conversions and x86's F16C do), which the instruction does not follow, chosen by a select after the instruction
// rather than by a branch to the portable code (a branch around fifteen operations the compiler cannot predicate, in
// every f16 kernel's inner loop). So the device and the CPU agree bit for bit. A signalling NaN is made quiet because a
// float operation after the load quiets it on either device (the GPU's generic cast widens through double): kept
// signalling, the 1022 signalling f16 patterns read back quiet from both of an H100's cast kernels. bf16 -> float stays
// a shift on both devices and keeps a signalling NaN as it is; no test compares bf16 NaN bits across devices.
EMBER_HD_INLINE uint16_t float_to_half_bits(float f) {
#if defined(__CUDA_ARCH__)
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  // A NaN gets the portable code's quiet NaN with the sign kept: a select, not a branch.
  const uint16_t nan_bits = static_cast<uint16_t>(((__float_as_uint(f) >> 16) & 0x8000u) | 0x7e00u);
  return f == f ? static_cast<uint16_t>(h) : nan_bits;
#else
  uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u));
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (x < 0x38800000u) {
    // Below the smallest normal half (2^-14): adding 0.5f aligns the value so that float rounding (RNE)
    // yields the half subnormal mantissa in the low bits.
    const float r = bits_float(x) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(r) - 0x3f000000u));
  }
  const uint32_t odd = (x >> 13) & 1u;
  x += 0xc8000fffu + odd;  // rebias exponent (127 -> 15) and round to nearest even
  return static_cast<uint16_t>(sign | (x >> 13));
#endif
}

EMBER_HD_INLINE float half_bits_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  // A NaN keeps its payload and is quiet, as in the portable code: a select, not a branch.
  const uint32_t nan_bits = (static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13);
  const bool is_nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
  return is_nan ? __uint_as_float(nan_bits) : f;
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u));  // quiet NaN
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
#endif
}

EMBER_HD_INLINE uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet nan
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

EMBER_HD_INLINE float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }
}  // namespace detail

struct alignas(2) Half {
  uint16_t bits = 0;
  Half() = default;
  EMBER_HD Half(float f) : bits(detail::float_to_half_bits(f)) {}
  EMBER_HD operator float() const { return detail::half_bits_to_float(bits); }
  static EMBER_HD Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

struct alignas(2) BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  EMBER_HD BFloat16(float f) : bits(detail::float_to_bf16_bits(f)) {}
  EMBER_HD operator float() const { return detail::bf16_bits_to_float(bits); }
  static EMBER_HD BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

}  // namespace ember
