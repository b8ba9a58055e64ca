// Small helpers shared by the autograd engine tests: f64 CPU tensors from literal values, element access, and
// "this call raises E whose message contains ..." checks. References in these tests are hand-computed values.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ember/ember.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {

// A CPU tensor holding `values` (row-major) with shape `shape` (default: 1-d), in `dtype`.
inline Tensor vals(const std::vector<double>& values, Shape shape = {}, DType dtype = DType::f64) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  return from_vector(values, shape).to(dtype);
}

inline std::vector<double> elems(const Tensor& t) { return t.detach().to_vector<double>(); }

// Every element of t equals expected[i] within tol (and the element counts match).
inline ::testing::AssertionResult values_near(const Tensor& t, const std::vector<double>& expected,
                                              double tol = 1e-12) {
  if (!t.defined()) return ::testing::AssertionFailure() << "tensor is undefined";
  const std::vector<double> got = elems(t);
  if (got.size() != expected.size())
    return ::testing::AssertionFailure() << "got " << got.size() << " elements, expected " << expected.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = got[i] - expected[i];
    if (!(d <= tol && -d <= tol))
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", expected " << expected[i];
  }
  return ::testing::AssertionSuccess();
}


inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace ember::testing
