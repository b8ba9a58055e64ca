// Printing tensors PyTorch-style: nested brackets, summarised with "..." past a size limit, then dtype and device.
// Invariant: printing never changes the tensor; integers print exactly, floats with 4 decimals.
#include <cmath>
#include <cstdio>
#include <sstream>
#include <type_traits>

#include "ember/core/tensor.h"

namespace ember {

namespace {

constexpr int64_t kEdgeItems = 3;

template <class V>
void print_rec(std::ostringstream& os, const std::vector<V>& v, const Shape& sizes, const Shape& strides,
               int64_t dim, int64_t base, bool summarize, bool integral, int indent) {
  if (dim == static_cast<int64_t>(sizes.size())) {
    char buf[48];
    const V x = v[static_cast<size_t>(base)];
    if constexpr (std::is_integral_v<V>) std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(x));
    else if (std::isnan(x)) std::snprintf(buf, sizeof buf, "nan");
    else if (std::isinf(x)) std::snprintf(buf, sizeof buf, x > 0 ? "inf" : "-inf");
    else std::snprintf(buf, sizeof buf, "%.4f", x);
    os << buf;
    return;
  }
  os << '[';
  const int64_t n = sizes[dim];
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
      os << "...";
      i = n - kEdgeItems - 1;
      os << (dim + 1 == static_cast<int64_t>(sizes.size()) ? ", " : ",\n" + std::string(indent + 1, ' '));
      continue;
    }
    print_rec(os, v, sizes, strides, dim + 1, base + i * strides[dim], summarize, integral, indent + 1);
    if (i + 1 < n) os << (dim + 1 == static_cast<int64_t>(sizes.size()) ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << ']';
}

}  // namespace

std::string to_string(const Tensor& t, int64_t max_elements) {
  if (!t.defined()) return "tensor(undefined)";
  std::ostringstream os;
  os << "tensor(";
  if (t.device().is_meta()) {
    os << "..., size=" << shape_str(t.sizes());
  } else {
    const Shape st = contiguous_strides(t.sizes());
    const bool summarize = t.numel() > max_elements;
    if (is_integral(t.dtype()))  // exact: i64 values above 2^53 do not survive a trip through double
      print_rec(os, t.to_vector<int64_t>(), t.sizes(), st, 0, 0, summarize, true, 7);
    else
      print_rec(os, t.to_vector<double>(), t.sizes(), st, 0, 0, summarize, false, 7);
  }
  os << ", dtype=" << dtype_name(t.dtype()) << ", device=" << t.device().str() << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << to_string(t); }

}  // namespace ember
