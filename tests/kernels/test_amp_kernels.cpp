// Tests of the mixed-precision ops: ops::amp_unscale_ (in place and into outs of another dtype, every float dtype pair,
// NaN/+inf/-inf detection, non-contiguous grads, lists that span several tensors and chunks, errors) against float64
// products computed here, and ops::amp_update_scale_ against a truth table worked out by hand.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

const std::vector<DType> kFloatDTypes = {DType::f32, DType::f64, DType::f16, DType::bf16};
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The spacing of dtype's values near 1 (its relative rounding step).
double ulp(DType d) {
  switch (d) {
    case DType::f64: return 0x1p-52;
    case DType::f32: return 0x1p-23;
    case DType::f16: return 0x1p-10;
    default: return 0x1p-7;  // bf16
  }
}
// Unscaling g (dtype G) into dtype O: one product in f32 (f64 for f64 grads) and one rounding to O, so the result is
// within one step of the coarser of the two types of the exact product; f16 results near zero are subnormal
// (absolute step 2^-24).
Tolerance unscale_tolerance(DType grad, DType out) {
  const DType compute = grad == DType::f64 ? DType::f64 : DType::f32;
  return {std::max(ulp(out), ulp(compute)), out == DType::f16 ? 0x1p-24 : 0.0};
}

Tensor one_f32(double v, Device device) { return full({1}, v, TensorOptions(DType::f32, device)); }
double value_of(const Tensor& t) { return t.cpu().item_double(); }

// grad values as f64 after rounding to `dtype` (what the kernel reads), times inv_scale widened from f32.
Tensor expected_product(const Tensor& grad64, DType dtype, float inv_scale) {
  std::vector<double> v = grad64.to(dtype).to(DType::f64).contiguous().to_vector<double>();
  for (double& x : v) x *= static_cast<double>(inv_scale);
  return from_vector(v, grad64.sizes());
}

class AmpKernelTest : public DeviceTest {};

TEST_P(AmpKernelTest, UnscaleInPlaceMatchesFloat64Product) {
  EMBER_REQUIRE_KERNEL(amp_unscale_stub);
  const std::vector<Shape> shapes = {{5, 7}, {13}, {2, 3, 4}};
  for (DType dt : kFloatDTypes)
    for (double scale : {1024.0, 3.0, 0.25}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " scale " << scale);
      const float inv = static_cast<float>(1.0 / scale);
      std::vector<Tensor> grads, expected;
      for (const Shape& s : shapes) {
        const Tensor g64 = rand_input(s, -scale, scale);
        grads.push_back(g64.to(device(), dt));
        expected.push_back(expected_product(g64, dt, inv));
      }
      const Tensor found = zeros({1}, TensorOptions(DType::f32, device()));
      const int64_t v0 = grads[1].version(), vf = found.version();
      ops::amp_unscale_(grads, found, one_f32(inv, device()));
      for (size_t i = 0; i < grads.size(); ++i) {
        EXPECT_EQ(grads[i].dtype(), dt);
        EXPECT_TRUE(allclose(grads[i], expected[i], unscale_tolerance(dt, dt))) << "tensor " << i;
      }
      EXPECT_EQ(value_of(found), 0.0);
      EXPECT_GT(grads[1].version(), v0);
      EXPECT_GT(found.version(), vf);
    }
}

TEST_P(AmpKernelTest, UnscaleIntoOutsOfEveryFloatDType) {
  EMBER_REQUIRE_KERNEL(amp_unscale_stub);
  const float inv = 1.0f / 3.0f;
  for (DType gd : kFloatDTypes)
    for (DType od : kFloatDTypes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(gd) << " grads -> " << dtype_name(od) << " outs");
      const Tensor a64 = rand_input({4, 9}, -3.0, 3.0), b64 = rand_input({17}, -3.0, 3.0);
      const std::vector<Tensor> grads = {a64.to(device(), gd), b64.to(device(), gd)};
      const std::vector<Tensor> before = {grads[0].clone(), grads[1].clone()};
      const std::vector<Tensor> outs = {empty({4, 9}, TensorOptions(od, device())),
                                        empty({17}, TensorOptions(od, device()))};
      const Tensor found = zeros({1}, TensorOptions(DType::f32, device()));
      const int64_t vo = outs[0].version();
      ops::amp_unscale_(grads, found, one_f32(inv, device()), outs);
      EXPECT_TRUE(allclose(outs[0], expected_product(a64, gd, inv), unscale_tolerance(gd, od)));
      EXPECT_TRUE(allclose(outs[1], expected_product(b64, gd, inv), unscale_tolerance(gd, od)));
      EXPECT_TRUE(allclose(grads[0], before[0], {0.0, 0.0}));  // the grads are only read
      EXPECT_TRUE(allclose(grads[1], before[1], {0.0, 0.0}));
      EXPECT_GT(outs[0].version(), vo);
      EXPECT_EQ(value_of(found), 0.0);
    }
}

TEST_P(AmpKernelTest, FoundInfSetByNaNAndInfinitiesNeverReset) {
  EMBER_REQUIRE_KERNEL(amp_unscale_stub);
  for (DType dt : kFloatDTypes)
    for (double bad : {kNaN, kInf, -kInf}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " planted " << bad);
      std::vector<double> second = {0.5, -2.0, 4.0, 1.0, 8.0};
      second[3] = bad;  // planted in the 2nd tensor, not at its start
      const std::vector<Tensor> grads = {rand_input({6}).to(device(), dt),
                                         from_vector(second, {5}).to(device(), dt),
                                         rand_input({3}).to(device(), dt)};
      const Tensor found = zeros({1}, TensorOptions(DType::f32, device()));
      ops::amp_unscale_(grads, found, one_f32(0.5, device()));
      EXPECT_EQ(value_of(found), 1.0);
      // Every element is still unscaled (the caller, not the kernel, decides to skip the step).
      const std::vector<double> got = grads[1].cpu().to_vector<double>();
      EXPECT_EQ(got[0], 0.25);
      EXPECT_EQ(got[4], 4.0);
      if (std::isnan(bad)) EXPECT_TRUE(std::isnan(got[3]));
      else EXPECT_EQ(got[3], bad);
    }
  // All finite: found_inf keeps 0, and a 1 from an earlier call is never cleared.
  for (DType dt : kFloatDTypes) {
    const std::vector<Tensor> grads = {rand_input({8}).to(device(), dt)};
    Tensor found = zeros({1}, TensorOptions(DType::f32, device()));
    ops::amp_unscale_(grads, found, one_f32(0.125, device()));
    EXPECT_EQ(value_of(found), 0.0) << dtype_name(dt);
    found.fill_(1.0);
    ops::amp_unscale_(grads, found, one_f32(0.125, device()));
    EXPECT_EQ(value_of(found), 1.0) << dtype_name(dt);
  }
}

TEST_P(AmpKernelTest, ResultOverflowingTheOutDTypeCountsAsNonFinite) {
  EMBER_REQUIRE_KERNEL(amp_unscale_stub);
  // 60000 * 4 = 240000 is finite in f32 but beyond f16's largest value (65504): stored as inf, reported.
  const std::vector<Tensor> grads = {from_vector<double>({1.0, 60000.0}, {2}).to(device(), DType::f32)};
  const std::vector<Tensor> outs = {empty({2}, TensorOptions(DType::f16, device()))};
  const Tensor found = zeros({1}, TensorOptions(DType::f32, device()));
  ops::amp_unscale_(grads, found, one_f32(4.0, device()), outs);
  EXPECT_EQ(value_of(found), 1.0);
  EXPECT_EQ(outs[0].cpu().to_vector<double>()[1], kInf);
  // Into f32 the same product is finite.
  const std::vector<Tensor> outs32 = {empty({2}, TensorOptions(DType::f32, device()))};
  const Tensor found32 = zeros({1}, TensorOptions(DType::f32, device()));
  ops::amp_unscale_(grads, found32, one_f32(4.0, device()), outs32);
  EXPECT_EQ(value_of(found32), 0.0);
  EXPECT_EQ(outs32[0].cpu().to_vector<double>()[1], 240000.0);
}

TEST_P(AmpKernelTest, NonContiguousGrads) {
  EMBER_REQUIRE_KERNEL(amp_unscale_stub);
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const float inv = 1.0f / 8.0f;
    // The f64 references are copies: for f64 on the CPU, convert_keep_strides returns its input itself.
    const Tensor a_src = noncontiguous_input({3, 5}, -4.0, 4.0), b_src = noncontiguous_input({4, 2}, -4.0, 4.0);
    const Tensor a64 = a_src.clone(), b64 = b_src.clone();
    // In place: the strided views themselves are updated (written back from a contiguous copy).
    const Tensor a = convert_keep_strides(a_src, dt, device()), b = convert_keep_strides(b_src, dt, device());
    ASSERT_FALSE(a.is_contiguous());
    const Tensor found = zeros({1}, TensorOptions(DType::f32, device()));
    const int64_t va = a.version();
    ops::amp_unscale_({a, b}, found, one_f32(inv, device()));
    EXPECT_TRUE(allclose(a, expected_product(a64, dt, inv), unscale_tolerance(dt, dt)));
    EXPECT_TRUE(allclose(b, expected_product(b64, dt, inv), unscale_tolerance(dt, dt)));
    EXPECT_GT(a.version(), va);
    EXPECT_EQ(a.strides(), a_src.strides());
    // Into contiguous f32 outs.
    const Tensor c_src = noncontiguous_input({3, 5}, -4.0, 4.0);
    const Tensor c = convert_keep_strides(c_src, dt, device());
    ASSERT_FALSE(c.is_contiguous());
    const std::vector<Tensor> outs = {empty({3, 5}, TensorOptions(DType::f32, device()))};
    ops::amp_unscale_({c}, found, one_f32(inv, device()), outs);
    EXPECT_TRUE(allclose(outs[0], expected_product(c_src, dt, inv), unscale_tolerance(dt, DType::f32)));
    EXPECT_EQ(value_of(found), 0.0);
  }
}

// Many tensors of mixed dtypes, one spanning several 64Ki-element chunks, and empty ones: on CUDA this takes several
// launches of the multi-tensor kernel (more tensors than one table holds).
TEST_P(AmpKernelTest, LongMixedListWithEmptyTensors) {
  EMBER_REQUIRE_KERNEL(amp_unscale_stub);
  const float inv = 1.0f / 16.0f;
  std::vector<Tensor> grads, outs, expected;
  std::vector<DType> out_dtypes;
  for (int i = 0; i < 110; ++i) {
    const DType gd = kFloatDTypes[static_cast<size_t>(i) % 4];
    const int64_t n = i == 57 ? 200003 : (i % 9 == 0 ? 0 : 1 + (i * 37) % 300);
    const Tensor g64 = rand_input({n}, -16.0, 16.0);
    grads.push_back(g64.to(device(), gd));
    const DType od = i % 3 == 0 ? gd : DType::f32;
    out_dtypes.push_back(od);
    outs.push_back(empty({n}, TensorOptions(od, device())));
    expected.push_back(expected_product(g64, gd, inv));
  }
  const Tensor found = zeros({1}, TensorOptions(DType::f32, device()));
  ops::amp_unscale_(grads, found, one_f32(inv, device()), outs);
  for (size_t i = 0; i < grads.size(); ++i)
    EXPECT_TRUE(allclose(outs[i], expected[i], unscale_tolerance(grads[i].dtype(), out_dtypes[i]))) << "tensor " << i;
  EXPECT_EQ(value_of(found), 0.0);
  // An inf at the very end of the big tensor is found.
  Tensor big = grads[57];
  big.narrow(0, 200002, 1).fill_(kInf);
  ops::amp_unscale_(grads, found, one_f32(inv, device()), outs);
  EXPECT_EQ(value_of(found), 1.0);
}

TEST_P(AmpKernelTest, UnscaleErrors) {
  EMBER_REQUIRE_KERNEL(amp_unscale_stub);
  const TensorOptions f32(DType::f32, device());
  const Tensor g = zeros({2, 3}, f32), found = zeros({1}, f32), inv = ones({1}, f32);
  // An empty list is a no-op, whatever else is passed.
  ops::amp_unscale_({}, Tensor(), Tensor());
  // Devices: the grads and found_inf on different devices.
  const Device other = device().is_cpu() ? Device::meta() : Device::cpu();
  const Tensor found_other = zeros({1}, TensorOptions(DType::f32, other));
  const Tensor inv_other = ones({1}, TensorOptions(DType::f32, other));
  EXPECT_NE(error_message<DeviceError>([&] { ops::amp_unscale_({g}, found_other, inv_other); }).find("amp_unscale_"),
            std::string::npos);
  error_message<DeviceError>([&] { ops::amp_unscale_({g}, found, inv_other); });
  error_message<DeviceError>([&] { ops::amp_unscale_({g}, found, inv, {zeros({2, 3}, TensorOptions(DType::f32, other))}); });
  // DTypes: integer grads, non-f32 found_inf / inv_scale, integer outs.
  EXPECT_NE(error_message<DTypeError>([&] {
              ops::amp_unscale_({zeros({3}, TensorOptions(DType::i32, device()))}, found, inv);
            }).find("amp_unscale_"),
            std::string::npos);
  error_message<DTypeError>([&] { ops::amp_unscale_({g}, zeros({1}, TensorOptions(DType::f64, device())), inv); });
  error_message<DTypeError>([&] { ops::amp_unscale_({g}, found, ones({1}, TensorOptions(DType::f16, device()))); });
  error_message<DTypeError>([&] { ops::amp_unscale_({g}, found, inv, {zeros({2, 3}, TensorOptions(DType::i64, device()))}); });
  // Shapes: a mismatched out, a found_inf with two elements.
  EXPECT_NE(error_message<ShapeError>([&] { ops::amp_unscale_({g}, found, inv, {zeros({3, 2}, f32)}); })
                .find("amp_unscale_"),
            std::string::npos);
  error_message<ShapeError>([&] { ops::amp_unscale_({g}, zeros({2}, f32), inv); });
  // Other misuse: outs of another count, a non-contiguous out, an out sharing the grad's memory.
  error_message<ValueError>([&] { ops::amp_unscale_({g, g}, found, inv, {zeros({2, 3}, f32)}); });
  error_message<ValueError>([&] { ops::amp_unscale_({g}, found, inv, {zeros({3, 2}, f32).t()}); });
  error_message<ValueError>([&] { ops::amp_unscale_({g}, found, inv, {g.view({2, 3})}); });
  error_message<ValueError>([&] { ops::amp_unscale_({Tensor()}, found, inv); });
  EXPECT_EQ(value_of(found), 0.0);
}

// ---- amp_update_scale_ ------------------------------------------------------------------------------------------

struct UpdateCase {
  double scale;
  int32_t tracker;
  double found;
  double growth, backoff;
  int64_t interval;
  double want_scale;
  int32_t want_tracker;
};

TEST_P(AmpKernelTest, UpdateScaleTruthTable) {
  EMBER_REQUIRE_KERNEL(amp_update_scale_stub);
  const double big = 3.0e38;  // x2 is beyond f32's largest value (3.4e38)
  const std::vector<UpdateCase> cases = {
      {1024, 0, 0, 2.0, 0.5, 3, 1024, 1},        // clean step: tracker counts
      {1024, 1, 0, 2.0, 0.5, 3, 1024, 2},        //
      {1024, 2, 0, 2.0, 0.5, 3, 2048, 0},        // third clean step: growth, tracker reset
      {1024, 2, 1, 2.0, 0.5, 3, 512, 0},         // inf found: backoff, tracker reset
      {1024, 0, 3, 2.0, 0.5, 3, 512, 0},         // found_inf summed over optimizers (3)
      {1024, 1, kNaN, 2.0, 0.5, 3, 512, 0},      // a NaN count counts as found
      {big, 2, 0, 2.0, 0.5, 3, big, 0},          // growth to a non-finite scale is dropped, tracker still reset
      {8, 0, 0, 2.0, 0.5, 1, 16, 0},             // interval 1: every clean step grows
      {100, 0, 1, 1.5, 0.25, 3, 25, 0},          // other factors
      {100, 2, 0, 1.5, 0.25, 3, 150, 0},         //
      {65536, 5, 0, 2.0, 0.5, 2000, 65536, 6},   // PyTorch's defaults, mid-interval
      {65536, 1999, 0, 2.0, 0.5, 2000, 131072, 0},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    const UpdateCase& c = cases[k];
    SCOPED_TRACE(::testing::Message() << "case " << k);
    const Tensor scale = one_f32(c.scale, device());
    const Tensor tracker = full({1}, c.tracker, TensorOptions(DType::i32, device()));
    const Tensor found = one_f32(c.found, device());
    const int64_t vs = scale.version(), vt = tracker.version();
    ops::amp_update_scale_(scale, tracker, found, c.growth, c.backoff, c.interval);
    EXPECT_EQ(value_of(scale), static_cast<double>(static_cast<float>(c.want_scale)));
    EXPECT_EQ(tracker.cpu().item<int32_t>(), c.want_tracker);
    EXPECT_GT(scale.version(), vs);
    EXPECT_GT(tracker.version(), vt);
  }
}

TEST_P(AmpKernelTest, UpdateScaleSequenceAndErrors) {
  EMBER_REQUIRE_KERNEL(amp_update_scale_stub);
  const Tensor scale = one_f32(8.0, device());
  const Tensor tracker = zeros({1}, TensorOptions(DType::i32, device()));
  const Tensor clean = one_f32(0.0, device()), inf = one_f32(1.0, device());
  // interval 2: clean, clean (x2 -> 16), clean, inf (x0.5 -> 8, reset), clean, clean (-> 16)
  const std::vector<std::pair<bool, double>> seq = {{false, 8}, {false, 16}, {false, 16},
                                                    {true, 8},  {false, 8},  {false, 16}};
  for (const auto& [found, want] : seq) {
    ops::amp_update_scale_(scale, tracker, found ? inf : clean, 2.0, 0.5, 2);
    EXPECT_EQ(value_of(scale), want);
  }
  const TensorOptions f32(DType::f32, device());
  error_message<DTypeError>([&] {
    ops::amp_update_scale_(scale, zeros({1}, TensorOptions(DType::i64, device())), clean, 2.0, 0.5, 2);
  });
  error_message<DTypeError>([&] { ops::amp_update_scale_(ones({1}, TensorOptions(DType::f64, device())), tracker,
                                                         clean, 2.0, 0.5, 2); });
  error_message<ShapeError>([&] { ops::amp_update_scale_(ones({2}, f32), tracker, clean, 2.0, 0.5, 2); });
  error_message<ValueError>([&] { ops::amp_update_scale_(scale, tracker, clean, 2.0, 0.5, 0); });
  const Device other = device().is_cpu() ? Device::meta() : Device::cpu();
  error_message<DeviceError>([&] {
    ops::amp_update_scale_(scale, tracker, zeros({1}, TensorOptions(DType::f32, other)), 2.0, 0.5, 2);
  });
  EXPECT_EQ(value_of(scale), 16.0);  // the failed calls changed nothing
}

EMBER_INSTANTIATE_DEVICE_TESTS(AmpKernelTest);

}  // namespace
}  // namespace ember::testing
