// Counter-based Philox4x32-10 (Salmon et al., SC'11) and the element -> counter mapping every device uses.
// Note [Philox stream]: a draw at generator state (seed, offset) gives element i of a uniform draw the value of
//   lane i % 4 of philox(counter = offset + i / 4, key = seed),
// and element i of a normal draw the Box-Muller transform of lanes (2k, 2k+1), k = i % 2, of counter offset + i / 2.
// The generator then advances offset by the number of counters used. Because the value depends only on
// (seed, offset, i), a recomputation replays a draw exactly, and CPU and CUDA agree: uniform draws bit for bit
// (integer bits and one exactly-rounded multiply), normal draws to within the few ulps by which the devices'
// logf/cosf differ.
#pragma once

#include <cmath>
#include <cstdint>

#include "ember/base/host_device.h"

namespace ember {

struct PhiloxOut {
  uint32_t v[4];
};

EMBER_HD_INLINE void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Philox4x32 with 10 rounds on counter (c0..c3) and key (k0, k1).
EMBER_HD_INLINE PhiloxOut philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                        uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, c0, hi0, lo0);
    philox_mulhilo(kM1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
  }
  return PhiloxOut{{c0, c1, c2, c3}};
}

// Philox output for a 64-bit counter index under a 64-bit seed.
EMBER_HD_INLINE PhiloxOut philox_at(uint64_t seed, uint64_t counter) {
  return philox4x32_10(static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u,
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// 24 random bits -> float in [0, 1).
EMBER_HD_INLINE float philox_uniform01(uint32_t x) { return static_cast<float>(x >> 8) * 5.9604644775390625e-8f; }

// Element i of a uniform draw in [0, 1) (Note [Philox stream]).
EMBER_HD_INLINE float philox_uniform_element(uint64_t seed, uint64_t offset, uint64_t i) {
  const PhiloxOut o = philox_at(seed, offset + i / 4);
  return philox_uniform01(o.v[i % 4]);
}

// The standard normal of lanes (k, k + 1) of a Philox output, k = 0 or 2 (Box-Muller).
EMBER_HD_INLINE float philox_normal_of(const PhiloxOut& o, int k) {
  const float u1 = static_cast<float>((o.v[k] >> 8) + 1u) * 5.9604644775390625e-8f;  // (0, 1]
  const float u2 = philox_uniform01(o.v[k + 1]);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864769f * u2);
}

// Element i of a standard normal draw (Note [Philox stream]).
EMBER_HD_INLINE float philox_normal_element(uint64_t seed, uint64_t offset, uint64_t i) {
  return philox_normal_of(philox_at(seed, offset + i / 2), static_cast<int>(i % 2) * 2);
}

// Counters consumed by a draw of n elements.
EMBER_HD_INLINE uint64_t philox_uniform_counters(uint64_t n) { return (n + 3) / 4; }
EMBER_HD_INLINE uint64_t philox_normal_counters(uint64_t n) { return (n + 1) / 2; }

}  // namespace ember
