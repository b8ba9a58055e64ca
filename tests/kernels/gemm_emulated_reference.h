// Operands and float64 references for the emulated tensor-core GEMM tests (test_tc_gemm_emulated.cpp,
// test_tc_gemm_sm90_emulated.cpp): random 16-bit operands in [-1, 1), their exact float64 product, and the
// normalised error of a 16-bit result against it.
// Invariant: the reference multiplies the operands as rounded to T, so the only error measured is the kernel's (f32
// accumulation and one rounding per output).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace ember::testing {

struct GemmShape {
  int64_t batch, M, N, K;
};

// Bits of n random T values in [-1, 1) from an LCG seeded with seed (advanced), and the values as doubles.
template <class T>
std::pair<std::vector<uint16_t>, std::vector<double>> random_16bit(size_t n, uint32_t& seed) {
  std::vector<uint16_t> bits(n);
  std::vector<double> values(n);
  uint32_t state = seed;
  for (size_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    const float u = static_cast<float>(state >> 8) / static_cast<float>(1u << 24);
    bits[i] = T(2.0f * u - 1.0f).bits;
    values[i] = static_cast<float>(T::from_bits(bits[i]));
  }
  seed += 7919u;
  return {bits, values};
}

// out[b] = a[b] @ bm[b] in float64 for row-major a [batch, M, K] and b [batch, K, N].
inline std::vector<double> gemm_reference(const GemmShape& s, const std::vector<double>& a,
                                          const std::vector<double>& b) {
  std::vector<double> out(static_cast<size_t>(s.batch * s.M * s.N), 0.0);
  for (int64_t z = 0; z < s.batch; ++z)
    for (int64_t i = 0; i < s.M; ++i)
      for (int64_t k = 0; k < s.K; ++k) {
        const double x = a[static_cast<size_t>((z * s.M + i) * s.K + k)];
        for (int64_t j = 0; j < s.N; ++j)
          out[static_cast<size_t>((z * s.M + i) * s.N + j)] += x * b[static_cast<size_t>((z * s.K + k) * s.N + j)];
      }
  return out;
}

// max |out - expected| / max |expected| over 16-bit T results; infinity when any result is not finite.
template <class T>
double normalised_error(const std::vector<uint16_t>& out, const std::vector<double>& expected) {
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double v = static_cast<float>(T::from_bits(out[i]));
    diff = std::isfinite(v) ? std::max(diff, std::abs(v - expected[i])) : std::numeric_limits<double>::infinity();
    ref = std::max(ref, std::abs(expected[i]));
  }
  return diff / ref;
}

}  // namespace ember::testing
