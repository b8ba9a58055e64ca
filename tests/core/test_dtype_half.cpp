// DType metadata and promotion, and Half/BFloat16 rounding against hand-computed bit patterns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ember/core/dtype.h"

using namespace ember;

TEST(DType, SizesAndNames) {
  EXPECT_EQ(itemsize(DType::f32), 4);
  EXPECT_EQ(itemsize(DType::f16), 2);
  EXPECT_EQ(itemsize(DType::bf16), 2);
  EXPECT_EQ(itemsize(DType::f64), 8);
  EXPECT_EQ(itemsize(DType::i64), 8);
  EXPECT_EQ(itemsize(DType::b8), 1);
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_EQ(parse_dtype("float16"), DType::f16);
  EXPECT_EQ(parse_dtype("bool"), DType::b8);
  EXPECT_THROW(parse_dtype("f8"), ConfigError);
  EXPECT_EQ(itemsize(DType::i8), 1);
  EXPECT_EQ(itemsize(DType::i16), 2);
  EXPECT_STREQ(dtype_name(DType::i8), "i8");
  EXPECT_STREQ(dtype_name(DType::i16), "i16");
  EXPECT_EQ(parse_dtype("int8"), DType::i8);
  EXPECT_EQ(parse_dtype("i16"), DType::i16);
  EXPECT_TRUE(is_integral(DType::i8));
  EXPECT_EQ(dtype_of_v<int8_t>, DType::i8);
  EXPECT_EQ(dtype_of_v<int16_t>, DType::i16);
}

TEST(DType, Promotion) {
  EXPECT_EQ(promote_types(DType::f16, DType::f32), DType::f32);
  EXPECT_EQ(promote_types(DType::f16, DType::bf16), DType::f32);
  EXPECT_EQ(promote_types(DType::i64, DType::f16), DType::f16);
  EXPECT_EQ(promote_types(DType::b8, DType::i32), DType::i32);
  EXPECT_EQ(promote_types(DType::u8, DType::i32), DType::i32);
  EXPECT_EQ(promote_types(DType::f64, DType::f32), DType::f64);
  // PyTorch: uint8 with int8 gives int16; int8 < int16 < int32; any float wins.
  EXPECT_EQ(promote_types(DType::u8, DType::i8), DType::i16);
  EXPECT_EQ(promote_types(DType::i8, DType::u8), DType::i16);
  EXPECT_EQ(promote_types(DType::b8, DType::i8), DType::i8);
  EXPECT_EQ(promote_types(DType::i8, DType::i16), DType::i16);
  EXPECT_EQ(promote_types(DType::i16, DType::i32), DType::i32);
  EXPECT_EQ(promote_types(DType::i16, DType::u8), DType::i16);
  EXPECT_EQ(promote_types(DType::i8, DType::f16), DType::f16);
}

TEST(Half, KnownBitPatterns) {
  // IEEE binary16 encodings computed by hand.
  EXPECT_EQ(Half(1.0f).bits, 0x3c00);
  EXPECT_EQ(Half(-2.0f).bits, 0xc000);
  EXPECT_EQ(Half(65504.0f).bits, 0x7bff);        // largest finite
  EXPECT_EQ(Half(65520.0f).bits, 0x7c00);        // rounds to inf
  EXPECT_EQ(Half(6.103515625e-05f).bits, 0x0400);  // smallest normal 2^-14
  EXPECT_EQ(Half(5.9604644775390625e-08f).bits, 0x0001);  // smallest subnormal 2^-24
  EXPECT_EQ(Half(2.98023223876953125e-08f).bits, 0x0000);  // 2^-25: tie, rounds to even (zero)
  EXPECT_EQ(Half(1.0f + 1.0f / 2048).bits, 0x3c00);        // tie between 1 and 1+2^-10: even mantissa
  EXPECT_EQ(Half(1.0f + 3.0f / 2048).bits, 0x3c02);        // tie between 1+2^-10 and 1+2^-9: even
  EXPECT_EQ(Half(std::numeric_limits<float>::infinity()).bits, 0x7c00);
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(std::nanf("")))));
  EXPECT_EQ(static_cast<float>(Half::from_bits(0x3555)), 0.333251953125f);
  EXPECT_EQ(static_cast<float>(Half::from_bits(0x8001)), -5.9604644775390625e-08f);
}

// Note [Half conversions on the device]: f16 -> float keeps a NaN's sign and payload and makes it quiet, as IEEE 754's
// conversions (and the GPU after any float operation) do; infinities stay infinities.
TEST(Half, NaNsWidenQuietWithTheirPayload) {
  auto bits = [](uint16_t h) {
    const float f = static_cast<float>(Half::from_bits(h));
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  EXPECT_EQ(bits(0x7c01), 0x7fc02000u);  // signalling, payload 1
  EXPECT_EQ(bits(0xfd55), 0xffc00000u | (0x155u << 13));  // signalling, negative
  EXPECT_EQ(bits(0x7e00), 0x7fc00000u);  // already quiet
  EXPECT_EQ(bits(0x7fff), 0x7fffe000u);
  EXPECT_EQ(bits(0x7c00), 0x7f800000u);  // +inf
  EXPECT_EQ(bits(0xfc00), 0xff800000u);  // -inf
}

TEST(Half, RoundTripAllFiniteValues) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const Half h = Half::from_bits(static_cast<uint16_t>(b));
    const float f = h;
    if (std::isnan(f)) continue;
    EXPECT_EQ(Half(f).bits, b) << "bits " << b;
  }
}

TEST(BFloat16, KnownBitPatterns) {
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(BFloat16(-1.5f).bits, 0xbfc0);
  EXPECT_EQ(BFloat16(1.0f + 1.0f / 256).bits, 0x3f80);  // tie -> even
  EXPECT_EQ(BFloat16(1.0f + 3.0f / 256).bits, 0x3f82);  // tie -> even
  EXPECT_EQ(static_cast<float>(BFloat16::from_bits(0x4049)), 3.140625f);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::nanf("")))));
}
