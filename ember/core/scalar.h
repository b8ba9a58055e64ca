// A number passed to an op (fill value, clamp bound, scalar operand): keeps integers exact and floats as double.
#pragma once

#include <cstdint>
#include <type_traits>

namespace ember {

class Scalar {
 public:
  Scalar() = default;
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T v) : d_(static_cast<double>(v)), i_(static_cast<int64_t>(v)), is_int_(false) {}
  template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
  Scalar(T v) : d_(static_cast<double>(v)), i_(static_cast<int64_t>(v)), is_int_(true) {}

  double to_double() const { return d_; }
  int64_t to_int() const { return is_int_ ? i_ : static_cast<int64_t>(d_); }
  bool is_integral() const { return is_int_; }

 private:
  double d_ = 0.0;
  int64_t i_ = 0;
  bool is_int_ = false;
};

}  // namespace ember
