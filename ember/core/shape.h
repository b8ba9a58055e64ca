// Shapes and strides (in elements, int64_t everywhere), broadcasting rules and dim wrapping.
// Invariant: a contiguous (row-major) tensor of shape s has strides contiguous_strides(s).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

namespace ember {

using Shape = std::vector<int64_t>;

int64_t numel_of(const Shape& s);
Shape contiguous_strides(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3]"
// Wraps a possibly negative dim into [0, ndim); throws IndexError naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// NumPy/PyTorch broadcasting of two shapes; throws ShapeError naming `op` when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Checks that every size is >= 0; throws ShapeError naming `op`.
void check_sizes(const Shape& s, const char* op);

}  // namespace ember
