// Front ends of the int8 quantization ops (ops_quant.h): argument checks naming the op, shapes and dtypes, the
// [..., K] -> [M, K] folding of linear inputs, output allocation, and the dispatch to the device's kernel.
// Invariant: kernels receive contiguous x / q, f32 (f64 for an f64 x) scale and bias, and a fresh contiguous out.
#include "ember/kernels/ops_quant.h"

#include <cmath>

#include "ember/kernels/ops.h"

namespace ember {

EMBER_DEFINE_STUB(quantize_per_channel, QuantizePerChannelFn);
EMBER_DEFINE_STUB(dequantize_per_channel, DequantizePerChannelFn);
EMBER_DEFINE_STUB(int8_weight_linear, Int8WeightLinearFn);
EMBER_DEFINE_STUB(int8_dynamic_linear, Int8DynamicLinearFn);

namespace ops {
namespace {

// q is i8 with >= 1 dim; scale is a floating [q.size(0)].
void check_packed(const char* op, const Tensor& q, const Tensor& scale) {
  EMBER_CHECK(q.defined() && scale.defined(), ValueError, op, ": q and scale must be defined");
  EMBER_CHECK(q.dtype() == DType::i8, DTypeError, op, ": q must be i8, got ", q.description());
  EMBER_CHECK(q.dim() >= 1, ShapeError, op, ": q must have at least 1 dim [O, ...], got ", q.description());
  EMBER_CHECK(is_floating(scale.dtype()), DTypeError, op, ": scale must be floating, got ", scale.description());
  EMBER_CHECK(scale.dim() == 1 && scale.size(0) == q.size(0), ShapeError, op, ": scale must be [", q.size(0),
              "] for q ", shape_str(q.sizes()), ", got ", scale.description());
}

// Checks a linear's operands; returns x folded to a contiguous [M, K].
Tensor fold_linear_input(const char* op, const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias) {
  common_device(op, {&x, &q, &scale, &bias});
  check_packed(op, q, scale);
  EMBER_CHECK(q.dim() == 2, ShapeError, op, ": q must be 2-d [out_features, in_features], got ", q.description());
  EMBER_CHECK(x.dim() >= 1 && x.size(-1) == q.size(1), ShapeError, op, ": input ", x.description(),
              " does not end in in_features ", q.size(1), " of q ", shape_str(q.sizes()));
  if (bias.defined()) {
    EMBER_CHECK(bias.dim() == 1 && bias.size(0) == q.size(0), ShapeError, op, ": bias must be [", q.size(0),
                "], got ", bias.description());
    check_floating(op, bias);
  }
  const int64_t k = q.size(1);
  const int64_t m = numel_of(Shape(x.sizes().begin(), x.sizes().end() - 1));
  return x.reshape({m, k}).contiguous();
}

Shape linear_out_shape(const Tensor& x, int64_t n) {
  Shape s(x.sizes().begin(), x.sizes().end() - 1);
  s.push_back(n);
  return s;
}

}  // namespace

QuantizedPerChannel quantize_per_channel_symmetric(const Tensor& w) {
  const char* op = "quantize_per_channel_symmetric";
  EMBER_CHECK(w.defined(), ValueError, op, ": the weight is undefined");
  check_floating(op, w);
  EMBER_CHECK(w.dim() >= 1, ShapeError, op, ": the weight needs at least 1 dim [O, ...], got ", w.description());
  const int64_t o = w.size(0);
  const int64_t r = o == 0 ? 0 : w.numel() / o;
  QuantizedPerChannel res;
  res.q = empty(w.sizes(), TensorOptions(DType::i8, w.device()));
  res.scale = empty({o}, TensorOptions(DType::f32, w.device()));
  if (o > 0) run_kernel(quantize_per_channel_stub, w.device(), w.contiguous().view({o, r}), res.q.view({o, r}),
                        res.scale);
  return res;
}

Tensor dequantize_per_channel(const Tensor& q, const Tensor& scale, DType dtype) {
  const char* op = "dequantize_per_channel";
  common_device(op, {&q, &scale});
  check_packed(op, q, scale);
  EMBER_CHECK(is_floating(dtype), DTypeError, op, ": the result dtype must be floating, got ", dtype_name(dtype));
  Tensor out = empty(q.sizes(), TensorOptions(dtype, q.device()));
  const int64_t o = q.size(0);
  if (out.numel() > 0) {
    const int64_t r = q.numel() / o;
    run_kernel(dequantize_per_channel_stub, q.device(), q.contiguous().view({o, r}), scale.to(DType::f32).contiguous(),
               out.view({o, r}));
  }
  return out;
}

Tensor int8_weight_linear(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias) {
  const char* op = "int8_weight_linear";
  EMBER_CHECK(x.defined(), ValueError, op, ": the input is undefined");
  check_floating(op, x);
  const Tensor x2 = fold_linear_input(op, x, q, scale, bias);
  const DType acc = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const int64_t n = q.size(0);
  Tensor out = empty({x2.size(0), n}, TensorOptions(x.dtype(), x.device()));
  if (out.numel() > 0) {
    run_kernel(int8_weight_linear_stub, x.device(), x2, q.contiguous(), scale.to(acc).contiguous(),
               bias.defined() ? bias.to(acc).contiguous() : Tensor(), out);
  }
  return out.view(linear_out_shape(x, n));
}

Tensor int8_dynamic_linear(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias,
                           std::optional<float> act_scale) {
  const char* op = "int8_dynamic_linear";
  EMBER_CHECK(x.defined(), ValueError, op, ": the input is undefined");
  EMBER_CHECK(x.dtype() == DType::f32, DTypeError, op, ": int8 activations are quantized from f32 inputs, got ",
              x.description());
  const Tensor x2 = fold_linear_input(op, x, q, scale, bias);
  const int64_t k = q.size(1), n = q.size(0);
  EMBER_CHECK(k <= kInt8DotMaxK, ValueError, op, ": in_features ", k, " exceeds ", kInt8DotMaxK,
              ", the largest K whose int8 x int8 sums are guaranteed to fit in int32 (127^2 * K < 2^31)");
  if (act_scale) {
    EMBER_CHECK(std::isfinite(*act_scale) && *act_scale > 0.0f, ValueError, op,
                ": act_scale must be a positive finite number, got ", *act_scale);
  }
  Tensor out = empty({x2.size(0), n}, TensorOptions(DType::f32, x.device()));
  if (out.numel() > 0) {
    run_kernel(int8_dynamic_linear_stub, x.device(), x2, q.contiguous(), scale.to(DType::f32).contiguous(),
               bias.defined() ? bias.to(DType::f32).contiguous() : Tensor(), !act_scale.has_value(),
               act_scale.value_or(1.0f), out);
  }
  return out.view(linear_out_shape(x, n));
}

Tensor int8_weight_conv2d(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias,
                          const Conv2dParams& p) {
  const char* op = "int8_weight_conv2d";
  EMBER_CHECK(x.defined(), ValueError, op, ": the input is undefined");
  common_device(op, {&x, &q, &scale, &bias});
  check_packed(op, q, scale);
  check_floating(op, x);
  EMBER_CHECK(q.dim() == 4, ShapeError, op, ": q must be 4-d [O, C/groups, KH, KW], got ", q.description());
  if (bias.defined()) check_floating(op, bias);
  const Tensor w = dequantize_per_channel(q, scale, x.dtype());
  return conv2d(x, w, bias.defined() ? bias.to(x.dtype()) : Tensor(), p);
}

}  // namespace ops
}  // namespace ember
