// Softmax, log-softmax and layer-norm front ends.
// Invariant: layer norm reaches the kernel as x [rows, cols] (cols = the normalised trailing dims), weight/bias
// [cols] or undefined, and fresh contiguous out [rows, cols] and mean/rstd [rows] (f32, or f64 for f64 input); out
// has weight's dtype, which is x's or f32 for an f16/bf16 x (Note [Mixed layer norm]).
#include "ember/kernels/ops.h"

namespace ember {

EMBER_DEFINE_STUB(softmax, SoftmaxFn);
EMBER_DEFINE_STUB(layer_norm, LayerNormFn);

namespace ops {

namespace {

Tensor softmax_front(const char* op, const Tensor& x, int64_t dim, bool log) {
  check_floating(op, x);
  const int64_t d = wrap_dim(dim, x.dim(), op);
  if (x.dim() == 0) return softmax_front(op, x.view({1}), 0, log).view({});
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype(), x.device()));
  if (out.numel() > 0 && !x.device().is_meta()) softmax_stub.get(x.device().type)(x, out, d, log);
  return out;
}

// Note [Mixed layer norm]
// weight and bias have x's dtype — or, for an f16/bf16 x, both may be f32: the mixed form, whose output is f32 (the
// statistics and arithmetic are f32 either way). Autocast runs layer norm in this form (autograd/autocast.h), so
// the f16/bf16 input is what backward keeps, not an f32 copy of it; the result equals layer norm of x cast to f32.
DType affine_dtype(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const Tensor& p = weight.defined() ? weight : bias;
  if (!p.defined()) return x.dtype();
  const bool mixed = (x.dtype() == DType::f16 || x.dtype() == DType::bf16) && p.dtype() == DType::f32;
  return mixed ? DType::f32 : x.dtype();
}

void check_affine(const char* what, const Tensor& p, const Tensor& x, const Shape& normalized_shape, DType want) {
  if (!p.defined()) return;
  EMBER_CHECK(p.sizes() == normalized_shape, ShapeError, "layer_norm: ", what, " must have the normalized shape ",
              shape_str(normalized_shape), ", got ", p.description());
  EMBER_CHECK(p.dtype() == want, DTypeError, "layer_norm: ", what, " dtype must match the input (or, for an f16/bf16 "
              "input, be f32 together with the other affine parameter), got ", p.description(), " and input ",
              x.description());
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_front("softmax", x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_front("log_softmax", x, dim, true); }

LayerNormResult layer_norm_with_stats(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                                      const Tensor& bias, double eps) {
  const Device device = common_device("layer_norm", {&x, &weight, &bias});
  check_floating("layer_norm", x);
  const int64_t n = static_cast<int64_t>(normalized_shape.size());
  const int64_t lead = x.dim() - n;
  bool matches = lead >= 0;
  for (int64_t i = 0; matches && i < n; ++i) matches = x.size(lead + i) == normalized_shape[static_cast<size_t>(i)];
  EMBER_CHECK(matches, ShapeError, "layer_norm: normalized_shape ", shape_str(normalized_shape),
              " does not match the trailing dims of the input ", x.description());
  const DType out_dtype = affine_dtype(x, weight, bias);  // Note [Mixed layer norm]
  check_affine("weight", weight, x, normalized_shape, out_dtype);
  check_affine("bias", bias, x, normalized_shape, out_dtype);

  const Shape stats_shape(x.sizes().begin(), x.sizes().begin() + lead);
  const int64_t rows = numel_of(stats_shape), cols = numel_of(normalized_shape);
  const DType stats_dtype = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = empty({rows, cols}, TensorOptions(out_dtype, device));
  Tensor mean = empty({rows}, TensorOptions(stats_dtype, device));
  Tensor rstd = empty({rows}, TensorOptions(stats_dtype, device));
  if (rows > 0) {
    // Reshaped on meta too: a strided input's copy is memory a dry run must see (Note [Meta kernels] in stubs.h).
    const Tensor w = weight.defined() ? weight.reshape({cols}) : Tensor();
    const Tensor b = bias.defined() ? bias.reshape({cols}) : Tensor();
    run_kernel(layer_norm_stub, device, x.reshape({rows, cols}), w, b, eps, out, mean, rstd);
  }
  return {out.view(x.sizes()), mean.view(stats_shape), rstd.view(stats_shape)};
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  return layer_norm_with_stats(x, normalized_shape, weight, bias, eps).out;
}

}  // namespace ops
}  // namespace ember
