// Host operands and the error measure the emulated kernel tests share (tests/kernels/test_*_emulated.cpp):
// 16-byte aligned storage (the packed kernels' condition) filled from a seeded generator, and the normalised error
// max |got - want| / max |want|. Invariant: header-only, no libember symbols, so an emulated test can be built alone.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace ember::testing {

// n elements of T at a 16-byte aligned address, every element `fill` at first.
template <class T>
struct AlignedBuffer {
  struct alignas(16) Chunk {
    unsigned char b[16];
  };
  std::vector<Chunk> chunks;
  T* data;
  explicit AlignedBuffer(int64_t n, T fill = T(0)) : chunks(static_cast<size_t>((n * sizeof(T) + 15) / 16 + 1)) {
    data = reinterpret_cast<T*>(chunks.data());
    for (int64_t i = 0; i < n; ++i) data[i] = fill;
  }
  // Element i as a double (through float for f16/bf16).
  double at(int64_t i) const { return static_cast<double>(static_cast<float>(data[i])); }
};

// The first n elements of b drawn uniformly from [lo, hi) by a linear congruential generator seeded with `seed`, each
// rounded to T.
template <class T>
void fill_uniform(AlignedBuffer<T>& b, int64_t n, uint32_t seed, double lo, double hi) {
  uint32_t state = seed;
  for (int64_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    b.data[i] = T(static_cast<float>(lo + (hi - lo) * static_cast<double>(state >> 8) / static_cast<double>(1u << 24)));
  }
}

// max |got - want| / max |want| over two equal-length vectors; a non-finite value in got (a NaN poison left
// unwritten) makes it infinite.
inline double normalised_error(const std::vector<double>& got, const std::vector<double>& want) {
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::isfinite(got[i]) ? std::max(err, std::abs(got[i] - want[i])) : INFINITY;
    scale = std::max(scale, std::abs(want[i]));
  }
  return scale > 0 ? err / scale : err;
}

}  // namespace ember::testing
