// Tests of ember's one cast (Note [Casts] in kernels/convert.h) against hand-computed values: float -> integer
// (NaN, +-inf, out of range, truncation), integer wrapping, bool, double rounding through f32 for f16, fill values,
// and the rule that uniform draws never reach `high` (Note [Uniform upper bound]); on the cpu and cuda instances.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ember/kernels/convert.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();
constexpr float kInff = std::numeric_limits<float>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

// ---- the conversion function itself (host) ------------------------------------------------------------------------

TEST(CastRules, FloatingToIntegerIsTruncatedSaturatedAndNaNIsZero) {
  using kernels::convert;
  EXPECT_EQ(convert<int32_t>(3e9f), kI32Max);
  EXPECT_EQ(convert<int32_t>(-3e9f), kI32Min);
  EXPECT_EQ(convert<int32_t>(kNaNf), 0);
  EXPECT_EQ(convert<int32_t>(kInff), kI32Max);
  EXPECT_EQ(convert<int32_t>(-kInff), kI32Min);
  EXPECT_EQ(convert<int32_t>(-1.5f), -1);
  EXPECT_EQ(convert<int32_t>(2.9), 2);
  EXPECT_EQ(convert<int32_t>(2147483647.0), kI32Max);
  EXPECT_EQ(convert<int32_t>(2147483647.9), kI32Max);
  EXPECT_EQ(convert<int32_t>(2147483648.0), kI32Max);
  EXPECT_EQ(convert<int32_t>(-2147483648.9), kI32Min);
  EXPECT_EQ(convert<int64_t>(9.3e18), kI64Max);
  EXPECT_EQ(convert<int64_t>(-9.3e18f), kI64Min);
  EXPECT_EQ(convert<int64_t>(9223372036854774784.0), int64_t{9223372036854774784});  // largest double below 2^63
  EXPECT_EQ(convert<int64_t>(kNaN), 0);
  EXPECT_EQ(convert<int64_t>(3e9f), int64_t{3000000000});
  EXPECT_EQ(convert<uint8_t>(255.9f), 255);
  EXPECT_EQ(convert<uint8_t>(256.0), 255);
  EXPECT_EQ(convert<uint8_t>(-1.5), 0);
  EXPECT_EQ(convert<uint8_t>(-0.9f), 0);
  EXPECT_EQ(convert<uint8_t>(kNaN), 0);
  EXPECT_EQ(convert<uint8_t>(-kInf), 0);
  EXPECT_EQ(convert<int32_t>(Half(-65504.0f)), -65504);
  EXPECT_EQ(convert<uint8_t>(BFloat16(kInff)), 255);
  EXPECT_EQ(convert<int32_t>(BFloat16(kNaNf)), 0);
}

TEST(CastRules, IntegerToIntegerWrapsAndBoolIsNonZero) {
  using kernels::convert;
  EXPECT_EQ(convert<uint8_t>(int32_t{-1}), 255);
  EXPECT_EQ(convert<uint8_t>(int32_t{300}), 44);
  EXPECT_EQ(convert<uint8_t>(int64_t{-256}), 0);
  EXPECT_EQ(convert<int32_t>(int64_t{1} << 32 | 5), 5);
  EXPECT_EQ(convert<int32_t>(int64_t{1} << 31), kI32Min);
  EXPECT_EQ(convert<int32_t>(uint8_t{200}), 200);
  EXPECT_EQ(convert<int64_t>(int32_t{-7}), -7);
  EXPECT_EQ(convert<int32_t>(true), 1);
  EXPECT_TRUE(convert<bool>(kNaN));
  EXPECT_TRUE(convert<bool>(-0.5f));
  EXPECT_FALSE(convert<bool>(-0.0));
  EXPECT_TRUE(convert<bool>(int64_t{1} << 40));
  EXPECT_FALSE(convert<bool>(Half(0.0f)));
  EXPECT_TRUE(convert<bool>(BFloat16(1e-30f)));
  EXPECT_EQ(convert<double>(true), 1.0);
}

TEST(CastRules, HalfTypesRoundFromFloatAndF64GoesThroughF32) {
  using kernels::convert;
  // 1 + 2^-11 + 2^-40: rounded directly to f16 it is above the midpoint of 1 and 1 + 2^-10 (rounds up); through f32
  // the 2^-40 is lost, the midpoint ties to even and gives 1.
  const double d = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(static_cast<float>(convert<Half>(d)), 1.0f);
  EXPECT_EQ(static_cast<float>(convert<Half>(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -20))), 1.0f + 0x1p-10f);
  EXPECT_EQ(convert<Half>(65520.0).bits, 0x7c00);  // rounds to +inf
  EXPECT_EQ(convert<BFloat16>(int64_t{257}).bits, BFloat16(256.0f).bits);  // ties to even
  EXPECT_EQ(static_cast<float>(convert<Half>(int32_t{-2049})), -2048.0f);
  EXPECT_EQ(convert<float>(1e300), kInff);
  EXPECT_EQ(convert<double>(Half(0.5f)), 0.5);
}

TEST(CastRules, ScalarValuesConvertByTheirKind) {
  using kernels::convert_scalar;
  EXPECT_EQ(convert_scalar<uint8_t>(Scalar(-1)), 255);    // integer: wraps
  EXPECT_EQ(convert_scalar<uint8_t>(Scalar(-1.0)), 0);    // floating: saturates
  EXPECT_EQ(convert_scalar<int32_t>(Scalar(3e9)), kI32Max);
  EXPECT_EQ(convert_scalar<int64_t>(Scalar((int64_t{1} << 53) + 1)), (int64_t{1} << 53) + 1);
  EXPECT_EQ(convert_scalar<float>(Scalar((int64_t{1} << 24) + 1)), 16777216.0f);
  EXPECT_TRUE(convert_scalar<bool>(Scalar(0.25)));
}

TEST(CastRules, UniformStoreNeverGivesHigh) {
  using kernels::uniform_store;
  EXPECT_EQ(static_cast<float>(uniform_store<BFloat16>(0.999f, 0.0f, 1.0f)), 0.0f);  // rounds to 1 -> low
  EXPECT_EQ(static_cast<float>(uniform_store<BFloat16>(0.99f, 0.0f, 1.0f)), static_cast<float>(BFloat16(0.99f)));
  EXPECT_EQ(static_cast<float>(uniform_store<Half>(2.2499f, -1.5f, 2.25f)), -1.5f);
  EXPECT_EQ(uniform_store<float>(2.25f, -1.5f, 2.25f), -1.5f);
  EXPECT_EQ(uniform_store<double>(0.5, 0.0, 1.0), 0.5);
  EXPECT_EQ(uniform_store<float>(3.0f, 3.0f, 3.0f), 3.0f);  // empty range: the value itself
}

// ---- the cast kernels of each device ------------------------------------------------------------------------------

class CastKernelTest : public DeviceTest {};

TEST_P(CastKernelTest, FloatToIntegerCastIsDefinedOnEveryDevice) {
  const std::vector<float> v = {3e9f, kNaNf, kInff, -kInff, -1.5f, 2.75f, -3e9f, 255.9f, -0.5f};
  for (DType from : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(from));
    const Tensor x = from_vector(v, {9}).to(from).to(device());
    EXPECT_EQ(x.to(DType::i32).to_vector<int32_t>(),
              (std::vector<int32_t>{kI32Max, 0, kI32Max, kI32Min, -1, 2, kI32Min, 255, 0}));
    EXPECT_EQ(x.to(DType::i64).to_vector<int64_t>(),
              (std::vector<int64_t>{3000000000, 0, kI64Max, kI64Min, -1, 2, -3000000000, 255, 0}));
    EXPECT_EQ(x.to(DType::u8).to_vector<int32_t>(), (std::vector<int32_t>{255, 0, 255, 0, 0, 2, 0, 255, 0}));
    EXPECT_EQ(x.to(DType::b8).to_vector<int32_t>(), (std::vector<int32_t>{1, 1, 1, 1, 1, 1, 1, 1, 1}));
  }
  // f16/bf16 sources convert through float: f16 cannot hold 3e9 (inf), bf16 rounds it to 3003121664.
  const Tensor h = from_vector<float>({3e9f, kNaNf, -65504.0f, -1.5f}, {4}).to(DType::f16).to(device());
  EXPECT_EQ(h.to(DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{kI32Max, 0, -65504, -1}));
  const Tensor b = from_vector<float>({3e9f, kNaNf, -3e9f, 255.9f}, {4}).to(DType::bf16).to(device());
  EXPECT_EQ(b.to(DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{kI32Max, 0, kI32Min, 256}));
  EXPECT_EQ(b.to(DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{3003121664, 0, -3003121664, 256}));
  EXPECT_EQ(b.to(DType::u8).to_vector<int32_t>(), (std::vector<int32_t>{255, 0, 0, 255}));
  // A non-contiguous source goes through the same cast.
  const Tensor t = from_vector<double>({kNaN, 1e10, -1e10, 7.9}, {2, 2}).to(device()).t();
  EXPECT_EQ(t.to(DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{0, kI32Min, kI32Max, 7}));
}

TEST_P(CastKernelTest, IntegerCastsWrapAndBoolCastsTestNonZero) {
  const Tensor i = from_vector<int32_t>({-1, 300, 256, 255, -129}, {5}).to(device());
  EXPECT_EQ(i.to(DType::u8).to_vector<int32_t>(), (std::vector<int32_t>{255, 44, 0, 255, 127}));
  EXPECT_EQ(i.to(DType::b8).to_vector<int32_t>(), (std::vector<int32_t>{1, 1, 1, 1, 1}));
  const Tensor l = from_vector<int64_t>({(int64_t{1} << 32) + 5, int64_t{1} << 31, -1, 0}, {4}).to(device());
  EXPECT_EQ(l.to(DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{5, kI32Min, -1, 0}));
  EXPECT_EQ(l.to(DType::u8).to_vector<int32_t>(), (std::vector<int32_t>{5, 0, 255, 0}));
  EXPECT_EQ(l.to(DType::b8).to_vector<int32_t>(), (std::vector<int32_t>{1, 1, 1, 0}));
  const Tensor u = from_vector<uint8_t>({200, 0}, {2}).to(device());
  EXPECT_EQ(u.to(DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{200, 0}));
  const Tensor p = from_vector<bool>({true, false}, {2}).to(device());
  EXPECT_EQ(p.to(DType::f16).to_vector<double>(), (std::vector<double>{1.0, 0.0}));
  EXPECT_EQ(p.to(DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  const Tensor f = from_vector<double>({0.0, -0.0, 0.5, kNaN, -kInf, 1e-300}, {6}).to(device());
  EXPECT_EQ(f.to(DType::b8).to_vector<int32_t>(), (std::vector<int32_t>{0, 0, 1, 1, 1, 1}));
  // f64 -> f16 rounds through f32 (see HalfTypesRoundFromFloatAndF64GoesThroughF32).
  const double d = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(from_vector<double>({d}, {1}).to(device()).to(DType::f16).to_vector<double>(),
            (std::vector<double>{1.0}));
}

TEST_P(CastKernelTest, FillValuesFollowTheCastRules) {
  EXPECT_EQ(full({2}, 3e9, {DType::i32, device()}).to_vector<int32_t>(), (std::vector<int32_t>{kI32Max, kI32Max}));
  EXPECT_EQ(full({1}, kNaN, {DType::i64, device()}).to_vector<int64_t>(), (std::vector<int64_t>{0}));
  EXPECT_EQ(full({1}, -kInf, {DType::i64, device()}).to_vector<int64_t>(), (std::vector<int64_t>{kI64Min}));
  EXPECT_EQ(full({1}, -1, {DType::u8, device()}).to_vector<int32_t>(), (std::vector<int32_t>{255}));
  EXPECT_EQ(full({1}, -1.0, {DType::u8, device()}).to_vector<int32_t>(), (std::vector<int32_t>{0}));
  EXPECT_EQ(full({1}, 255.9, {DType::u8, device()}).to_vector<int32_t>(), (std::vector<int32_t>{255}));
  EXPECT_EQ(full({1}, kNaN, {DType::b8, device()}).to_vector<int32_t>(), (std::vector<int32_t>{1}));
  EXPECT_EQ(full({1}, (int64_t{1} << 24) + 1, {DType::f32, device()}).to_vector<double>(),
            (std::vector<double>{16777216.0}));
}

TEST_P(CastKernelTest, UniformDrawsInHalfTypesStayBelowHigh) {
  Generator& g = default_generator();
  const PhiloxState saved = g.state();
  g.set_state({0x5eedull, 0});
  // In bf16 about 2^-9 of the draws of [0, 1) would round to 1 (about 2000 of 1e6), in f16 about 2^-12.
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    const std::vector<float> r = rand({1000000}, {dt, device()}).to_vector<float>();
    EXPECT_LT(*std::max_element(r.begin(), r.end()), 1.0f);
    EXPECT_GE(*std::min_element(r.begin(), r.end()), 0.0f);
    const std::vector<float> w = uniform({200000}, -1.5, 2.25, {dt, device()}).to_vector<float>();
    EXPECT_LT(*std::max_element(w.begin(), w.end()), 2.25f);
    EXPECT_GE(*std::min_element(w.begin(), w.end()), -1.5f);
  }
  g.set_state(saved);
}

// Note [Half conversions on the device] (ember/core/half.h): the GPU converts by instruction and the CPU by integer
// code; both give the same bits for every f16 pattern read and every float written, NaN payloads included. Each
// direction through the dense kernel (contiguous, aligned) and the generic one (a view one element in).
TEST_P(CastKernelTest, HalfConversionsGiveTheSameBitsOnEveryDevice) {
  auto float_bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  auto bits_float = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  // f16 -> f32: every pattern, after one pad element.
  std::vector<Half> halves(65537);
  for (uint32_t b = 0; b < 65536; ++b) halves[b + 1] = Half::from_bits(static_cast<uint16_t>(b));
  const Tensor h = from_vector(halves, {65537}).to(device());
  for (const Tensor& src : {h.narrow(0, 1, 65536).contiguous(), h.narrow(0, 1, 65536)}) {
    const std::vector<float> got = src.to(DType::f32).to_vector<float>();
    int mismatches = 0;
    for (uint32_t b = 0; b < 65536; ++b) {
      const uint32_t want = float_bits(static_cast<float>(Half::from_bits(static_cast<uint16_t>(b))));
      if (float_bits(got[b]) != want && ++mismatches <= 5) ADD_FAILURE() << "f16 bits 0x" << std::hex << b;
    }
    EXPECT_EQ(mismatches, 0);
  }
  // f32 -> f16: every f16 value, the midpoints between neighbours (ties to even) and a quarter ULP either side of
  // them, NaNs with payloads and signs, and random bit patterns.
  std::vector<float> floats = {0.0f};  // pad
  for (uint32_t b = 0; b < 65536; b += 1) {
    const float v = static_cast<float>(Half::from_bits(static_cast<uint16_t>(b)));
    const float next = static_cast<float>(Half::from_bits(static_cast<uint16_t>(b + 1)));
    floats.push_back(v);
    if (std::isfinite(v) && std::isfinite(next) && (b & 0x7fffu) != 0x7fffu) {
      const double mid = (static_cast<double>(v) + next) / 2, quarter = (static_cast<double>(next) - v) / 4;
      floats.push_back(static_cast<float>(mid));
      floats.push_back(static_cast<float>(mid - quarter));
      floats.push_back(static_cast<float>(mid + quarter));
    }
  }
  for (uint32_t payload : {0x400000u, 0x000001u, 0x7fffffu, 0x2aaaaau})
    for (uint32_t sign : {0u, 0x80000000u}) floats.push_back(bits_float(sign | 0x7f800000u | payload));
  for (float f : {65504.0f, 65519.99f, 65520.0f, 1e30f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 1e-45f})
    for (float s : {1.0f, -1.0f}) floats.push_back(s * f);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 65536; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    floats.push_back(bits_float(static_cast<uint32_t>(state >> 32)));
  }
  const int64_t n = static_cast<int64_t>(floats.size()) - 1;
  const Tensor f = from_vector(floats, {n + 1}).to(device());
  for (const Tensor& src : {f.narrow(0, 1, n).contiguous(), f.narrow(0, 1, n)}) {
    const std::vector<Half> got = src.to(DType::f16).to_vector<Half>();
    int mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = Half(floats[i + 1]).bits;
      if (got[i].bits != want && ++mismatches <= 5)
        ADD_FAILURE() << "float bits 0x" << std::hex << float_bits(floats[i + 1]) << ": 0x" << got[i].bits
                      << " against 0x" << want;
    }
    EXPECT_EQ(mismatches, 0);
  }
}

EMBER_INSTANTIATE_DEVICE_TESTS(CastKernelTest);

}  // namespace
}  // namespace ember::testing
