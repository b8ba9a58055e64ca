// The op test harness (DESIGN.md §3): random inputs with a printed seed, comparison of every dtype and device
// against a float64 CPU reference with per-dtype tolerances, and device-parameterised fixtures whose cuda instances
// skip cleanly when no GPU (or no CUDA kernel for the op) exists.
//
// Typical use:
//   class SoftmaxTest : public ember::testing::DeviceTest {};
//   TEST_P(SoftmaxTest, MatchesReference) {
//     EMBER_REQUIRE_KERNEL(softmax_stub);
//     OpCase c{"softmax", {rand_input({4, 7})}, [](const Inputs& in) { return softmax(in[0], -1); }};
//     c.reference = [](const Inputs& in) { ...naive float64 loops... };
//     check_op(c, device());
//   }
//   EMBER_INSTANTIATE_DEVICE_TESTS(SoftmaxTest);
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ember/ember.h"

namespace ember::testing {

using Inputs = std::vector<Tensor>;
using OpFn = std::function<Tensor(const Inputs&)>;

// Seed for randomised tests: EMBER_TEST_SEED from the environment, else a fixed default. Printed once per process.
uint64_t test_seed();
// A fresh seed for one input: mixes test_seed() with the current test's name and a counter (printed on failure).
uint64_t next_seed();

// f64 CPU tensor with values uniform in [lo, hi), drawn from std::mt19937_64 (independent of ember's own RNG).
Tensor rand_input(const Shape& shape, double lo = -1.0, double hi = 1.0);
Tensor rand_input_seeded(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0);
// i64 CPU tensor with values uniform in [0, n).
Tensor rand_indices(const Shape& shape, int64_t n);
// Builds a non-contiguous f64 CPU view with the given shape: a transposed/strided slice of a bigger buffer.
Tensor noncontiguous_input(const Shape& shape, double lo = -1.0, double hi = 1.0);

// t converted to (dtype, device) with its sizes and strides kept (broadcast dims stay stride 0).
Tensor convert_keep_strides(const Tensor& t, DType dtype, Device device);

struct Tolerance {
  double rtol = 0.0, atol = 0.0;
};
// Elementwise tolerances per dtype: f64 1e-12, f32 1e-5, f16 1e-2 (relative) / 1e-3, bf16 2e-2 / 1e-2.
Tolerance default_tolerance(DType dtype);

// |actual - expected| <= atol + rtol * |expected| everywhere (NaN matches NaN, inf matches inf of the same sign),
// shapes equal. `actual` may be any dtype and device; `expected` is converted to f64.
::testing::AssertionResult allclose(const Tensor& actual, const Tensor& expected, Tolerance tol);

struct OpCase {
  std::string name;
  Inputs inputs;  // f64 CPU (integer tensors such as indices are passed through unconverted)
  OpFn fn;        // the op under test
  // The float64 reference. Defaults to fn on f64 CPU inputs; give an independent one (naive loops,
  // hand-computed values) wherever possible.
  OpFn reference;
  std::vector<DType> dtypes = {DType::f32, DType::f16, DType::bf16};
  std::function<Tolerance(DType)> tolerance = default_tolerance;
  // Inputs that stay as they are (index tensors, masks); the rest are converted to the dtype under test.
  std::vector<size_t> keep_dtype_inputs = {};
  bool check_f64_against_reference = true;  // also checks fn(f64 inputs) on the device against the reference
};

// For each dtype: inputs are rounded to that dtype, moved to `device`, fn is run, and the result (moved back, as
// f64) is compared with reference(rounded inputs as f64). Allocations are poisoned with NaN bytes in every test
// binary (test_main.cpp), so output elements a kernel leaves unwritten fail the comparison.
void check_op(const OpCase& c, Device device);

// Runs f, expects an exception of type E, and returns its message ("" and a test failure otherwise).
template <class E, class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected another exception type, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an exception, none was thrown";
  return "";
}

// Device-parameterised fixture: GetParam() is the device; cuda instances skip without a GPU.
class DeviceTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override;
  Device device() const { return GetParam(); }
};

std::string device_param_name(const ::testing::TestParamInfo<Device>& info);

// Sets the CPU kernels' thread count for a scope and restores the previous one (core/parallel.h).
class ScopedNumThreads {
 public:
  explicit ScopedNumThreads(int n) : prev_(get_num_threads()) { set_num_threads(n); }
  ~ScopedNumThreads() { set_num_threads(prev_); }
  ScopedNumThreads(const ScopedNumThreads&) = delete;
  ScopedNumThreads& operator=(const ScopedNumThreads&) = delete;

 private:
  int prev_;
};

}  // namespace ember::testing

#define EMBER_INSTANTIATE_DEVICE_TESTS(Fixture)                                                                     \
  INSTANTIATE_TEST_SUITE_P(cpu, Fixture, ::testing::Values(::ember::Device::cpu()),                                \
                           ::ember::testing::device_param_name);                                                   \
  INSTANTIATE_TEST_SUITE_P(cuda, Fixture, ::testing::Values(::ember::Device::cuda(0)),                             \
                           ::ember::testing::device_param_name)

// Skips the current device test when the op's stub has no kernel for this device (CUDA kernels not written yet).
#define EMBER_REQUIRE_KERNEL(stub)                                                                       \
  do {                                                                                                   \
    if (!::ember::stub.has(device().type))                                                               \
      GTEST_SKIP() << #stub << " has no " << ::ember::device_type_name(device().type) << " kernel yet";  \
  } while (0)

#define EMBER_SKIP_WITHOUT_CUDA()                                                                    \
  do {                                                                                               \
    if (!::ember::memory::cuda::is_available()) GTEST_SKIP() << "no CUDA device on this machine";    \
  } while (0)
