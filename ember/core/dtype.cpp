// DType names, sizes, parsing and promotion.
// Invariant: the tables here are the only place a DType's size and names are spelled out.
#include "ember/core/dtype.h"

#include <algorithm>

namespace ember {

int64_t itemsize(DType d) {
  switch (d) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::b8: return 1;
    case DType::i8: return 1;
    case DType::i16: return 2;
  }
  EMBER_THROW(DTypeError, "itemsize: invalid dtype value ", static_cast<int>(d));
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::b8: return "bool";
    case DType::i8: return "i8";
    case DType::i16: return "i16";
  }
  return "invalid";
}

DType parse_dtype(const std::string& s) {
  struct Name { const char* name; DType d; };
  static const Name names[] = {
      {"f32", DType::f32},  {"float32", DType::f32},  {"float", DType::f32},   {"f16", DType::f16},
      {"float16", DType::f16}, {"half", DType::f16},  {"bf16", DType::bf16},   {"bfloat16", DType::bf16},
      {"f64", DType::f64},  {"float64", DType::f64},  {"double", DType::f64},  {"i32", DType::i32},
      {"int32", DType::i32}, {"i64", DType::i64},     {"int64", DType::i64},   {"long", DType::i64},
      {"u8", DType::u8},    {"uint8", DType::u8},     {"bool", DType::b8},     {"b8", DType::b8},
      {"i8", DType::i8},    {"int8", DType::i8},      {"i16", DType::i16},     {"int16", DType::i16}};
  for (const auto& n : names)
    if (s == n.name) return n.d;
  EMBER_THROW(ConfigError, "unknown dtype '", s, "' (expected one of f32, f16, bf16, f64, i32, i64, u8, bool, i8, i16)");
}

bool is_floating(DType d) { return d == DType::f32 || d == DType::f64 || is_reduced_float(d); }
bool is_integral(DType d) { return !is_floating(d); }

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  auto rank = [](DType d) {
    switch (d) {
      case DType::b8: return 0;
      case DType::u8: return 1;
      case DType::i8: return 1;
      case DType::i16: return 2;
      case DType::i32: return 3;
      case DType::i64: return 4;
      case DType::f16: return 5;
      case DType::bf16: return 5;
      case DType::f32: return 6;
      case DType::f64: return 7;
    }
    return -1;
  };
  if ((a == DType::f16 && b == DType::bf16) || (a == DType::bf16 && b == DType::f16)) return DType::f32;
  if ((a == DType::u8 && b == DType::i8) || (a == DType::i8 && b == DType::u8)) return DType::i16;
  return rank(a) >= rank(b) ? a : b;
}

void throw_unsupported_dtype(const char* op, DType d) {
  EMBER_THROW(DTypeError, op, ": dtype ", dtype_name(d), " is not supported");
}

}  // namespace ember
