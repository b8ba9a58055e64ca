// copy_ between views that share memory (Note [Overlapping copies]), destinations that alias themselves, int64
// overflow in shapes and views, Scalar edge values, exact integer printing and allocation poisoning.
// Expected values are hand-computed.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ember/ember.h"

using namespace ember;

namespace {
std::vector<float> vals(const Tensor& t) { return t.to_vector<float>(); }
}  // namespace

TEST(OverlappingCopy, TransposeIntoItself) {
  Tensor a = arange(0, 4, 1, DType::f32).view({2, 2});
  a.copy_(a.t());
  EXPECT_EQ(vals(a), (std::vector<float>{0, 2, 1, 3}));
}

TEST(OverlappingCopy, ShiftedSlicesBothDirections) {
  Tensor m = arange(0, 12, 1, DType::f32).view({3, 4});
  m.slice(1, 1, 4).copy_(m.slice(1, 0, 3));  // shift right by one column
  EXPECT_EQ(vals(m), (std::vector<float>{0, 0, 1, 2, 4, 4, 5, 6, 8, 8, 9, 10}));
  Tensor v = arange(0, 6, 1, DType::f32);
  v.slice(0, 0, 5).copy_(v.slice(0, 1, 6));  // shift left by one
  EXPECT_EQ(vals(v), (std::vector<float>{1, 2, 3, 4, 5, 5}));
}

TEST(OverlappingCopy, OverlapWithDTypeChangeThroughSharedStorage) {
  Tensor a = arange(0, 4, 1, DType::f32);
  Tensor b = a.slice(0, 1, 4);
  b.copy_(a.slice(0, 0, 3));
  EXPECT_EQ(vals(a), (std::vector<float>{0, 0, 1, 2}));
}

TEST(OverlappingCopy, IdenticalViewIsANoOp) {
  Tensor a = arange(0, 4, 1, DType::f32);
  const int64_t v0 = a.version();
  a.copy_(a);
  EXPECT_EQ(vals(a), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_GT(a.version(), v0);  // still counts as a write
}

TEST(OverlappingCopy, ExpandedDestinationIsRejected) {
  Tensor z = zeros({1, 3}).expand({2, 3});
  EXPECT_THROW(z.copy_(ones({2, 3})), ValueError);
  z.fill_(2.0);  // filling is well defined: every alias gets the same value
  EXPECT_EQ(vals(z.contiguous()), (std::vector<float>{2, 2, 2, 2, 2, 2}));
}

TEST(Limits, ShapesThatOverflowInt64AreShapeErrors) {
  EXPECT_THROW(zeros({int64_t{1} << 62}), ShapeError);                 // 2^62 elements * 4 bytes
  EXPECT_THROW(empty({int64_t{1} << 32, int64_t{1} << 32}), ShapeError);  // 2^64 elements
  EXPECT_THROW(zeros({4}).as_strided({3}, {int64_t{1} << 62}, 0), ShapeError);
  EXPECT_THROW(empty({int64_t{1} << 62}, Device::meta()), ShapeError);
}

TEST(Limits, SliceAndNarrowWithHugeArguments) {
  Tensor a = arange(0, 5, 1, DType::f32);
  Tensor s = a.slice(0, 0, 5, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(vals(s), (std::vector<float>{0}));
  EXPECT_EQ(a.slice(0, 2, std::numeric_limits<int64_t>::max()).numel(), 3);
  EXPECT_THROW(a.narrow(0, 1, std::numeric_limits<int64_t>::max()), IndexError);
}

TEST(ScalarValues, NonFiniteFloatsAreKeptAndIntegerConversionIsDefined) {
  Tensor f = full({2}, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(vals(f)[0], -std::numeric_limits<float>::infinity());
  Tensor n = full({1}, std::nan(""));
  EXPECT_TRUE(std::isnan(vals(n)[0]));
  EXPECT_EQ(Scalar(std::nan("")).to_int(), 0);
  EXPECT_EQ(Scalar(1e300).to_int(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Scalar(-2.7).to_int(), -2);
  EXPECT_EQ(Scalar(int64_t{1} << 60).to_int(), int64_t{1} << 60);
  EXPECT_TRUE(Scalar(3).is_integral());
  EXPECT_FALSE(Scalar(3.0).is_integral());
}

TEST(Print, LargeIntegersExactly) {
  const int64_t big = (int64_t{1} << 53) + 1;  // not representable in double
  const std::string s = to_string(from_vector<int64_t>({big}, {1}));
  EXPECT_NE(s.find("9007199254740993"), std::string::npos) << s;
}

TEST(Poison, NewAllocationsAreNaNInTests) {
  ASSERT_TRUE(memory::poison_allocations());  // turned on by the test main
  Tensor e = empty({3}, DType::f32);
  for (float v : vals(e)) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(empty({2}, DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{-1, -1}));
}
