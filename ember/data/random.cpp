// Host-side random draws from a Generator's Philox stream (uniform doubles, unbiased integers, permutations) and the
// per-sample seed mix. Invariant: one draw consumes exactly one Philox counter (four 32-bit lanes).
#include "ember/data/random.h"

#include <utility>

#include "ember/base/error.h"
#include "ember/core/philox.h"

namespace ember::data {

namespace {

uint64_t draw_u64(Generator& gen) {
  const PhiloxState s = gen.reserve(1);
  const PhiloxOut o = philox_at(s.seed, s.offset);
  return (static_cast<uint64_t>(o.v[0]) << 32) | o.v[1];
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

double uniform(Generator& gen) { return static_cast<double>(draw_u64(gen) >> 11) * 0x1.0p-53; }

double uniform(Generator& gen, double low, double high) { return low + (high - low) * uniform(gen); }

int64_t randint(Generator& gen, int64_t n) {
  EMBER_CHECK(n > 0, ValueError, "randint: the range size must be positive, got ", n);
  const uint64_t un = static_cast<uint64_t>(n);
  const uint64_t limit = UINT64_MAX - UINT64_MAX % un;  // draws at or above this would bias the modulus
  for (;;) {
    const uint64_t x = draw_u64(gen);
    if (x < limit) return static_cast<int64_t>(x % un);
  }
}

std::vector<int64_t> permutation(int64_t n, Generator& gen) {
  EMBER_CHECK(n >= 0, ValueError, "permutation: negative size ", n);
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(randint(gen, i + 1))]);
  return p;
}

uint64_t sample_seed(uint64_t seed, int64_t epoch, int64_t index) {
  return splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(index));
}

}  // namespace ember::data
