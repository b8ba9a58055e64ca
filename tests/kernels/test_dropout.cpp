// Tests of dropout: the mask is recomputed here from Note [Philox stream] (philox_uniform_element), its keep fraction
// is checked against a binomial bound, kept values against x / (1 - p), replay from a fixed generator state, the
// generator's offset advance, eval/p=0/p=1 behaviour, errors, and Random123's Philox4x32-10 known-answer vectors.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ember/core/philox.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

// Element i is kept iff u_i < 1 - p, u_i being element i of a uniform draw at (seed, offset).
std::vector<bool> mask_ref(uint64_t seed, uint64_t offset, int64_t n, double p) {
  std::vector<bool> m(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    m[static_cast<size_t>(i)] =
        static_cast<double>(philox_uniform_element(seed, offset, static_cast<uint64_t>(i))) < 1.0 - p;
  return m;
}

Tensor dropout_ref(const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  const std::vector<double> xv = x.to_vector<double>();
  const std::vector<bool> m = mask_ref(seed, offset, x.numel(), p);
  std::vector<double> out(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) out[i] = m[i] ? xv[i] / (1.0 - p) : 0.0;
  return from_vector(out, x.sizes());
}

class DropoutTest : public DeviceTest {};

TEST_P(DropoutTest, MaskFractionWithinBinomialBound) {
  EMBER_REQUIRE_KERNEL(dropout_stub);
  const int64_t n = 100000;
  default_generator().set_state({next_seed(), 0});
  for (double p : {0.1, 0.5, 0.8}) {
    const Tensor x = ones({n}, {DType::f32, device()});
    const PhiloxState st = default_generator().state();
    const DropoutResult r = dropout_with_mask(x, p, true);
    ASSERT_EQ(r.mask.dtype(), DType::b8);
    ASSERT_EQ(r.mask.sizes(), x.sizes());
    const std::vector<bool> m = r.mask.to_vector<bool>();
    EXPECT_EQ(m, mask_ref(st.seed, st.offset, n, p));  // the whole stream, far past the first counters
    int64_t kept = 0;
    for (bool b : m) kept += b ? 1 : 0;
    const double expected = static_cast<double>(n) * (1.0 - p);
    const double sigma = std::sqrt(static_cast<double>(n) * p * (1.0 - p));
    EXPECT_LE(std::fabs(static_cast<double>(kept) - expected), 5.0 * sigma) << "p " << p << ", kept " << kept;
    // Kept values are exactly 1 / (1 - p) (rounded once to f32); dropped ones exactly 0.
    const std::vector<float> out = r.out.to_vector<float>();
    const float scaled = static_cast<float>(1.0 / (1.0 - p));
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i], m[i] ? scaled : 0.0f) << "element " << i;
    }
  }
}

TEST_P(DropoutTest, KeptValuesAreExactlyScaled) {
  EMBER_REQUIRE_KERNEL(dropout_stub);
  // p = 0.5 and 0.75 scale by powers of two: every dtype must give x / (1 - p) bit for bit.
  for (double p : {0.5, 0.75}) {
    for (DType dt : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
      const Tensor x = rand_input({37, 11}).to(dt);
      default_generator().set_state({1234, 5});
      const DropoutResult r = dropout_with_mask(x.to(device()), p, true);
      const std::vector<bool> m = mask_ref(1234, 5, x.numel(), p);
      EXPECT_EQ(r.mask.to_vector<bool>(), m);
      const std::vector<double> xv = x.to_vector<double>(), ov = r.out.to_vector<double>();
      for (size_t i = 0; i < xv.size(); ++i) ASSERT_EQ(ov[i], m[i] ? xv[i] / (1.0 - p) : 0.0) << dt << " " << i;
    }
  }
}

TEST_P(DropoutTest, MatchesPhiloxRecomputation) {
  EMBER_REQUIRE_KERNEL(dropout_stub);
  const uint64_t seed = 0x9E3779B97F4A7C15ull, offset = 77;
  for (double p : {0.3, 0.1}) {
    // Contiguous input, and a transposed one: element i is the row-major position of the logical tensor.
    OpCase c{"dropout", {rand_input({13, 9})}, [=](const Inputs& in) {
               default_generator().set_state({seed, offset});
               return dropout(in[0], p, true);
             }};
    c.reference = [=](const Inputs& in) { return dropout_ref(in[0], p, seed, offset); };
    check_op(c, device());
    OpCase t{"dropout", {rand_input({6, 5, 7})}, [=](const Inputs& in) {
               default_generator().set_state({seed, offset});
               return dropout(in[0].transpose(0, 2), p, true);
             }};
    t.reference = [=](const Inputs& in) { return dropout_ref(in[0].transpose(0, 2), p, seed, offset); };
    check_op(t, device());
    default_generator().set_state({seed, offset});
    const Tensor nc = noncontiguous_input({5, 8}).to(device());
    const DropoutResult r = dropout_with_mask(nc, p, true);
    EXPECT_EQ(r.mask.to_vector<bool>(), mask_ref(seed, offset, 40, p));
    EXPECT_TRUE(allclose(r.out, dropout_ref(nc.cpu(), p, seed, offset), default_tolerance(DType::f64)));
  }
}

TEST_P(DropoutTest, SameStateReplaysAndOffsetAdvances) {
  EMBER_REQUIRE_KERNEL(dropout_stub);
  const Tensor x = ones({1001}, {DType::f32, device()});
  default_generator().set_state({42, 1000});
  const DropoutResult a = dropout_with_mask(x, 0.4, true);
  const PhiloxState after = default_generator().state();
  EXPECT_EQ(after.seed, 42u);
  EXPECT_EQ(after.offset, 1000u + philox_uniform_counters(1001));  // 251 counters
  EXPECT_EQ(after.offset, 1251u);
  const DropoutResult b = dropout_with_mask(x, 0.4, true);  // a fresh draw differs
  EXPECT_NE(a.mask.to_vector<bool>(), b.mask.to_vector<bool>());
  default_generator().set_state({42, 1000});
  const DropoutResult c = dropout_with_mask(x, 0.4, true);  // the same state replays exactly
  EXPECT_EQ(a.mask.to_vector<bool>(), c.mask.to_vector<bool>());
  EXPECT_EQ(a.out.to_vector<float>(), c.out.to_vector<float>());
  default_generator().set_state({43, 1000});  // another seed, another mask
  EXPECT_NE(a.mask.to_vector<bool>(), dropout_with_mask(x, 0.4, true).mask.to_vector<bool>());
}

TEST_P(DropoutTest, EvalAndZeroProbabilityReturnInput) {
  EMBER_REQUIRE_KERNEL(dropout_stub);
  const Tensor x = rand_input({4, 6}).to(DType::f32).to(device());
  default_generator().set_state({7, 3});
  for (const auto& [p, train] : std::vector<std::pair<double, bool>>{{0.5, false}, {0.0, true}, {1.0, false}}) {
    const DropoutResult r = dropout_with_mask(x, p, train);
    EXPECT_TRUE(r.out.is_same(x));
    EXPECT_EQ(r.mask.dtype(), DType::b8);
    EXPECT_EQ(r.mask.to_vector<bool>(), std::vector<bool>(24, true));
    EXPECT_TRUE(dropout(x, p, train).is_same(x));
  }
  EXPECT_EQ(default_generator().state().offset, 3u);  // nothing drawn
}

TEST_P(DropoutTest, ProbabilityOneDropsEverything) {
  EMBER_REQUIRE_KERNEL(dropout_stub);
  const Tensor x = rand_input({3, 50}).to(device());
  const DropoutResult r = dropout_with_mask(x, 1.0, true);
  EXPECT_EQ(r.out.to_vector<double>(), std::vector<double>(150, 0.0));
  EXPECT_EQ(r.mask.to_vector<bool>(), std::vector<bool>(150, false));
}

TEST_P(DropoutTest, EmptyAndZeroDim) {
  EMBER_REQUIRE_KERNEL(dropout_stub);
  const Tensor e = empty({3, 0}, {DType::f32, device()});
  const DropoutResult r = dropout_with_mask(e, 0.5, true);
  EXPECT_EQ(r.out.sizes(), (Shape{3, 0}));
  EXPECT_EQ(r.mask.sizes(), (Shape{3, 0}));
  default_generator().set_state({99, 0});
  const Tensor s = full({}, 3.0, {DType::f64, device()});
  const DropoutResult d = dropout_with_mask(s, 0.5, true);
  EXPECT_EQ(d.out.dim(), 0);
  const bool keep = mask_ref(99, 0, 1, 0.5)[0];
  EXPECT_EQ(d.mask.item<bool>(), keep);
  EXPECT_EQ(d.out.item<double>(), keep ? 6.0 : 0.0);
}

// Note [Philox stream]: a device's mask and output equal the CPU kernel's bit for bit for the same generator state:
// a size that is not a multiple of 4 (the last Philox call partly used), a strided input, p = 0.3 (where a float
// comparison would give another mask), every dtype, and an offset whose counters cross 2^32 (the high counter word).
TEST_P(DropoutTest, MaskAndOutputEqualTheCpuKernel) {
  EMBER_REQUIRE_KERNEL(dropout_stub);
  if (device().is_cpu()) GTEST_SKIP() << "compares another device's kernel with the CPU kernel";
  const uint64_t seed = 0x243F6A8885A308D3ull;
  const Tensor x = rand_input({7, 13, 3});  // 273 elements
  for (uint64_t offset : {uint64_t{0}, uint64_t{12345}, (uint64_t{1} << 32) - 30}) {
    for (double p : {0.3, 0.5, 0.9}) {
      for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
        for (bool strided : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + " p " + std::to_string(p) + " offset " + std::to_string(offset) +
                       (strided ? " strided" : ""));
          const Tensor xs = strided ? x.transpose(0, 2) : x;
          default_generator().set_state({seed, offset});
          const DropoutResult want = dropout_with_mask(convert_keep_strides(xs, dt, Device::cpu()), p, true);
          default_generator().set_state({seed, offset});
          const DropoutResult got = dropout_with_mask(convert_keep_strides(xs, dt, device()), p, true);
          EXPECT_EQ(got.mask.to_vector<bool>(), want.mask.to_vector<bool>());
          EXPECT_EQ(got.mask.to_vector<bool>(), mask_ref(seed, offset, xs.numel(), p));
          EXPECT_EQ(got.out.to_vector<double>(), want.out.to_vector<double>());
          default_generator().set_state({seed, offset});  // the same draw without a mask
          EXPECT_EQ(dropout(convert_keep_strides(xs, dt, device()), p, true).to_vector<double>(),
                    want.out.to_vector<double>());
        }
      }
    }
  }
}

EMBER_INSTANTIATE_DEVICE_TESTS(DropoutTest);

TEST(DropoutErrors, ProbabilityAndDType) {
  const Tensor x = ones({4});
  EXPECT_THROW(dropout(x, -0.1), ValueError);
  EXPECT_THROW(dropout(x, 1.5), ValueError);
  EXPECT_THROW(dropout(x, std::numeric_limits<double>::quiet_NaN()), ValueError);
  EXPECT_THROW(dropout_with_mask(x, 2.0, false), ValueError);  // checked even in eval mode
  EXPECT_THROW(dropout(ones({4}, {DType::i64}), 0.5), DTypeError);
  EXPECT_THROW(dropout_with_mask(ones({4}, {DType::b8}), 0.5), DTypeError);
  const Tensor meta = empty({4, 4}, {DType::f16, Device::meta()});
  const PhiloxState before = default_generator().state();
  const DropoutResult r = dropout_with_mask(meta, 0.5);
  EXPECT_EQ(default_generator().state().offset, before.offset);  // a shape-only pass draws nothing
  EXPECT_EQ(r.out.sizes(), (Shape{4, 4}));
  EXPECT_TRUE(r.mask.device().is_meta());
}

// Known-answer vectors from Random123 (kat_vectors, philox4x32_10).
TEST(Philox, Random123KnownAnswers) {
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    const PhiloxOut o = philox4x32_10(k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3], k.key[0], k.key[1]);
    for (int lane = 0; lane < 4; ++lane) EXPECT_EQ(o.v[lane], k.out[lane]) << "lane " << lane;
  }
}

}  // namespace
}  // namespace ember::testing
