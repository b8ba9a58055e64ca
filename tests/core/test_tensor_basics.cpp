// Tensor basics: factories, dtype conversion (incl. f16/bf16 rounding), item/data access, copy_ with broadcasting,
// meta tensors, Device parsing, printing, the version counter, and 0-d / empty tensors.
// Every expected value is written by hand here (IEEE rounding worked out in the comments), never taken from ember.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ember/core/meta_scope.h"
#include "ember/core/tensor.h"
#include "ember/memory/host_allocator.h"
#include "tests/harness/op_harness.h"

using namespace ember;

namespace {

std::string str(const Tensor& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// ---- factories -----------------------------------------------------------------------------------------------

TEST(Factories, Empty) {
  Tensor t = empty({2, 3, 4});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.sizes(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_EQ(t.itemsize(), 4);
  EXPECT_EQ(t.nbytes(), 96);
  EXPECT_EQ(t.storage()->nbytes(), 96);
  EXPECT_EQ(t.storage_offset(), 0);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_THROW(t.size(3), IndexError);
  EXPECT_THROW(t.stride(-4), IndexError);
  EXPECT_EQ(t.description(), "f32[2, 3, 4] on cpu");
  EXPECT_EQ(empty({5}, DType::f16).nbytes(), 10);
  EXPECT_EQ(empty({5}, DType::i64).nbytes(), 40);
  EXPECT_THROW(empty({2, -1}), ShapeError);
}

TEST(Factories, EmptyStrided) {
  Tensor t = empty_strided({2, 3}, {1, 2});  // column-major: addresses elements 0..5
  EXPECT_EQ(t.strides(), (Shape{1, 2}));
  EXPECT_EQ(t.storage()->nbytes(), 24);
  EXPECT_FALSE(t.is_contiguous());
  Tensor g = empty_strided({2, 2}, {10, 1}, DType::f64);  // extent 1 + 10 + 1 = 12 elements
  EXPECT_EQ(g.storage()->nbytes(), 96);
  EXPECT_THROW(empty_strided({2, 2}, {1}), ShapeError);
  EXPECT_THROW(empty_strided({2, 2}, {-1, 1}), ShapeError);
  EXPECT_EQ(empty_strided({0, 4}, {4, 1}).storage()->nbytes(), 0);
}

TEST(Factories, ZerosOnesFull) {
  EXPECT_EQ(zeros({2, 2}).to_vector<double>(), std::vector<double>(4, 0.0));
  EXPECT_EQ(ones({3}, DType::i32).to_vector<int32_t>(), std::vector<int32_t>(3, 1));
  EXPECT_EQ(ones({2}, DType::bf16).to_vector<double>(), std::vector<double>(2, 1.0));
  EXPECT_EQ(full({2, 2}, 2.5).to_vector<float>(), std::vector<float>(4, 2.5f));
  EXPECT_EQ(full({2}, 2.7, DType::i32).to_vector<int32_t>(), std::vector<int32_t>(2, 2));     // truncation
  EXPECT_EQ(full({2}, -2.7, DType::i64).to_vector<int64_t>(), std::vector<int64_t>(2, -2));
  EXPECT_EQ(full({1}, 0.5, DType::b8).to_vector<bool>(), std::vector<bool>{true});
  EXPECT_EQ(full({1}, 0, DType::b8).to_vector<bool>(), std::vector<bool>{false});
  // Integers are exact beyond 2^53 (the Scalar keeps them as int64).
  const int64_t big = (int64_t{1} << 53) + 1;
  EXPECT_EQ(full({1}, big, DType::i64).to_vector<int64_t>(), std::vector<int64_t>{big});
  // 0.1 in f16 is 1.599609375 * 2^-4 (mantissa 0.6 * 1024 = 614.4 -> 614).
  EXPECT_EQ(full({1}, 0.1, DType::f16).to_vector<double>(), std::vector<double>{0.0999755859375});
  EXPECT_THROW(zeros({-3}), ShapeError);
  Tensor like_src = empty({3, 2}, DType::f64).t();
  Tensor z = zeros_like(like_src);
  EXPECT_EQ(z.sizes(), (Shape{2, 3}));
  EXPECT_EQ(z.dtype(), DType::f64);
  EXPECT_EQ(z.to_vector<double>(), std::vector<double>(6, 0.0));
  EXPECT_EQ(ones_like(z).to_vector<double>(), std::vector<double>(6, 1.0));
  EXPECT_EQ(empty_like(z).sizes(), (Shape{2, 3}));
}

TEST(Factories, ArangeIntegerSteps) {
  Tensor a = arange(5);
  EXPECT_EQ(a.dtype(), DType::i64);
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(0, 10, 3, DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{0, 3, 6, 9}));
  EXPECT_EQ(arange(10, 0, -3, DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{10, 7, 4, 1}));
  EXPECT_EQ(arange(-2, 2, 1, DType::f32).to_vector<float>(), (std::vector<float>{-2, -1, 0, 1}));
  EXPECT_EQ(arange(3, DType::f64).to_vector<double>(), (std::vector<double>{0, 1, 2}));
  EXPECT_EQ(arange(5, 5, 1, DType::i64).numel(), 0);
  EXPECT_EQ(arange(0).numel(), 0);
  EXPECT_EQ(arange(0, 4, 1, DType::f16).to_vector<double>(), (std::vector<double>{0, 1, 2, 3}));
}

TEST(Factories, ArangeFloatSteps) {
  EXPECT_EQ(arange(1, 2, 0.25, DType::f32).to_vector<float>(), (std::vector<float>{1, 1.25f, 1.5f, 1.75f}));
  EXPECT_EQ(arange(3.5, DType::f32).to_vector<float>(), (std::vector<float>{0, 1, 2, 3}));  // ceil(3.5) elements
  const std::vector<double> v = arange(0.0, 1.0, 0.1, DType::f64).to_vector<double>();
  ASSERT_EQ(v.size(), 10u);  // like numpy/PyTorch: [0, 0.1, ..., 0.9]
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], 0.1 * static_cast<double>(i), 1e-12);
  const std::vector<double> w = arange(0.0, 1.0, 0.3, DType::f64).to_vector<double>();
  ASSERT_EQ(w.size(), 4u);
  EXPECT_NEAR(w[3], 0.9, 1e-12);
  const std::vector<double> d = arange(1.0, 0.0, -0.5, DType::f64).to_vector<double>();
  EXPECT_EQ(d, (std::vector<double>{1.0, 0.5}));
}

TEST(Factories, ArangeLargeIntegerBounds) {
  const int64_t b = int64_t{1} << 60;
  Tensor a = arange(b, b + 3, 1, DType::i64);
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{b, b + 1, b + 2}));
}

TEST(Factories, ArangeErrors) {
  EXPECT_THROW(arange(0, 5, 0, DType::f32), ValueError);
  EXPECT_THROW(arange(0, 5, -1, DType::f32), ValueError);
  EXPECT_THROW(arange(5, 0, 1, DType::i64), ValueError);
  EXPECT_THROW(arange(0, std::numeric_limits<double>::infinity(), 1, DType::f32), ValueError);
  EXPECT_THROW(arange(0, std::numeric_limits<double>::quiet_NaN(), 1, DType::f32), ValueError);
  EXPECT_THROW(arange(0, 1, std::numeric_limits<double>::quiet_NaN(), DType::f32), ValueError);
}

TEST(Factories, ScalarTensor) {
  Tensor s = scalar_tensor(3.5);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_TRUE(s.sizes().empty());
  EXPECT_TRUE(s.strides().empty());
  EXPECT_EQ(s.dtype(), DType::f32);
  EXPECT_EQ(s.item<float>(), 3.5f);
  EXPECT_EQ(scalar_tensor(7, DType::i64).item<int64_t>(), 7);
  EXPECT_EQ(scalar_tensor(-1.25, DType::f64).item_double(), -1.25);
}

TEST(Factories, FromVector) {
  Tensor t = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.dtype(), DType::f64);
  EXPECT_EQ(t.sizes(), (Shape{2, 3}));
  EXPECT_EQ(t.to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(from_vector(std::vector<int32_t>{-1, 7}, {2}).dtype(), DType::i32);
  EXPECT_EQ(from_vector(std::vector<bool>{true, false, true}, {3}).to_vector<bool>(),
            (std::vector<bool>{true, false, true}));
  // Conversion on the way in: 1.5 f64 -> i32 truncates.
  Tensor c = from_vector(std::vector<double>{1.5, -1.5}, {2}, DType::i32);
  EXPECT_EQ(c.dtype(), DType::i32);
  EXPECT_EQ(c.to_vector<int32_t>(), (std::vector<int32_t>{1, -1}));
  EXPECT_EQ(from_vector(std::vector<float>{9}, {}).dim(), 0);
  EXPECT_EQ(from_vector(std::vector<float>{}, {0, 2}).numel(), 0);
  EXPECT_THROW(from_vector(std::vector<float>{1, 2, 3}, {2, 2}), ShapeError);
  EXPECT_THROW(from_vector(std::vector<float>{1, 2}, {2, -1}), ShapeError);
  EXPECT_THROW(from_vector(std::vector<float>{}, {}), ShapeError);  // 0-d needs one value
}

TEST(Factories, TensorLiteral) {
  Tensor t = tensor({1.0f, 2.5f, -3.0f});
  EXPECT_EQ(t.sizes(), (Shape{3}));
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1.0f, 2.5f, -3.0f}));
  Tensor e = tensor({});
  EXPECT_EQ(e.sizes(), (Shape{0}));
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(tensor({1.5f}, DType::f64).dtype(), DType::f64);
}

// ---- dtype conversion ----------------------------------------------------------------------------------------

TEST(Convert, FloatToHalfRounding) {
  // Worked by hand: 1 + 2^-11 is the tie between 1 and 1 + 2^-10 -> even (1); 1 + 3 * 2^-11 -> 1 + 2^-9;
  // 65504 is the largest finite half, 65520 rounds to inf; 1e-8 is below half of the smallest subnormal (2^-25)
  // -> 0; 2^-24 is the smallest subnormal; 0.1 -> 0.0999755859375.
  const std::vector<float> in = {1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 65504.0f, 65520.0f, -65520.0f, 1e-8f,
                                 5.9604644775390625e-08f, 0.1f, -2.0f};
  const std::vector<double> want = {1.0, 1.001953125, 65504.0, INFINITY, -INFINITY, 0.0,
                                    5.9604644775390625e-08, 0.0999755859375, -2.0};
  Tensor h = from_vector(in, {static_cast<int64_t>(in.size())}).to(DType::f16);
  EXPECT_EQ(h.dtype(), DType::f16);
  EXPECT_EQ(h.nbytes(), static_cast<int64_t>(2 * in.size()));
  EXPECT_EQ(h.to_vector<double>(), want);
  EXPECT_EQ(h.to(DType::f32).to_vector<double>(), want);  // f16 -> f32 is exact
}

TEST(Convert, FloatToBFloat16Rounding) {
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 ties to 1; 1 + 3 * 2^-8 ties to 1 + 2^-6; 0.1 -> (1 + 77/128) / 16;
  // 3.14159 -> (1 + 73/128) * 2 = 3.140625.
  const std::vector<float> in = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 0.1f, 3.14159f, -0.0f};
  const std::vector<double> want = {1.0, 1.015625, 0.10009765625, 3.140625, 0.0};
  Tensor b = from_vector(in, {5}).to(DType::bf16);
  EXPECT_EQ(b.dtype(), DType::bf16);
  EXPECT_EQ(b.to_vector<double>(), want);
  EXPECT_TRUE(std::signbit(b.to_vector<double>()[4]));
  // f16 -> bf16 goes through float: 0.0999755859375 = 1.599609375 * 2^-4, 0.599609375 * 128 = 76.75 -> 77.
  EXPECT_EQ(full({1}, 0.1, DType::f16).to(DType::bf16).to_vector<double>(), std::vector<double>{0.10009765625});
  Tensor nan = from_vector(std::vector<float>{NAN}, {1});
  EXPECT_TRUE(std::isnan(nan.to(DType::bf16).to_vector<double>()[0]));
  EXPECT_TRUE(std::isnan(nan.to(DType::f16).to_vector<double>()[0]));
}

TEST(Convert, FloatToBoolAndInt) {
  Tensor f = from_vector(std::vector<float>{0.0f, -0.0f, 0.5f, -2.0f, NAN, INFINITY}, {6});
  EXPECT_EQ(f.to(DType::b8).to_vector<bool>(), (std::vector<bool>{false, false, true, true, true, true}));
  Tensor g = from_vector(std::vector<float>{2.7f, -2.7f, 0.9f, -0.9f, 100.5f}, {5});
  EXPECT_EQ(g.to(DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{2, -2, 0, 0, 100}));
  EXPECT_EQ(g.to(DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{2, -2, 0, 0, 100}));
  EXPECT_EQ(from_vector(std::vector<double>{3.9, 255.0}, {2}).to(DType::u8).to_vector<uint8_t>(),
            (std::vector<uint8_t>{3, 255}));
  // int8 / int16 (quantized weights, narrow indices): truncation toward zero, values in range.
  Tensor h = from_vector(std::vector<float>{127.0f, -127.9f, 3.5f, -0.5f}, {4});
  EXPECT_EQ(h.to(DType::i8).to_vector<int32_t>(), (std::vector<int32_t>{127, -127, 3, 0}));
  EXPECT_EQ(h.to(DType::i16).to_vector<int32_t>(), (std::vector<int32_t>{127, -127, 3, 0}));
  EXPECT_EQ(from_vector<int8_t>({-128, 5}, {2}).to(DType::f32).to_vector<float>(), (std::vector<float>{-128.0f, 5.0f}));
  EXPECT_EQ(from_vector<int16_t>({-32768, 32767}, {2}).to(DType::i64).to_vector<int64_t>(),
            (std::vector<int64_t>{-32768, 32767}));
  EXPECT_EQ(from_vector(std::vector<bool>{true, false}, {2}).to(DType::f32).to_vector<float>(),
            (std::vector<float>{1.0f, 0.0f}));
  // 2^24 + 1 is not a float: rounds to even (2^24).
  EXPECT_EQ(from_vector(std::vector<int64_t>{16777217}, {1}).to(DType::f32).to_vector<double>(),
            std::vector<double>{16777216.0});
  // Reading through to_vector<T> converts the same way.
  EXPECT_EQ(g.to_vector<int32_t>(), (std::vector<int32_t>{2, -2, 0, 0, 100}));
}

TEST(Convert, SameDtypeIsNoCopy) {
  Tensor t = zeros({3});
  EXPECT_TRUE(t.to(DType::f32).is_same(t));
  EXPECT_TRUE(t.to(Device::cpu()).is_same(t));
  EXPECT_TRUE(t.cpu().is_same(t));
  Tensor d = t.to(DType::f64);
  EXPECT_NE(d.storage().get(), t.storage().get());
  // A converted non-contiguous tensor keeps its logical order.
  Tensor m = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}).t();
  EXPECT_EQ(m.to(DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{1, 4, 2, 5, 3, 6}));
}

// ---- item / data -------------------------------------------------------------------------------------------------

TEST(Access, ItemErrors) {
  EXPECT_THROW(zeros({2}).item<float>(), ShapeError);
  EXPECT_THROW(zeros({0}).item<float>(), ShapeError);
  EXPECT_THROW(zeros({2, 3}).item_double(), ShapeError);
  EXPECT_EQ(full({1, 1, 1}, 4.0).item<float>(), 4.0f);
  EXPECT_EQ(arange(10).select(0, 7).item<int64_t>(), 7);
  EXPECT_EQ(arange(10).select(0, 7).item<double>(), 7.0);
}

TEST(Access, DataWrongTypeThrows) {
  Tensor f = zeros({4});
  EXPECT_THROW(f.data<double>(), DTypeError);
  EXPECT_THROW(f.data<int32_t>(), DTypeError);
  EXPECT_THROW(f.data<Half>(), DTypeError);
  EXPECT_NE(f.data<float>(), nullptr);
  EXPECT_THROW(zeros({1}, DType::f16).data<BFloat16>(), DTypeError);
  EXPECT_NO_THROW(zeros({1}, DType::bf16).data<BFloat16>());
  // data() points at the view's first element.
  Tensor a = arange(10);
  Tensor s = a.slice(0, 3, 10, 2);
  EXPECT_EQ(s.data<int64_t>()[0], 3);
  EXPECT_EQ(s.data<int64_t>(), a.data<int64_t>() + 3);
  EXPECT_EQ(s.raw_data(), static_cast<void*>(a.data<int64_t>() + 3));
}

TEST(Access, UndefinedTensor) {
  Tensor u;
  EXPECT_FALSE(u.defined());
  EXPECT_EQ(u.description(), "undefined tensor");
  EXPECT_THROW(u.sizes(), ValueError);
  EXPECT_THROW(u.numel(), ValueError);
  EXPECT_EQ(str(u), "tensor(undefined)");
  Tensor dst = zeros({2});
  EXPECT_THROW(dst.copy_(u), ValueError);
}

// ---- copy_ ---------------------------------------------------------------------------------------------------

TEST(Copy, BroadcastAndCast) {
  Tensor dst = zeros({2, 3}, DType::i32);
  dst.copy_(from_vector(std::vector<double>{1.9, -2.5, 3.1}, {3}));  // row broadcast, f64 -> i32 truncation
  EXPECT_EQ(dst.to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 3, 1, -2, 3}));
  dst.copy_(from_vector(std::vector<int64_t>{7, 8}, {2, 1}));  // column broadcast
  EXPECT_EQ(dst.to_vector<int32_t>(), (std::vector<int32_t>{7, 7, 7, 8, 8, 8}));
  dst.copy_(scalar_tensor(5.0));
  EXPECT_EQ(dst.to_vector<int32_t>(), std::vector<int32_t>(6, 5));
  EXPECT_THROW(dst.copy_(zeros({2})), ShapeError);
  EXPECT_THROW(dst.copy_(zeros({1, 2, 3})), ShapeError);
  // Into a non-contiguous destination, from a non-contiguous source.
  Tensor h = zeros({3, 2}, DType::f16);
  h.t().copy_(from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2}).t());
  EXPECT_EQ(h.to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  // Cast into f16 rounds: 0.1 -> 0.0999755859375.
  Tensor one = zeros({1}, DType::f16);
  one.copy_(from_vector(std::vector<float>{0.1f}, {1}));
  EXPECT_EQ(one.to_vector<double>(), std::vector<double>{0.0999755859375});
  // Returns *this.
  Tensor r = zeros({2});
  EXPECT_EQ(&r.copy_(ones({2})), &r);
}

TEST(Copy, AcrossDevicesWithoutGpu) {
  if (memory::cuda::is_available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THROW(empty({2}, Device::cuda(0)), DeviceError);
  EXPECT_THROW(zeros({2}).to(Device::cuda(0)), DeviceError);
}

// ---- meta ----------------------------------------------------------------------------------------------------

TEST(Meta, ShapeWithoutData) {
  const int64_t allocs_before = allocator_for(Device::cpu()).stats().num_allocs;
  Tensor m = empty({int64_t{1} << 20, int64_t{1} << 20}, {DType::f32, Device::meta()});  // 4 TiB of nothing
  EXPECT_EQ(allocator_for(Device::cpu()).stats().num_allocs, allocs_before);
  EXPECT_EQ(m.device(), Device::meta());
  EXPECT_EQ(m.sizes(), (Shape{int64_t{1} << 20, int64_t{1} << 20}));
  EXPECT_EQ(m.nbytes(), int64_t{4} << 40);
  EXPECT_EQ(m.raw_data(), nullptr);
  EXPECT_EQ(m.data<float>(), nullptr);
  EXPECT_THROW(m.to_vector<float>(), DeviceError);
  EXPECT_THROW(m.item<float>(), ShapeError);
  EXPECT_THROW(empty({}, Device::meta()).item<float>(), DeviceError);  // outside a dry run: no value to read
  {
    MetaAllocationScope dry_run;  // Note [Reading a meta tensor]: inside one it reads 0
    EXPECT_EQ(empty({}, Device::meta()).item<float>(), 0.0f);
    EXPECT_EQ(empty({1}, Device::meta()).item_double(), 0.0);
  }
  EXPECT_THROW(allocator_for(Device::meta()), DeviceError);
}

TEST(Meta, FactoriesAndViewsWork) {
  const TensorOptions meta{DType::f16, Device::meta()};
  EXPECT_EQ(zeros({2, 3}, meta).sizes(), (Shape{2, 3}));
  EXPECT_EQ(ones({4}, meta).dtype(), DType::f16);
  EXPECT_EQ(full({4}, 2.0, meta).device(), Device::meta());
  EXPECT_EQ(arange(0, 10, 2, meta).sizes(), (Shape{5}));
  EXPECT_EQ(rand({3, 3}, meta).device(), Device::meta());
  EXPECT_EQ(randn({3, 3}, meta).sizes(), (Shape{3, 3}));
  EXPECT_EQ(scalar_tensor(1.0, meta).dim(), 0);
  Tensor m = zeros({2, 3, 4}, meta);
  EXPECT_EQ(m.view({6, 4}).sizes(), (Shape{6, 4}));
  EXPECT_EQ(m.permute({2, 0, 1}).strides(), (Shape{1, 12, 4}));
  EXPECT_EQ(m.transpose(0, 1).contiguous().strides(), (Shape{8, 4, 1}));
  EXPECT_EQ(m.to(DType::f32).dtype(), DType::f32);
  EXPECT_EQ(m.to(DType::f32).device(), Device::meta());
  EXPECT_EQ(zeros({2}).to(Device::meta()).device(), Device::meta());
  EXPECT_THROW(m.view({5, 5}), ShapeError);
  m.fill_(1.0);  // no data: a no-op
  m.copy_(zeros({4}));
  // Data cannot come out of meta.
  Tensor cpu = zeros({2, 3, 4});
  EXPECT_THROW(cpu.copy_(m), DeviceError);
  EXPECT_THROW(m.to(Device::cpu()), DeviceError);
  const std::string s = str(m);
  EXPECT_TRUE(contains(s, "meta")) << s;
  EXPECT_TRUE(contains(s, "[2, 3, 4]")) << s;
  EXPECT_TRUE(contains(s, "f16")) << s;
}

// ---- Device --------------------------------------------------------------------------------------------------

TEST(DeviceParse, GoodAndBad) {
  EXPECT_EQ(Device("cpu"), Device::cpu());
  EXPECT_EQ(Device("meta"), Device::meta());
  EXPECT_EQ(Device("cuda"), Device::cuda(0));
  EXPECT_EQ(Device("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device("cuda:3").index, 3);
  EXPECT_TRUE(Device("cuda:3").is_cuda());
  EXPECT_EQ(Device("cuda:12"), Device::cuda(12));
  EXPECT_EQ(Device(std::string("cpu")), Device::cpu());
  EXPECT_FALSE(Device::cuda(0) == Device::cuda(1));
  EXPECT_FALSE(Device::cpu() == Device::meta());
  for (const char* bad : {"", "gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1a", "cuda 1", " cpu", "cpu:0x", "cuda:1:2",
                          "cuda:123456789012", "metal"}) {
    EXPECT_THROW({ Device d(bad); (void)d; }, ConfigError) << "'" << bad << "'";
  }
  try {
    Device d("gpu");
    (void)d;
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "gpu")) << e.what();
  }
}

// DefaultDeviceGuard (core/device.h): tensors made without naming a device go to the guard's device, on this thread
// only, until the guard ends; a named device always wins; guards nest.
TEST(DefaultDevice, GuardSetsTheDeviceOfUnnamedTensorsOnThisThread) {
  EXPECT_EQ(default_device(), Device::cpu());
  EXPECT_EQ(empty({2}).device(), Device::cpu());
  {
    DefaultDeviceGuard on_meta(Device::meta());
    EXPECT_EQ(default_device(), Device::meta());
    EXPECT_EQ(empty({2}).device(), Device::meta());
    EXPECT_EQ(zeros({2}, DType::f64).device(), Device::meta());
    EXPECT_EQ(empty({2}, TensorOptions(DType::f32, Device::cpu())).device(), Device::cpu());
    Device other_thread = Device::meta();
    std::thread([&] { other_thread = empty({1}).device(); }).join();
    EXPECT_EQ(other_thread, Device::cpu());
    {
      DefaultDeviceGuard back(Device::cpu());
      EXPECT_EQ(empty({2}).device(), Device::cpu());
    }
    EXPECT_EQ(empty({2}).device(), Device::meta());
  }
  EXPECT_EQ(default_device(), Device::cpu());
  EXPECT_EQ(ones({2}).device(), Device::cpu());
}

TEST(DeviceParse, Printing) {
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::meta().str(), "meta");
  EXPECT_EQ(Device::cuda(3).str(), "cuda:3");
  EXPECT_EQ(Device(Device::cuda(7).str()), Device::cuda(7));
  std::ostringstream os;
  os << Device::cuda(1);
  EXPECT_EQ(os.str(), "cuda:1");
  EXPECT_STREQ(device_type_name(DeviceType::CUDA), "cuda");
}

// ---- printing ------------------------------------------------------------------------------------------------

TEST(Print, ValuesDtypeDevice) {
  const std::string s = str(tensor({1.5f, -2.0f, 3.25f}));
  EXPECT_TRUE(contains(s, "1.5000")) << s;
  EXPECT_TRUE(contains(s, "-2.0000")) << s;
  EXPECT_TRUE(contains(s, "3.2500")) << s;
  EXPECT_TRUE(contains(s, "f32")) << s;
  EXPECT_TRUE(contains(s, "cpu")) << s;
  EXPECT_FALSE(contains(s, "...")) << s;
  const std::string i = str(arange(5));
  EXPECT_TRUE(contains(i, "[0, 1, 2, 3, 4]")) << i;
  EXPECT_TRUE(contains(i, "i64")) << i;
  const std::string m = str(from_vector(std::vector<double>{0, 1, 2, 3, 4, 5}, {2, 3}));
  EXPECT_TRUE(contains(m, "[[0.0000, 1.0000, 2.0000]")) << m;
  EXPECT_TRUE(contains(m, "[3.0000, 4.0000, 5.0000]]")) << m;
  EXPECT_TRUE(contains(m, "f64")) << m;
  // A transposed view prints in its logical order.
  const std::string t = str(from_vector(std::vector<double>{0, 1, 2, 3, 4, 5}, {2, 3}).t());
  EXPECT_TRUE(contains(t, "[[0.0000, 3.0000]")) << t;
  const std::string special = str(tensor({NAN, INFINITY, -INFINITY}));
  EXPECT_TRUE(contains(special, "nan")) << special;
  EXPECT_TRUE(contains(special, "inf")) << special;
  EXPECT_TRUE(contains(special, "-inf")) << special;
  EXPECT_TRUE(contains(str(zeros({2}, DType::b8)), "bool"));
  EXPECT_TRUE(contains(str(zeros({2}, DType::bf16)), "bf16"));
}

TEST(Print, LargeTensorsAreSummarised) {
  const std::string s = str(arange(1000));
  EXPECT_TRUE(contains(s, "...")) << s;
  EXPECT_TRUE(contains(s, "[0, 1, 2, ..., 997, 998, 999]")) << s;
  EXPECT_FALSE(contains(s, "500")) << s;
  EXPECT_LT(s.size(), 200u);
  const std::string m = str(arange(10000).view({100, 100}));
  EXPECT_TRUE(contains(m, "...")) << m;
  EXPECT_TRUE(contains(m, "9999")) << m;
  EXPECT_FALSE(contains(m, "5050")) << m;
  EXPECT_LT(m.size(), 1000u);
  // The threshold is a parameter of to_string.
  EXPECT_FALSE(contains(to_string(arange(1000), 2000), "..."));
}

TEST(Print, ZeroDimAndEmpty) {
  const std::string s = str(scalar_tensor(7.0));
  EXPECT_TRUE(contains(s, "7.0000")) << s;
  EXPECT_FALSE(contains(s, "[")) << s;
  const std::string e = str(zeros({0}));
  EXPECT_TRUE(contains(e, "[]")) << e;
  EXPECT_TRUE(contains(e, "f32")) << e;
  EXPECT_NO_THROW(str(zeros({2, 0, 3})));
}

// ---- version counter -----------------------------------------------------------------------------------------

TEST(Version, BumpsOnInPlaceWritesSharedByViews) {
  Tensor a = zeros({2, 3});
  const int64_t v0 = a.version();
  a.fill_(1.0);
  EXPECT_EQ(a.version(), v0 + 1);
  a.zero_();
  EXPECT_EQ(a.version(), v0 + 2);
  a.copy_(ones({3}));
  EXPECT_EQ(a.version(), v0 + 3);
  Tensor v = a.t().select(0, 1);
  EXPECT_EQ(v.version(), v0 + 3);
  v.fill_(2.0);
  EXPECT_EQ(a.version(), v0 + 4);
  a.bump_version();
  EXPECT_EQ(v.version(), v0 + 5);
  // Reads and copies do not bump; the source of a copy is not bumped; a clone has its own counter.
  Tensor c = a.clone();
  (void)a.to_vector<float>();
  (void)a.to(DType::f64);
  (void)a.contiguous();
  EXPECT_EQ(a.version(), v0 + 5);
  const int64_t c0 = c.version();
  c.fill_(3.0);
  EXPECT_EQ(c.version(), c0 + 1);
  EXPECT_EQ(a.version(), v0 + 5);
  // Writes to empty and meta tensors still count as writes.
  Tensor e = zeros({0});
  const int64_t e0 = e.version();
  e.fill_(1.0);
  EXPECT_EQ(e.version(), e0 + 1);
}

// ---- 0-d and empty tensors -----------------------------------------------------------------------------------

TEST(ZeroDim, Everywhere) {
  Tensor s = scalar_tensor(2.5, DType::f64);
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_EQ(s.nbytes(), 8);
  EXPECT_EQ(s.to_vector<double>(), std::vector<double>{2.5});
  EXPECT_EQ(s.to(DType::f16).item<float>(), 2.5f);
  EXPECT_EQ(s.clone().item<double>(), 2.5);
  EXPECT_EQ(s.unsqueeze(0).sizes(), (Shape{1}));
  EXPECT_EQ(s.expand({3}).to_vector<double>(), std::vector<double>(3, 2.5));
  EXPECT_EQ(s.reshape({1, 1}).sizes(), (Shape{1, 1}));
  Tensor d = zeros({}, DType::i32);
  d.copy_(s);
  EXPECT_EQ(d.item<int32_t>(), 2);
  d.fill_(9);
  EXPECT_EQ(d.item<int64_t>(), 9);
  EXPECT_EQ(s.description(), "f64[] on cpu");
  EXPECT_THROW(s.select(0, 0), IndexError);
}

TEST(ZeroDim, OutOfRangeDimsThrow) {
  // PyTorch: a 0-d tensor accepts dims 0 and -1 where an op takes a dim, and has no size(0)/stride(0).
  Tensor s = scalar_tensor(1.0);
  EXPECT_THROW(s.size(0), IndexError);
  EXPECT_THROW(s.stride(-1), IndexError);
  EXPECT_THROW(s.squeeze(5), IndexError);
  EXPECT_THROW(s.transpose(0, 3), IndexError);
  EXPECT_THROW(s.flatten(5), IndexError);
}

TEST(Empty, Everywhere) {
  Tensor e = zeros({2, 0, 3});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.nbytes(), 0);
  EXPECT_EQ(e.strides(), (Shape{3, 3, 1}));
  EXPECT_TRUE(e.is_contiguous());
  EXPECT_EQ(e.raw_data(), nullptr);
  EXPECT_TRUE(e.to_vector<double>().empty());
  EXPECT_EQ(e.to(DType::f16).numel(), 0);
  EXPECT_EQ(e.clone().sizes(), (Shape{2, 0, 3}));
  EXPECT_EQ(e.contiguous().sizes(), (Shape{2, 0, 3}));
  EXPECT_EQ(e.permute({2, 1, 0}).sizes(), (Shape{3, 0, 2}));
  EXPECT_EQ(e.reshape({0, 6}).sizes(), (Shape{0, 6}));
  EXPECT_EQ(e.flatten().sizes(), (Shape{0}));
  EXPECT_EQ(e.select(2, 1).sizes(), (Shape{2, 0}));
  EXPECT_EQ(e.narrow(0, 1, 1).sizes(), (Shape{1, 0, 3}));
  e.fill_(1.0);
  e.copy_(ones({3}));
  e.copy_(zeros({2, 0, 3}, DType::i64));
  EXPECT_THROW(e.copy_(ones({2})), ShapeError);
  Tensor w = zeros({0}, DType::bf16);
  EXPECT_TRUE(w.to_vector<float>().empty());
  EXPECT_EQ(rand({0}).numel(), 0);
  EXPECT_EQ(arange(0.0, 0.0, 1.0, DType::f32).numel(), 0);
}
