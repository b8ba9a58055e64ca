// Gradient checks (DESIGN.md §3): an op's autograd gradients against central finite differences in float64, with
// the inputs' strides kept (non-contiguous and broadcast inputs reach the backward formulas as they are), then the
// same backward in f32/f16/bf16 against the float64 gradients.
//
//   GradCase c{"mul", {rand_input({3, 4}), noncontiguous_input({4})},
//              [](const Inputs& in) { return mul(in[0], in[1]); }};
//   check_grad(c, device());
#pragma once

#include <string>
#include <vector>

#include "tests/harness/op_harness.h"

namespace ember::testing {

struct GradCase {
  std::string name;
  Inputs inputs;  // f64 CPU; index/mask inputs (integer, bool) are passed through and never differentiated
  OpFn fn;        // must return one floating tensor
  // Inputs to differentiate (default: every floating input).
  std::vector<size_t> wrt = {};
  double eps = 1e-6;
  Tolerance tolerance = {1e-5, 1e-7};  // analytic vs finite differences, f64
  // Lower-precision runs of the same backward, compared with the f64 analytic gradients.
  std::vector<DType> dtypes = {DType::f32};
  std::function<Tolerance(DType)> dtype_tolerance = nullptr;  // default: f32 1e-4/1e-5, f16 2e-2, bf16 5e-2
};

// For every differentiated input x_i: autograd's d<v, fn(x)>/dx_i (v a seeded random weight of fn's output shape)
// against (<v, fn(x + eps e_j)> - <v, fn(x - eps e_j)>) / 2eps for every element j, in f64 on `device`; then for
// each of c.dtypes, the autograd gradient with the inputs rounded to that dtype against the f64 gradient.
void check_grad(const GradCase& c, Device device);

}  // namespace ember::testing
