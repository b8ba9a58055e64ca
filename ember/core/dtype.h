// Element types, their sizes and names, type promotion, and the dispatch macros that turn a runtime DType into a
// C++ scalar type. Invariant: every DType has exactly one C++ storage type and one compute ("op math") type.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "ember/base/error.h"
#include "ember/core/half.h"

namespace ember {

// i8 and i16 came last (quantized weights, narrow sparse indices): the values of the older ones never change.
enum class DType : int8_t { f32, f16, bf16, f64, i32, i64, u8, b8, i8, i16 };
inline constexpr int kNumDTypes = 10;

int64_t itemsize(DType d);
const char* dtype_name(DType d);  // "f32", "f16", "bf16", "f64", "i32", "i64", "u8", "bool", "i8", "i16"
DType parse_dtype(const std::string& s);  // accepts the names above and float32/float16/bfloat16/... ; ConfigError
bool is_floating(DType d);
// f16 or bf16: the 16-bit floating dtypes, stored in 16 bits and computed in f32 (PyTorch's "reduced floating").
constexpr bool is_reduced_float(DType d) { return d == DType::f16 || d == DType::bf16; }
bool is_integral(DType d);  // integers and bool
// The dtype a binary op between a and b computes in (PyTorch's lattice: bool < u8, i8 < i16 < i32 < i64 < f16/bf16 <
// f32 < f64; u8 with i8 gives i16, f16 with bf16 gives f32).
DType promote_types(DType a, DType b);
inline std::ostream& operator<<(std::ostream& os, DType d) { return os << dtype_name(d); }

// C++ type of each DType.
template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::i8; };
template <> struct dtype_of<int16_t> { static constexpr DType value = DType::i16; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::b8; };
template <class T> inline constexpr DType dtype_of_v = dtype_of<T>::value;

// The type element math runs in: f16/bf16 compute in float (DESIGN.md §5).
template <class T> struct op_math { using type = T; };
template <> struct op_math<Half> { using type = float; };
template <> struct op_math<BFloat16> { using type = float; };
template <class T> using op_math_t = typename op_math<T>::type;

[[noreturn]] void throw_unsupported_dtype(const char* op, DType d);

}  // namespace ember

#define EMBER_DTYPE_CASE(enumv, T, ...) \
  case ::ember::DType::enumv: {         \
    using scalar_t = T;                 \
    return __VA_ARGS__();               \
  }

// EMBER_DISPATCH_FLOAT(dtype, "op", [&] { ... scalar_t ... }): f32, f64, f16, bf16.
#define EMBER_DISPATCH_FLOAT(DT, NAME, ...)                      \
  [&] {                                                          \
    switch (DT) {                                                \
      EMBER_DTYPE_CASE(f32, float, __VA_ARGS__)                  \
      EMBER_DTYPE_CASE(f64, double, __VA_ARGS__)                 \
      EMBER_DTYPE_CASE(f16, ::ember::Half, __VA_ARGS__)          \
      EMBER_DTYPE_CASE(bf16, ::ember::BFloat16, __VA_ARGS__)     \
      default: ::ember::throw_unsupported_dtype(NAME, DT);       \
    }                                                            \
  }()

// Integer index types (embedding indices, argmax results).
#define EMBER_DISPATCH_INDEX(DT, NAME, ...)                      \
  [&] {                                                          \
    switch (DT) {                                                \
      EMBER_DTYPE_CASE(i32, int32_t, __VA_ARGS__)                \
      EMBER_DTYPE_CASE(i64, int64_t, __VA_ARGS__)                \
      default: ::ember::throw_unsupported_dtype(NAME, DT);       \
    }                                                            \
  }()

// Every dtype.
#define EMBER_DISPATCH_ALL(DT, NAME, ...)                        \
  [&] {                                                          \
    switch (DT) {                                                \
      EMBER_DTYPE_CASE(f32, float, __VA_ARGS__)                  \
      EMBER_DTYPE_CASE(f64, double, __VA_ARGS__)                 \
      EMBER_DTYPE_CASE(f16, ::ember::Half, __VA_ARGS__)          \
      EMBER_DTYPE_CASE(bf16, ::ember::BFloat16, __VA_ARGS__)     \
      EMBER_DTYPE_CASE(i32, int32_t, __VA_ARGS__)                \
      EMBER_DTYPE_CASE(i64, int64_t, __VA_ARGS__)                \
      EMBER_DTYPE_CASE(u8, uint8_t, __VA_ARGS__)                 \
      EMBER_DTYPE_CASE(b8, bool, __VA_ARGS__)                    \
      EMBER_DTYPE_CASE(i8, int8_t, __VA_ARGS__)                  \
      EMBER_DTYPE_CASE(i16, int16_t, __VA_ARGS__)                \
      default: ::ember::throw_unsupported_dtype(NAME, DT);       \
    }                                                            \
  }()
