// Shape helpers: element counts, strides, broadcasting, dim wrapping.
// Invariant: element counts and extents are checked against int64 overflow; a ShapeError names the shape.
#include "ember/core/shape.h"

#include <sstream>

#include "ember/base/error.h"

namespace ember {

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    EMBER_CHECK(!__builtin_mul_overflow(n, d, &n), ShapeError, "shape ", shape_str(s),
                " has more elements than int64 can count");
  }
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    // The outermost stride never needs the product past it; only a product that is used must fit in int64.
    if (i > 0)
      EMBER_CHECK(!__builtin_mul_overflow(acc, s[i] > 1 ? s[i] : 1, &acc), ShapeError, "shape ", shape_str(s),
                  " has more elements than int64 can count");
  }
  return st;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t n = ndim == 0 ? 1 : ndim;  // a 0-d tensor accepts dim 0 / -1 like PyTorch
  EMBER_CHECK(dim >= -n && dim < n, IndexError, op, ": dim ", dim, " is out of range for a tensor with ", ndim,
              " dimension(s)");
  return dim < 0 ? dim + n : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    EMBER_CHECK(da == db || da == 1 || db == 1, ShapeError, op, ": shapes ", shape_str(a), " and ", shape_str(b),
                " do not broadcast (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

void check_sizes(const Shape& s, const char* op) {
  for (int64_t d : s) EMBER_CHECK(d >= 0, ShapeError, op, ": negative size in shape ", shape_str(s));
}

}  // namespace ember
