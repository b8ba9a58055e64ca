// Softmax, log-softmax and layer-norm front ends.
// Invariant: layer norm reaches the kernel as x [rows, cols] (cols = the normalised trailing dims), weight/bias
// [cols] or undefined, and fresh contiguous out [rows, cols] and mean/rstd [rows] (f32, or f64 for f64 input); out
// has weight's dtype, which is x's or f32 for an f16/bf16 x (Note [Mixed layer norm]).
#include "ember/kernels/ops.h"

namespace ember {

EMBER_DEFINE_STUB(softmax, SoftmaxFn);
EMBER_DEFINE_STUB(layer_norm, LayerNormFn);
EMBER_DEFINE_STUB(layer_norm_backward, LayerNormBackwardFn);
EMBER_DEFINE_STUB(add_layer_norm, AddLayerNormFn);

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
  const bool mixed = is_reduced_float(x.dtype()) && p.dtype() == DType::f32;
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


// Layer norm of x, or with `residual` of x + residual (add_layer_norm, whose caller checked the pair): the common
// checks, allocation and kernel call.
AddLayerNormResult layer_norm_front(const char* op, const Tensor& x, const Tensor* residual,
                                    const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                                    double eps) {
  const Device device = common_device(op, {&x, residual, &weight, &bias});
  check_floating(op, x);
  const int64_t n = static_cast<int64_t>(normalized_shape.size());
  const int64_t lead = x.dim() - n;
  bool matches = lead >= 0;
  for (int64_t i = 0; matches && i < n; ++i) matches = x.size(lead + i) == normalized_shape[static_cast<size_t>(i)];
  EMBER_CHECK(matches, ShapeError, op, ": normalized_shape ", shape_str(normalized_shape),
              " does not match the trailing dims of the input ", x.description());
  const DType out_dtype = affine_dtype(x, weight, bias);  // Note [Mixed layer norm]
  check_affine("weight", weight, x, normalized_shape, out_dtype);
  check_affine("bias", bias, x, normalized_shape, out_dtype);

  const Shape stats_shape(x.sizes().begin(), x.sizes().begin() + lead);
  const int64_t rows = numel_of(stats_shape), cols = numel_of(normalized_shape);
  const DType stats_dtype = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor sum = residual ? empty({rows, cols}, TensorOptions(x.dtype(), device)) : Tensor();
  Tensor out = empty({rows, cols}, TensorOptions(out_dtype, device));
  Tensor mean = empty({rows}, TensorOptions(stats_dtype, device));
  Tensor rstd = empty({rows}, TensorOptions(stats_dtype, device));
  if (rows > 0) {
    // Reshaped on meta too: a strided input's copy is memory a dry run must see (Note [Meta kernels] in stubs.h).
    const Tensor w = weight.defined() ? weight.reshape({cols}) : Tensor();
    const Tensor b = bias.defined() ? bias.reshape({cols}) : Tensor();
    if (residual)
      run_kernel(add_layer_norm_stub, device, x.reshape({rows, cols}), residual->reshape({rows, cols}), w, b, eps, sum,
                 out, mean, rstd);
    else
      run_kernel(layer_norm_stub, device, x.reshape({rows, cols}), w, b, eps, out, mean, rstd);
  }
  return {residual ? sum.view(x.sizes()) : Tensor(), out.view(x.sizes()), mean.view(stats_shape),
          rstd.view(stats_shape)};
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_front("softmax", x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_front("log_softmax", x, dim, true); }

LayerNormResult layer_norm_with_stats(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                                      const Tensor& bias, double eps) {
  AddLayerNormResult r = layer_norm_front("layer_norm", x, nullptr, normalized_shape, weight, bias, eps);
  return {r.out, r.mean, r.rstd};
}

// Note [Residual add and layer norm]
// A pre-norm transformer block adds each sub-layer's output to the residual stream and normalises the sum for the next
// sub-layer: h = x + attn(ln_1(x)), then ln_2(h). add_layer_norm does both in one kernel: each row of x and residual
// is read once, the sum is written (it is the residual stream) and normalised from the values just computed rather
// than read back from memory (CUDA: registers or shared memory; CPU: the row just written, still in cache). The sum is
// rounded to the dtype first and the statistics are those of the rounded sum, so the results are those of ops::add
// followed by layer_norm_with_stats (bitwise on the CPU), and backward, which reads the saved sum, is layer norm's
// own. That backward takes the residual stream's gradient as layer_norm_backward's grad_add, so the two gradients
// reaching the sum are added inside the kernel that writes grad_x (one tensor is then the gradient of both x and
// residual), not by a separate pass of the engine. Per GPT block this saves a read of the [B, T, C] sum forward and a
// read and a write of one backward. The residual may also be f16/bf16 when x is f32: under autocast the residual
// stream stays f32 while the sub-layer's output (a linear's) is f16/bf16, and add promotes the pair to f32 — the
// fused form computes that same f32 sum.
AddLayerNormResult add_layer_norm_with_stats(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                             const Tensor& weight, const Tensor& bias, double eps) {
  const char* op = "add_layer_norm";
  EMBER_CHECK(x.defined() && residual.defined(), ValueError, op, ": x and residual must be defined");
  const bool half_into_f32 =
      x.dtype() == DType::f32 && is_reduced_float(residual.dtype());
  EMBER_CHECK(x.dtype() == residual.dtype() || half_into_f32, DTypeError, op, ": x ", x.description(),
              " and residual ", residual.description(),
              " differ in dtype (the fused form takes one dtype, or an f16/bf16 residual added to an f32 x)");
  EMBER_CHECK(x.sizes() == residual.sizes(), ShapeError, op, ": x ", x.description(), " and residual ",
              residual.description(), " differ in shape (the fused form does not broadcast)");
  return layer_norm_front(op, x, &residual, normalized_shape, weight, bias, eps);
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  return layer_norm_with_stats(x, normalized_shape, weight, bias, eps).out;
}

// Note [Fused layer-norm backward]
// With xhat = (x - mean) * rstd and dxhat = g * weight (g where there is no weight), per row of n values:
//   grad_x = rstd * (dxhat - mean_j(dxhat) - xhat * mean_j(dxhat * xhat)),
// and over the rows: grad_weight = sum_rows(g * xhat), grad_bias = sum_rows(g). One kernel computes them from g, x
// and the saved statistics, instead of the dozen broadcast ops (and their [rows, n] temporaries) of the composed
// formula: the backward holds nothing but its outputs. The row sums and the column sums accumulate in double on the
// CPU (op_math_t on CUDA, f32 for f32/f16/bf16), each in an order fixed by the sizes alone, so results do not depend
// on the thread count. grad_x comes out in x's dtype, rounded once (the engine would cast it there anyway), and the
// affine gradients in the output's dtype: f32 for the mixed form (Note [Mixed layer norm]).
LayerNormGrads layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, int64_t normalized_dims, bool need_x, bool need_weight,
                                   bool need_bias, const Tensor& grad_add) {
  const char* op = "layer_norm_backward";
  EMBER_CHECK(g.defined(), ValueError, op, ": the output's gradient is undefined");
  const bool need_xhat = need_x || need_weight;
  EMBER_CHECK(!need_xhat || (x.defined() && mean.defined() && rstd.defined()), ValueError, op,
              ": the gradients of x and weight need x, mean and rstd");
  EMBER_CHECK(!need_x || !weight.defined() || weight.dtype() == g.dtype(), DTypeError, op, ": weight ",
              weight.description(), " and the output's gradient ", g.description(), " differ in dtype");
  const Device device = common_device(op, {&g, need_xhat ? &x : nullptr, need_x ? &weight : nullptr,
                                           need_xhat ? &mean : nullptr, need_xhat ? &rstd : nullptr});
  check_floating(op, g);
  const int64_t lead = g.dim() - normalized_dims;
  EMBER_CHECK(normalized_dims >= 0 && lead >= 0, ShapeError, op, ": ", normalized_dims,
              " normalised dims for a gradient ", g.description());
  const Shape norm_shape(g.sizes().begin() + lead, g.sizes().end());
  const int64_t rows = numel_of(Shape(g.sizes().begin(), g.sizes().begin() + lead)), cols = numel_of(norm_shape);
  const DType out_dtype = g.dtype();
  DType x_dtype = out_dtype;
  if (need_xhat) {
    EMBER_CHECK(x.sizes() == g.sizes(), ShapeError, op, ": input ", x.description(), " and gradient ", g.description(),
                " differ in shape");
    x_dtype = x.dtype();
    const bool mixed = is_reduced_float(x_dtype) && out_dtype == DType::f32;
    EMBER_CHECK(out_dtype == x_dtype || mixed, DTypeError, op, ": gradient ", g.description(),
                " must have the input's dtype or, for an f16/bf16 input, f32 (input ", x.description(), ")");
    const DType stats_dtype = x_dtype == DType::f64 ? DType::f64 : DType::f32;
    for (const Tensor* st : {&mean, &rstd}) {
      EMBER_CHECK(st->dtype() == stats_dtype && st->numel() == rows, ShapeError, op, ": statistics ",
                  st->description(), " must be ", dtype_name(stats_dtype), " with ", rows, " elements");
    }
  }
  if (need_x && grad_add.defined()) {
    EMBER_CHECK(grad_add.sizes() == g.sizes(), ShapeError, op, ": grad_add ", grad_add.description(),
                " must have the gradient's shape ", shape_str(g.sizes()));
    EMBER_CHECK(grad_add.dtype() == x_dtype, DTypeError, op, ": grad_add ", grad_add.description(),
                " must have the input's dtype ", dtype_name(x_dtype));
    EMBER_CHECK(grad_add.device() == device, DeviceError, op, ": grad_add ", grad_add.description(), " is not on ",
                device.str());
  }
  if (need_x && weight.defined())
    EMBER_CHECK(weight.sizes() == norm_shape, ShapeError, op, ": weight ", weight.description(),
                " must have the normalized shape ", shape_str(norm_shape));

  LayerNormGrads r;
  Tensor gx, gw, gb;  // the kernel's [rows, cols] / [cols] forms
  if (need_x) gx = empty({rows, cols}, TensorOptions(x_dtype, device));
  if (need_weight) gw = empty({cols}, TensorOptions(out_dtype, device));
  if (need_bias) gb = empty({cols}, TensorOptions(out_dtype, device));
  if ((need_xhat || need_bias) && cols > 0) {
    // Reshaped on meta too: a copy of a strided input is memory a dry run must see (Note [Meta kernels] in stubs.h).
    const Tensor x2 = need_xhat ? x.reshape({rows, cols}) : Tensor();
    const Tensor w = need_x && weight.defined() ? weight.reshape({cols}) : Tensor();
    const Tensor m = need_xhat ? mean.reshape({rows}) : Tensor(), k = need_xhat ? rstd.reshape({rows}) : Tensor();
    const Tensor add = need_x && grad_add.defined() ? grad_add.reshape({rows, cols}) : Tensor();
    run_kernel(layer_norm_backward_stub, device, g.reshape({rows, cols}), x2, w, m, k, add, gx, gw, gb);
  }
  if (need_x) r.x = gx.view(g.sizes());
  if (need_weight) r.weight = gw.view(norm_shape);
  if (need_bias) r.bias = gb.view(norm_shape);
  return r;
}

}  // namespace ops
}  // namespace ember
