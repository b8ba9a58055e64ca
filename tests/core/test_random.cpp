// Random numbers: Philox4x32-10 against the Random123 known-answer vectors, rand/randn recomputed element by element
// from Note [Philox stream] (philox.h) with arithmetic written here, generator seeding/offsets, and sample moments.
// The draw tests run on every device (cuda instances skip without a GPU): both must give the same numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "ember/core/core_stubs.h"
#include "ember/core/generator.h"
#include "ember/core/philox.h"
#include "ember/core/tensor.h"
#include "tests/harness/op_harness.h"

using namespace ember;

namespace {

// ---- an independent float64 restatement of Note [Philox stream] ----------------------------------------------
// The 64-bit counter index goes to the first two 32-bit counter words (low, high), the 64-bit seed to the key
// (low, high). Uniform: 24 high bits of the lane, times 2^-24. Normal: Box-Muller on lanes (2k, 2k+1) with
// u1 = (bits24 + 1) * 2^-24 in (0, 1] and u2 = bits24 * 2^-24.
PhiloxOut block(uint64_t seed, uint64_t counter) {
  return philox4x32_10(static_cast<uint32_t>(counter & 0xffffffffu), static_cast<uint32_t>(counter >> 32), 0, 0,
                       static_cast<uint32_t>(seed & 0xffffffffu), static_cast<uint32_t>(seed >> 32));
}

double uniform_ref(uint64_t seed, uint64_t offset, uint64_t i) {
  const uint32_t lane = block(seed, offset + i / 4).v[i % 4];
  return std::ldexp(static_cast<double>(lane >> 8), -24);
}

double normal_ref(uint64_t seed, uint64_t offset, uint64_t i) {
  const PhiloxOut o = block(seed, offset + i / 2);
  const size_t k = (i % 2) * 2;
  const double u1 = std::ldexp(static_cast<double>((o.v[k] >> 8) + 1u), -24);
  const double u2 = std::ldexp(static_cast<double>(o.v[k + 1] >> 8), -24);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// The kernels evaluate Box-Muller in float: the radius is at most sqrt(-2 ln 2^-24) = 5.77 and float log/cos/2pi
// contribute about 1e-6 relative, so 1e-5 absolute covers float evaluation while catching any lane/counter mix-up.
constexpr double kNormalTol = 1e-5;

struct Moments {
  double mean = 0, var = 0, min = INFINITY, max = -INFINITY;
};
Moments moments(const std::vector<double>& v) {
  Moments m;
  for (double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.var += (x - m.mean) * (x - m.mean);
  m.var /= static_cast<double>(v.size() - 1);
  return m;
}

}  // namespace

// ---- Philox known answers (Random123 kat_vectors, philox4x32_10) ---------------------------------------------

TEST(Philox, KnownAnswerZero) {
  const PhiloxOut o = philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(o.v[0], 0x6627e8d5u);
  EXPECT_EQ(o.v[1], 0xe169c58du);
  EXPECT_EQ(o.v[2], 0xbc57ac4cu);
  EXPECT_EQ(o.v[3], 0x9b00dbd8u);
}

TEST(Philox, KnownAnswerOnes) {
  const PhiloxOut o = philox4x32_10(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(o.v[0], 0x408f276du);
  EXPECT_EQ(o.v[1], 0x41c83b0eu);
  EXPECT_EQ(o.v[2], 0xa20bc7c6u);
  EXPECT_EQ(o.v[3], 0x6d5451fdu);
}

TEST(Philox, KnownAnswerPi) {
  const PhiloxOut o = philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(o.v[0], 0xd16cfe09u);
  EXPECT_EQ(o.v[1], 0x94fdccebu);
  EXPECT_EQ(o.v[2], 0x5001e420u);
  EXPECT_EQ(o.v[3], 0x24126ea1u);
}

TEST(Philox, CounterAndKeyWordOrder) {
  // philox_at puts the 64-bit counter in words (c0 = low, c1 = high) and the seed in (k0 = low, k1 = high).
  const PhiloxOut a = philox_at(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull);
  const PhiloxOut b = philox4x32_10(0x243f6a88u, 0x85a308d3u, 0, 0, 0xa4093822u, 0x299f31d0u);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(a.v[k], b.v[k]);
  EXPECT_EQ(philox_uniform_counters(0), 0u);
  EXPECT_EQ(philox_uniform_counters(1), 1u);
  EXPECT_EQ(philox_uniform_counters(4), 1u);
  EXPECT_EQ(philox_uniform_counters(5), 2u);
  EXPECT_EQ(philox_normal_counters(1), 1u);
  EXPECT_EQ(philox_normal_counters(2), 1u);
  EXPECT_EQ(philox_normal_counters(3), 2u);
}

TEST(Philox, ElementHelpersMatchNote) {
  const uint64_t seed = 0x0123456789abcdefull, offset = (uint64_t{1} << 32) - 2;  // crosses into the high word
  for (uint64_t i = 0; i < 64; ++i) {
    EXPECT_EQ(static_cast<double>(philox_uniform_element(seed, offset, i)), uniform_ref(seed, offset, i)) << i;
    const double z = normal_ref(seed, offset, i);
    EXPECT_NEAR(philox_normal_element(seed, offset, i), z, kNormalTol) << i;
  }
}

// ---- rand / randn on each device -------------------------------------------------------------------------------

class RandomTest : public ember::testing::DeviceTest {};

TEST_P(RandomTest, RandFollowsPhiloxStream) {
  EMBER_REQUIRE_KERNEL(random_stub);
  const uint64_t seed = 1234567;
  manual_seed(seed);
  const int64_t n = 10;  // not a multiple of 4: the draw uses 3 counters
  const std::vector<double> a = rand({2, 5}, {DType::f32, device()}).to_vector<double>();
  ASSERT_EQ(a.size(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(a[i], uniform_ref(seed, 0, i)) << i;  // exact: u * 1 + 0
  EXPECT_EQ(default_generator().state().offset, 3u);
  // The next draw starts at counter 3; an f64 draw holds the same 24-bit values exactly.
  const std::vector<double> b = rand({7}, {DType::f64, device()}).to_vector<double>();
  for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(b[i], uniform_ref(seed, 3, i)) << i;
  EXPECT_EQ(default_generator().state().offset, 5u);
  // f16 / bf16 store the float value rounded to nearest even.
  const std::vector<double> h = rand({6}, {DType::f16, device()}).to_vector<double>();
  const std::vector<double> g = rand({6}, {DType::bf16, device()}).to_vector<double>();
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(h[i], static_cast<double>(static_cast<float>(Half(static_cast<float>(uniform_ref(seed, 5, i)))))) << i;
    EXPECT_EQ(g[i], static_cast<double>(static_cast<float>(BFloat16(static_cast<float>(uniform_ref(seed, 7, i))))))
        << i;
  }
  EXPECT_EQ(default_generator().state().offset, 9u);
  // Counters past 2^32 carry into the second counter word.
  const uint64_t high = (uint64_t{1} << 32) - 1;
  default_generator().set_state({seed, high});
  const std::vector<double> c = rand({8}, {DType::f64, device()}).to_vector<double>();
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(c[i], uniform_ref(seed, high, i)) << i;
  EXPECT_EQ(default_generator().state().offset, high + 2);
}

TEST_P(RandomTest, UniformScalesAndShifts) {
  EMBER_REQUIRE_KERNEL(random_stub);
  const uint64_t seed = 99;
  manual_seed(seed);
  const std::vector<double> u = uniform({9}, -2.0, 3.0, {DType::f64, device()}).to_vector<double>();
  for (int64_t i = 0; i < 9; ++i) EXPECT_NEAR(u[i], -2.0 + 5.0 * uniform_ref(seed, 0, i), 1e-12) << i;
  EXPECT_THROW(uniform({2}, 1.0, 0.0, {DType::f32, device()}), ValueError);
  // low == high is a constant.
  EXPECT_EQ(uniform({3}, 4.0, 4.0, {DType::f64, device()}).to_vector<double>(), std::vector<double>(3, 4.0));
}

TEST_P(RandomTest, RandnFollowsPhiloxStream) {
  EMBER_REQUIRE_KERNEL(random_stub);
  const uint64_t seed = 0xfeedbeefcafe;
  manual_seed(seed);
  const int64_t n = 9;  // odd: the draw uses 5 counters
  const std::vector<double> z = randn({3, 3}, {DType::f32, device()}).to_vector<double>();
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(z[i], normal_ref(seed, 0, i), kNormalTol) << i;
  }
  EXPECT_EQ(default_generator().state().offset, 5u);
  const std::vector<double> w = normal({4}, 3.0, 2.0, {DType::f64, device()}).to_vector<double>();
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(w[i], 3.0 + 2.0 * normal_ref(seed, 5, i), 2.0 * kNormalTol) << i;
  }
  EXPECT_EQ(default_generator().state().offset, 7u);
  EXPECT_THROW(normal({2}, 0.0, -1.0, {DType::f32, device()}), ValueError);
  EXPECT_EQ(normal({2}, 1.5, 0.0, {DType::f64, device()}).to_vector<double>(), std::vector<double>(2, 1.5));
}

TEST_P(RandomTest, SeedReproducibilityAndOffsetAdvance) {
  EMBER_REQUIRE_KERNEL(random_stub);
  manual_seed(42);
  const std::vector<double> a1 = rand({100}, {DType::f32, device()}).to_vector<double>();
  const std::vector<double> a2 = rand({100}, {DType::f32, device()}).to_vector<double>();
  const std::vector<double> n1 = randn({100}, {DType::f32, device()}).to_vector<double>();
  EXPECT_NE(a1, a2);  // the offset advanced between the two draws
  manual_seed(42);
  EXPECT_EQ(rand({100}, {DType::f32, device()}).to_vector<double>(), a1);
  EXPECT_EQ(rand({100}, {DType::f32, device()}).to_vector<double>(), a2);
  EXPECT_EQ(randn({100}, {DType::f32, device()}).to_vector<double>(), n1);
  manual_seed(43);
  EXPECT_NE(rand({100}, {DType::f32, device()}).to_vector<double>(), a1);
  // Restoring a saved state replays the draw (what checkpoint recomputation relies on).
  const PhiloxState saved = default_generator().state();
  const std::vector<double> r1 = randn({33}, {DType::f32, device()}).to_vector<double>();
  default_generator().set_state(saved);
  EXPECT_EQ(randn({33}, {DType::f32, device()}).to_vector<double>(), r1);
}

// A generator passed in is drawn from instead of the default one, which stays where it was; the *_like factories
// take the shape, dtype and device of their argument.
TEST_P(RandomTest, AGivenGeneratorAndTheLikeFactories) {
  EMBER_REQUIRE_KERNEL(random_stub);
  manual_seed(5);
  Generator gen(77);
  const std::vector<double> u = rand({6}, gen, {DType::f64, device()}).to_vector<double>();
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(u[i], uniform_ref(77, 0, i)) << i;
  const std::vector<double> z = randn({3}, gen, {DType::f64, device()}).to_vector<double>();
  for (int64_t i = 0; i < 3; ++i) EXPECT_NEAR(z[i], normal_ref(77, 2, i), kNormalTol) << i;
  const std::vector<double> w = uniform({2}, 1.0, 3.0, gen, {DType::f64, device()}).to_vector<double>();
  for (int64_t i = 0; i < 2; ++i) EXPECT_NEAR(w[i], 1.0 + 2.0 * uniform_ref(77, 4, i), 1e-12) << i;
  const std::vector<double> v = normal({2}, -1.0, 0.5, gen, {DType::f64, device()}).to_vector<double>();
  for (int64_t i = 0; i < 2; ++i) EXPECT_NEAR(v[i], -1.0 + 0.5 * normal_ref(77, 5, i), kNormalTol) << i;
  EXPECT_EQ(gen.state().offset, 6u);
  EXPECT_EQ(default_generator().state().offset, 0u) << "the default generator did not move";
  EXPECT_THROW(rand({2}, gen, {DType::i32, device()}), DTypeError);

  const Tensor like = zeros({2, 3}, {DType::f64, device()});
  const std::vector<double> r = rand_like(like).to_vector<double>();
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(r[i], uniform_ref(5, 0, i)) << i;
  EXPECT_EQ(randn_like(like).sizes(), like.sizes());
  const Tensor f = full_like(like, 2.5);
  EXPECT_EQ(f.dtype(), DType::f64);
  EXPECT_EQ(f.device(), device());
  EXPECT_EQ(f.to_vector<double>(), std::vector<double>(6, 2.5));
  EXPECT_THROW(rand_like(zeros({2}, {DType::i64, device()})), DTypeError);
}

TEST_P(RandomTest, UniformBoundsAndMoments) {
  EMBER_REQUIRE_KERNEL(random_stub);
  manual_seed(2024);
  const int64_t n = 100000;
  const Moments u = moments(rand({n}, {DType::f32, device()}).to_vector<double>());
  EXPECT_GE(u.min, 0.0);
  EXPECT_LT(u.max, 1.0);
  // Uniform[0,1): mean 1/2 (sd of the mean sqrt(1/12/n)), variance 1/12 (sd of the sample variance
  // sqrt((1/80 - 1/144)/n) = sqrt(1/180/n)). 5-sigma bounds.
  EXPECT_NEAR(u.mean, 0.5, 5.0 * std::sqrt(1.0 / 12.0 / n));
  EXPECT_NEAR(u.var, 1.0 / 12.0, 5.0 * std::sqrt(1.0 / 180.0 / n));
  const Moments s = moments(uniform({n}, -2.0, 3.0, {DType::f32, device()}).to_vector<double>());
  EXPECT_GE(s.min, -2.0);
  EXPECT_LT(s.max, 3.0);
  EXPECT_NEAR(s.mean, 0.5, 5.0 * 5.0 * std::sqrt(1.0 / 12.0 / n));
  EXPECT_NEAR(s.var, 25.0 / 12.0, 5.0 * 25.0 * std::sqrt(1.0 / 180.0 / n));
}

TEST_P(RandomTest, NormalMoments) {
  EMBER_REQUIRE_KERNEL(random_stub);
  manual_seed(7);
  const int64_t n = 100000;
  // N(0,1): sd of the mean 1/sqrt(n); sd of the sample variance sqrt(2/n).
  const Moments z = moments(randn({n}, {DType::f32, device()}).to_vector<double>());
  EXPECT_NEAR(z.mean, 0.0, 5.0 / std::sqrt(double(n)));
  EXPECT_NEAR(z.var, 1.0, 5.0 * std::sqrt(2.0 / n));
  EXPECT_TRUE(std::isfinite(z.min) && std::isfinite(z.max));
  EXPECT_LT(z.max, 6.0);   // |z| <= sqrt(-2 ln 2^-24) = 5.77 by construction
  EXPECT_GT(z.min, -6.0);
  const Moments w = moments(normal({n}, 3.0, 2.0, {DType::f64, device()}).to_vector<double>());
  EXPECT_NEAR(w.mean, 3.0, 5.0 * 2.0 / std::sqrt(double(n)));
  EXPECT_NEAR(w.var, 4.0, 5.0 * 4.0 * std::sqrt(2.0 / n));
}

TEST_P(RandomTest, IntegerDtypesAreRejected) {
  for (DType d : {DType::i32, DType::i64, DType::u8, DType::b8}) {
    SCOPED_TRACE(dtype_name(d));
    const PhiloxState before = default_generator().state();
    EXPECT_THROW(rand({4}, {d, device()}), DTypeError);
    EXPECT_THROW(randn({4}, {d, device()}), DTypeError);
    EXPECT_THROW(uniform({4}, 0.0, 1.0, {d, device()}), DTypeError);
    // A rejected draw consumes nothing.
    EXPECT_EQ(default_generator().state().offset, before.offset);
  }
}

EMBER_INSTANTIATE_DEVICE_TESTS(RandomTest);

// ---- generator ---------------------------------------------------------------------------------------------------

TEST(Generator, ReserveAdvancesOffset) {
  Generator g(5);
  EXPECT_EQ(g.state().seed, 5u);
  EXPECT_EQ(g.state().offset, 0u);
  const PhiloxState a = g.reserve(3);
  const PhiloxState b = g.reserve(10);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(b.offset, 3u);
  EXPECT_EQ(b.seed, 5u);
  EXPECT_EQ(g.state().offset, 13u);
  g.manual_seed(9);
  EXPECT_EQ(g.state().seed, 9u);
  EXPECT_EQ(g.state().offset, 0u);
  g.set_state({11, 77});
  EXPECT_EQ(g.reserve(1).offset, 77u);
  EXPECT_EQ(g.state().offset, 78u);
}

TEST(Generator, DrawsAdvanceDefaultGeneratorByCounters) {
  manual_seed(1);
  EXPECT_EQ(default_generator().state().seed, 1u);
  EXPECT_EQ(default_generator().state().offset, 0u);
  (void)rand({10});   // ceil(10 / 4) = 3
  EXPECT_EQ(default_generator().state().offset, 3u);
  (void)randn({5});   // ceil(5 / 2) = 3
  EXPECT_EQ(default_generator().state().offset, 6u);
  (void)rand({0});
  EXPECT_EQ(default_generator().state().offset, 6u);
  // A meta tensor draws nothing: a shape-only planning pass must leave the real run's random stream untouched
  // (dropout on meta behaves the same way).
  (void)rand({4, 4}, Device::meta());
  EXPECT_EQ(default_generator().state().offset, 6u);
}
