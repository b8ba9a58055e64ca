// The one element cast of ember (Note [Casts]), shared by the CPU loops and the CUDA kernels (EMBER_HD), plus the
// fill-value conversion and the rounding rule of uniform draws that both devices use.
// Invariant: every (From, To) pair has defined, device-independent semantics; no C++ undefined conversion is reached.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "ember/base/host_device.h"
#include "ember/core/dtype.h"
#include "ember/core/scalar.h"

namespace ember::kernels {

// Note [Casts]
// convert<To>(v) is ember's cast between element types. C++ leaves float -> integer undefined for NaN and for values
// out of the target's range (x86 then yields INT_MIN, CUDA saturates), and PyTorch leaves it undefined too; ember
// defines it, identically on every device:
//   * floating -> integer: NaN gives 0; otherwise the value is truncated toward zero and saturated to the target's
//     range (3e9 -> i32 is 2147483647, -inf -> i64 is INT64_MIN, 255.9 -> u8 is 255, -1.5 -> u8 is 0);
//   * integer (or bool) -> integer: wraps modulo 2^bits (two's complement, computed through the unsigned type), so
//     i32 -1 -> u8 is 255 and i32 300 -> u8 is 44;
//   * anything -> bool: x != 0 (NaN is true);
//   * -> f16/bf16: the value is first converted to float, then rounded to nearest even; so f64 -> f16 rounds twice
//     (f64 -> f32 -> f16), and i64 -> f16 goes through f32 as well;
//   * f16/bf16 -> anything: through float (exact);
//   * between f32 and f64 and from integers to floating types: IEEE round to nearest (f64 beyond f32's range -> inf).
// The CUDA cast kernel loads floating sources as double and integer sources as int64 and calls convert from there;
// both are exact, and every rule above gives the same result from the widened value.

namespace detail {

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// Floating -> integer with NaN -> 0, truncation and saturation (Note [Casts]). F is float or double.
template <class To, class F>
EMBER_HD_INLINE To float_to_integer(F v) {
  constexpr To tmax = std::numeric_limits<To>::max(), tmin = std::numeric_limits<To>::lowest();
  // 2^digits is the first value above To's range; a power of two, so exact in F.
  constexpr F upper = static_cast<F>(static_cast<uint64_t>(1) << std::numeric_limits<To>::digits);
  if (v != v) return To(0);
  if (v >= upper) return tmax;
  if constexpr (std::is_signed_v<To>) {
    if (v <= -upper) return tmin;  // -2^digits is To's minimum itself
  } else {
    if (v <= F(-1)) return To(0);  // (-1, 0) truncates to 0, which is in range
  }
  return static_cast<To>(v);  // truncation toward zero; the truncated value is in range here
}

}  // namespace detail

template <class To, class From>
EMBER_HD_INLINE To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (detail::is_half_v<From>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (detail::is_half_v<To>) {
    return To(static_cast<float>(v));
  } else if constexpr (std::is_floating_point_v<To>) {
    return static_cast<To>(v);
  } else if constexpr (std::is_floating_point_v<From>) {
    return detail::float_to_integer<To>(v);
  } else {
    static_assert(std::is_integral_v<To> && std::is_integral_v<From>, "convert: unsupported element types");
    return static_cast<To>(static_cast<std::make_unsigned_t<To>>(v));  // wraps modulo 2^bits
  }
}

// The value of a fill (or any Scalar argument) in element type T: integer Scalars convert from int64 (exact, then
// wrapping), floating ones from double (Note [Casts]). Host only.
template <class T>
inline T convert_scalar(const Scalar& s) {
  return s.is_integral() ? convert<T>(s.to_int()) : convert<T>(s.to_double());
}

// Note [Uniform upper bound]: a uniform draw v = low + (high - low) * u with u in [0, 1) can still round to `high`,
// in the op math type or when stored (in bf16 about 2^-9 of the draws in [0, 1) would be 1). As in PyTorch, a value
// that rounds to high (high > low) is replaced by low, so draws always lie in [low, high) of the stored dtype.
template <class T>
EMBER_HD_INLINE T uniform_store(op_math_t<T> v, op_math_t<T> low, op_math_t<T> high) {
  using acc_t = op_math_t<T>;
  const T r = convert<T>(v);
  const bool at_high = convert<acc_t>(r) == convert<acc_t>(convert<T>(high));
  return at_high && high > low ? convert<T>(low) : r;
}

}  // namespace ember::kernels
