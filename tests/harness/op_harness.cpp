// Op test harness implementation (see op_harness.h): seeded inputs, stride-preserving dtype/device conversion, and
// the comparison loop. Invariant: the reference always sees exactly the (rounded) values the op under test sees.
#include "tests/harness/op_harness.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>

namespace ember::testing {

uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("EMBER_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : 20261121ull;
    std::printf("[ember] test seed %llu (set EMBER_TEST_SEED to change it)\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

uint64_t next_seed() {
  static thread_local std::string last_test;
  static thread_local uint64_t counter = 0;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string test = info ? std::string(info->test_suite_name()) + "." + info->name() : "none";
  if (test != last_test) {  // every test (each device instance too) starts its count afresh
    last_test = test;
    counter = 0;
  }
  // The device instance must not change the inputs: strip its prefix (cpu/, cuda/), and read the cuda instance's
  // parameter name (".../cuda") as the cpu instance's (".../cpu"), so both draw the cpu instance's inputs.
  std::string name = test;
  if (auto slash = name.find('/'); slash != std::string::npos) {
    const std::string instance = name.substr(0, slash);
    name = name.substr(slash + 1);
    if (instance == "cuda" && name.ends_with("/cuda")) name.replace(name.size() - 4, 4, "cpu");
  }
  return test_seed() ^ (std::hash<std::string>{}(name) * 0x9E3779B97F4A7C15ull) ^ (++counter * 0xBF58476D1CE4E5B9ull);
}

Tensor rand_input_seeded(const Shape& shape, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(numel_of(shape)));
  for (double& x : v) x = dist(rng);
  return from_vector(v, shape);
}

Tensor rand_input(const Shape& shape, double lo, double hi) { return rand_input_seeded(shape, next_seed(), lo, hi); }

Tensor rand_indices(const Shape& shape, int64_t n) {
  std::mt19937_64 rng(next_seed());
  std::uniform_int_distribution<int64_t> dist(0, n - 1);
  std::vector<int64_t> v(static_cast<size_t>(numel_of(shape)));
  for (int64_t& x : v) x = dist(rng);
  return from_vector(v, shape);
}

Tensor noncontiguous_input(const Shape& shape, double lo, double hi) {
  // Allocate the reversed shape with every dim doubled, take every other element, then permute back.
  Shape big(shape.rbegin(), shape.rend());
  for (int64_t& d : big) d *= 2;
  Tensor t = rand_input(big, lo, hi);
  for (int64_t d = 0; d < t.dim(); ++d) t = t.slice(d, 0, t.size(d), 2);
  std::vector<int64_t> perm(shape.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(perm.size() - 1 - i);
  return t.permute(perm);
}

Tolerance default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64: return {1e-12, 1e-12};
    case DType::f32: return {1e-5, 1e-6};
    case DType::f16: return {1e-2, 1e-3};
    case DType::bf16: return {2e-2, 1e-2};
    default: return {0.0, 0.0};
  }
}

::testing::AssertionResult allclose(const Tensor& actual, const Tensor& expected, Tolerance tol) {
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << "shape " << shape_str(actual.sizes()) << " != expected "
                                         << shape_str(expected.sizes());
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  int64_t bad = 0, first_bad = -1;
  double worst = 0.0, err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = e[i];
    bool ok;
    if (std::isnan(y)) ok = std::isnan(x);
    else if (std::isinf(y)) ok = x == y;
    else {
      const double d = std::fabs(x - y);
      ok = d <= tol.atol + tol.rtol * std::fabs(y);  // false for NaN x
      if (std::isfinite(d)) {
        err2 += d * d;
        ref2 += y * y;
      }
      if (std::isfinite(d) && d > worst) worst = d;
    }
    if (!ok) {
      if (first_bad < 0) first_bad = static_cast<int64_t>(i);
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os << bad << " of " << a.size() << " elements differ (rtol " << tol.rtol << ", atol " << tol.atol
     << "); first at flat index " << first_bad << ": got " << a[first_bad] << ", expected " << e[first_bad]
     << "; max abs diff " << worst << "; normalised error " << (ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2));
  return ::testing::AssertionFailure() << os.str();
}

namespace {
bool kept(const OpCase& c, size_t i) {
  for (size_t k : c.keep_dtype_inputs)
    if (k == i) return true;
  return false;
}
}  // namespace

// Converts t to (dtype, device) keeping its exact sizes and strides, so non-contiguous and broadcast (stride 0)
// inputs reach the kernel under test in every dtype and on every device, not only in f64 on the CPU.
Tensor convert_keep_strides(const Tensor& t, DType dtype, Device device) {
  if (t.dtype() == dtype && t.device() == device) return t;
  // Broadcast dims (stride 0) are converted at size 1 and expanded again, since a destination cannot hold
  // several elements in one place.
  Tensor compact = t;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.strides()[d] == 0 && t.sizes()[d] > 1) compact = compact.narrow(d, 0, 1);
  Tensor out = empty_strided(compact.sizes(), compact.strides(), {dtype, device});
  out.copy_(compact);
  return out.expand(t.sizes());
}

namespace {
Inputs convert_inputs(const OpCase& c, DType dtype, Device device) {
  Inputs out;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.inputs[i];
    if (!t.defined()) {
      out.push_back(t);
      continue;
    }
    const DType target = kept(c, i) || !is_floating(t.dtype()) ? t.dtype() : dtype;
    out.push_back(convert_keep_strides(t, target, device));
  }
  return out;
}
}  // namespace

void check_op(const OpCase& c, Device device) {
  SCOPED_TRACE("op " + c.name + " on " + device.str() + " (seed " + std::to_string(test_seed()) + ")");
  const OpFn& ref_fn = c.reference ? c.reference : c.fn;
  std::vector<DType> dtypes = c.dtypes;
  if (c.check_f64_against_reference && c.reference) dtypes.insert(dtypes.begin(), DType::f64);
  for (DType dt : dtypes) {
    SCOPED_TRACE(std::string("dtype ") + dtype_name(dt));
    // The reference sees the inputs exactly as the op does: rounded to dt, then widened to f64 on the CPU.
    Inputs rounded = convert_inputs(c, dt, Device::cpu());
    for (size_t i = 0; i < rounded.size(); ++i)
      if (rounded[i].defined() && !kept(c, i) && is_floating(rounded[i].dtype()))
        rounded[i] = convert_keep_strides(rounded[i], DType::f64, Device::cpu());
    const Tensor expected = ref_fn(rounded);
    const Tensor actual = c.fn(convert_inputs(c, dt, device));
    ASSERT_TRUE(actual.defined());
    EXPECT_EQ(actual.device(), device);
    if (is_floating(actual.dtype())) EXPECT_EQ(actual.dtype(), dt) << "result dtype";
    EXPECT_TRUE(allclose(actual, expected, c.tolerance(dt)));
  }
}

void DeviceTest::SetUp() {
  if (GetParam().is_cuda() && !memory::cuda::is_available()) GTEST_SKIP() << "no CUDA device on this machine";
}

std::string device_param_name(const ::testing::TestParamInfo<Device>& info) {
  return device_type_name(info.param.type);
}

}  // namespace ember::testing
