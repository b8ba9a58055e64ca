// A number passed to an op (fill value, clamp bound, scalar operand): integers are kept exact as int64, floating
// values as double. Invariant: exactly one representation is authoritative (is_integral() says which); the other
// is derived on request, so NaN/inf never go through an undefined float->int conversion.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace ember {

class Scalar {
 public:
  Scalar() = default;
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T v) : d_(static_cast<double>(v)), is_int_(false) {}
  template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
  Scalar(T v) : i_(static_cast<int64_t>(v)), is_int_(true) {}

  double to_double() const { return is_int_ ? static_cast<double>(i_) : d_; }
  // Integers as they are; floating values truncated toward zero and saturated to int64 (NaN -> 0).
  int64_t to_int() const {
    if (is_int_) return i_;
    if (std::isnan(d_)) return 0;
    if (d_ >= 9223372036854775807.0) return INT64_MAX;
    if (d_ <= -9223372036854775808.0) return INT64_MIN;
    return static_cast<int64_t>(d_);
  }
  bool is_integral() const { return is_int_; }

 private:
  double d_ = 0.0;
  int64_t i_ = 0;
  bool is_int_ = false;
};

}  // namespace ember
