// Reduction front ends: sum, mean, amax, amin, var, argmax, argmin (PyTorch semantics).
// Invariant: the kernel always receives sorted, unique, non-empty dims and writes the keepdim-shaped output; the
// front end squeezes the reduced dims afterwards when keepdim is false.
#include <algorithm>

#include "ember/kernels/ops.h"

namespace ember {

EMBER_DEFINE_STUB(reduce, ReduceFn);

namespace ops {

namespace {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Mean: return "mean";
    case ReduceOp::Max: return "amax";
    case ReduceOp::Min: return "amin";
    case ReduceOp::Var: return "var";
    case ReduceOp::ArgMax: return "argmax";
    case ReduceOp::ArgMin: return "argmin";
  }
  return "reduce";
}

// Wraps and sorts dims; empty means every dim. Throws IndexError on out-of-range or repeated dims.
std::vector<int64_t> normalize_dims(const char* op, const Tensor& x, const std::vector<int64_t>& dims) {
  const int64_t nd = x.dim();
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < nd; ++d) out.push_back(d);
    return out;
  }
  std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(nd, 1)), false);
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, nd, op);
    EMBER_CHECK(!seen[static_cast<size_t>(w)], IndexError, op, ": dim ", w, " appears more than once in the dims ",
                shape_str(dims), " for ", x.description());
    seen[static_cast<size_t>(w)] = true;
    out.push_back(w);
  }
  std::sort(out.begin(), out.end());
  return out;
}

DType result_dtype(ReduceOp op, DType in) {
  switch (op) {
    case ReduceOp::Sum: return is_integral(in) ? DType::i64 : in;
    case ReduceOp::ArgMax:
    case ReduceOp::ArgMin: return DType::i64;
    default: return in;
  }
}

// Runs the kernel on x (rank >= 1) over `dims` (sorted, unique) and returns the keepdim-shaped result.
Tensor run_reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, int64_t correction) {
  const char* name = reduce_op_name(op);
  int64_t reduced = 1;
  Shape out_shape = x.sizes();
  for (int64_t d : dims) {
    reduced *= x.size(d);
    out_shape[static_cast<size_t>(d)] = 1;
  }
  const bool needs_elements = op == ReduceOp::Max || op == ReduceOp::Min || op == ReduceOp::Var ||
                              op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
  EMBER_CHECK(!(needs_elements && reduced == 0), ValueError, name, ": cannot reduce over an empty set of elements (",
              x.description(), ", dims ", shape_str(dims), ")");
  Tensor out = empty(out_shape, TensorOptions(result_dtype(op, x.dtype()), x.device()));
  if (out.numel() > 0) run_kernel(reduce_stub, x.device(), op, x, out, dims, correction);  // Note [Meta kernels]
  return out;
}

Tensor squeeze_dims(Tensor t, const std::vector<int64_t>& dims) {
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) t = t.squeeze(*it);
  return t;
}

Tensor reduce_front(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim,
                    int64_t correction = 0) {
  const char* name = reduce_op_name(op);
  if (op == ReduceOp::Mean || op == ReduceOp::Var) check_floating(name, x);
  const std::vector<int64_t> dims = normalize_dims(name, x, dims_in);
  if (x.dim() == 0) return run_reduce(op, x.view({1}), {0}, correction).view({});
  Tensor out = run_reduce(op, x, dims, correction);
  return keepdim ? out : squeeze_dims(out, dims);
}

Tensor arg_front(ReduceOp op, const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  const char* name = reduce_op_name(op);
  if (!dim.has_value()) {
    // Over the flattened tensor; keepdim gives every dim size 1.
    Tensor out = run_reduce(op, x.reshape({-1}), {0}, 0).view({});
    return keepdim ? out.view(Shape(static_cast<size_t>(x.dim()), 1)) : out;
  }
  const int64_t d = wrap_dim(*dim, x.dim(), name);
  if (x.dim() == 0) return run_reduce(op, x.view({1}), {0}, 0).view({});
  Tensor out = run_reduce(op, x, {d}, 0);
  return keepdim ? out : out.squeeze(d);
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_front(ReduceOp::Sum, x, dims, keepdim);
}
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_front(ReduceOp::Mean, x, dims, keepdim);
}
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_front(ReduceOp::Max, x, dims, keepdim);
}
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_front(ReduceOp::Min, x, dims, keepdim);
}
Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  EMBER_CHECK(correction >= 0, ValueError, "var: correction must be >= 0, got ", correction);
  return reduce_front(ReduceOp::Var, x, dims, keepdim, correction);
}
Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_front(ReduceOp::ArgMax, x, dim, keepdim);
}
Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_front(ReduceOp::ArgMin, x, dim, keepdim);
}

}  // namespace ops
}  // namespace ember
