// Front ends of the backward ops autograd cannot compose from forward ops: unary_backward, conv2d_backward_input /
// _weight, max_pool2d_backward and avg_pool2d_backward, and their stubs. Each checks its arguments (typed errors
// naming the op), allocates a fresh contiguous gradient and calls the kernel; on meta only the CPU kernels' workspace
// is allocated (Note [Meta kernels] in stubs.h).
#include <string>

#include "ember/core/meta_scope.h"
#include "ember/kernels/elementwise_math.h"
#include "ember/kernels/ops.h"

namespace ember {

EMBER_DEFINE_STUB(unary_backward, UnaryBackwardFn);
EMBER_DEFINE_STUB(conv2d_backward, Conv2dBackwardFn);
EMBER_DEFINE_STUB(max_pool2d_backward, MaxPool2dBackwardFn);
EMBER_DEFINE_STUB(avg_pool2d_backward, AvgPool2dBackwardFn);

namespace ops {

namespace {

void check_defined(const char* op, const Tensor& t, const char* what) {
  EMBER_CHECK(t.defined(), ValueError, op, ": ", what, " is an undefined tensor");
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  EMBER_CHECK(a.dtype() == b.dtype(), DTypeError, op, ": ", a.description(), " and ", b.description(),
              " must have the same dtype");
}

void check_nchw_shape(const char* op, const Shape& s, const char* what, const char* layout) {
  EMBER_CHECK(s.size() == 4, ShapeError, op, ": expects ", what, " of shape ", layout, ", got ", shape_str(s));
  for (int64_t d : s) EMBER_CHECK(d >= 0, ShapeError, op, ": ", what, " ", shape_str(s), " has a negative size");
}

std::string pair_str(const int64_t v[2]) { return detail::concat("(", v[0], ", ", v[1], ")"); }

void check_grad_out_shape(const char* op, const Tensor& grad_out, const Shape& expected) {
  EMBER_CHECK(grad_out.sizes() == expected, ShapeError, op, ": grad_out ", grad_out.description(),
              " does not match the forward output shape ", shape_str(expected));
}

// The checks of conv2d for x of x_shape and a weight of w_shape, plus grad_out having the output's shape.
void check_conv(const char* op, const Tensor& grad_out, const Shape& x_shape, const Shape& w_shape,
                const Conv2dParams& p) {
  check_nchw_shape(op, x_shape, "an input", "[N, C, H, W]");
  check_nchw_shape(op, w_shape, "a weight", "[O, C/groups, KH, KW]");
  EMBER_CHECK(grad_out.dim() == 4, ShapeError, op, ": expects grad_out of shape [N, O, OH, OW], got ",
              grad_out.description());
  EMBER_CHECK(p.groups > 0, ValueError, op, ": groups must be positive, got ", p.groups);
  for (int d = 0; d < 2; ++d) {
    EMBER_CHECK(p.stride[d] > 0, ValueError, op, ": stride must be positive, got ", pair_str(p.stride));
    EMBER_CHECK(p.dilation[d] > 0, ValueError, op, ": dilation must be positive, got ", pair_str(p.dilation));
    EMBER_CHECK(p.padding[d] >= 0, ValueError, op, ": padding must be non-negative, got ", pair_str(p.padding));
  }
  const int64_t c = x_shape[1], h = x_shape[2], w = x_shape[3];
  const int64_t o = w_shape[0], kh = w_shape[2], kw = w_shape[3];
  EMBER_CHECK(w_shape[1] * p.groups == c, ShapeError, op, ": input ", shape_str(x_shape), " has ", c,
              " channels but weight ", shape_str(w_shape), " with groups=", p.groups, " expects ",
              w_shape[1] * p.groups);
  EMBER_CHECK(o % p.groups == 0, ShapeError, op, ": out channels ", o, " of weight ", shape_str(w_shape),
              " are not divisible by groups=", p.groups);
  EMBER_CHECK(kh > 0 && kw > 0, ShapeError, op, ": weight ", shape_str(w_shape), " has an empty kernel");
  const int64_t num_h = h + 2 * p.padding[0] - p.dilation[0] * (kh - 1) - 1;
  const int64_t num_w = w + 2 * p.padding[1] - p.dilation[1] * (kw - 1) - 1;
  const int64_t oh = num_h < 0 ? 0 : num_h / p.stride[0] + 1;
  const int64_t ow = num_w < 0 ? 0 : num_w / p.stride[1] + 1;
  EMBER_CHECK(oh > 0 && ow > 0, ShapeError, op, ": input ", shape_str(x_shape), " is too small for kernel ", kh,
              "x", kw, " with padding ", pair_str(p.padding), " and dilation ", pair_str(p.dilation),
              " (output size ", oh, "x", ow, ")");
  check_grad_out_shape(op, grad_out, {x_shape[0], o, oh, ow});
}

// Runs the conv2d_backward kernel for the one gradient `grad` (grad_x or grad_w, the other undefined).
Tensor conv2d_backward_impl(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Conv2dParams& p,
                            bool want_x) {
  const Tensor& like = want_x ? x : weight;  // the placeholder: shape and dtype of the gradient
  const Device dev = grad_out.device();
  const TensorOptions opts(grad_out.dtype(), dev);
  // Nothing flows back from an empty grad_out (N = 0 or O = 0): the gradient is zero.
  if (grad_out.numel() == 0) return zeros(like.sizes(), opts);
  Tensor grad = empty(like.sizes(), opts);
  if (grad.numel() > 0)  // Note [Meta kernels]: workspace on meta
    run_kernel(conv2d_backward_stub, dev, grad_out, x, weight, p, want_x ? grad : Tensor(), want_x ? Tensor() : grad);
  return grad;
}

}  // namespace

// ---- unary --------------------------------------------------------------------------------------------------------

Tensor unary_backward(UnaryOp op, UnaryParams params, const Tensor& grad, const Tensor& saved) {
  const std::string name = std::string(kernels::unary_op_name(op)) + "_backward";
  const char* opn = name.c_str();
  check_defined(opn, grad, "grad");
  check_defined(opn, saved, "saved tensor");
  const Device dev = common_device(opn, {&grad, &saved});
  check_floating(opn, grad);
  check_same_dtype(opn, grad, saved);
  EMBER_CHECK(grad.sizes() == saved.sizes(), ShapeError, opn, ": grad ", grad.description(), " and saved tensor ",
              saved.description(), " must have the same shape");
  Tensor out = empty(grad.sizes(), {grad.dtype(), dev});
  if (out.numel() > 0 && !dev.is_meta()) unary_backward_stub.get(dev.type)(op, params, grad, saved, out);
  return out;
}

// ---- convolution --------------------------------------------------------------------------------------------------

// The kernel gets the weight and, for x (not read for grad_x), a meta placeholder of input_shape.
Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Shape& input_shape,
                             const Conv2dParams& p) {
  const char* op = "conv2d_backward_input";
  check_defined(op, grad_out, "grad_out");
  check_defined(op, weight, "weight");
  common_device(op, {&grad_out, &weight});
  check_floating(op, grad_out);
  check_same_dtype(op, grad_out, weight);
  check_nchw_shape(op, weight.sizes(), "weight", "[O, C/groups, KH, KW]");
  check_conv(op, grad_out, input_shape, weight.sizes(), p);
  const Tensor x = meta_placeholder(input_shape, grad_out.dtype());
  return conv2d_backward_impl(grad_out, x, weight, p, /*want_x=*/true);
}

// The kernel gets x and, for the weight (not read for grad_w), a meta placeholder of weight_shape.
Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Shape& weight_shape,
                              const Conv2dParams& p) {
  const char* op = "conv2d_backward_weight";
  check_defined(op, grad_out, "grad_out");
  check_defined(op, x, "x");
  common_device(op, {&grad_out, &x});
  check_floating(op, grad_out);
  check_same_dtype(op, grad_out, x);
  check_nchw_shape(op, x.sizes(), "x", "[N, C, H, W]");
  check_conv(op, grad_out, x.sizes(), weight_shape, p);
  const Tensor weight = meta_placeholder(weight_shape, grad_out.dtype());
  return conv2d_backward_impl(grad_out, x, weight, p, /*want_x=*/false);
}

// ---- pooling ------------------------------------------------------------------------------------------------------

Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape) {
  const char* op = "max_pool2d_backward";
  check_defined(op, grad_out, "grad_out");
  check_defined(op, indices, "indices");
  const Device dev = common_device(op, {&grad_out, &indices});
  check_floating(op, grad_out);
  EMBER_CHECK(indices.dtype() == DType::i64, DTypeError, op, ": indices must be i64, got ", indices.description());
  check_nchw_shape(op, input_shape, "an input", "[N, C, H, W]");
  EMBER_CHECK(grad_out.dim() == 4, ShapeError, op, ": expects grad_out of shape [N, C, OH, OW], got ",
              grad_out.description());
  EMBER_CHECK(indices.sizes() == grad_out.sizes(), ShapeError, op, ": indices ", indices.description(),
              " must have grad_out's shape ", shape_str(grad_out.sizes()));
  EMBER_CHECK(grad_out.size(0) == input_shape[0] && grad_out.size(1) == input_shape[1], ShapeError, op,
              ": grad_out ", grad_out.description(), " and input shape ", shape_str(input_shape),
              " differ in batch or channels");
  const TensorOptions opts(grad_out.dtype(), dev);
  if (grad_out.numel() == 0) return zeros(input_shape, opts);
  Tensor grad_in = empty(input_shape, opts);
  run_kernel(max_pool2d_backward_stub, dev, grad_out, indices, grad_in);  // Note [Meta kernels]
  return grad_in;
}

Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, const Pool2dParams& p) {
  const char* op = "avg_pool2d_backward";
  check_defined(op, grad_out, "grad_out");
  check_floating(op, grad_out);
  check_nchw_shape(op, input_shape, "an input", "[N, C, H, W]");
  for (int d = 0; d < 2; ++d) {
    EMBER_CHECK(p.kernel[d] > 0, ValueError, op, ": kernel size must be positive, got ", pair_str(p.kernel));
    EMBER_CHECK(p.stride[d] > 0, ValueError, op, ": stride must be positive, got ", pair_str(p.stride));
    EMBER_CHECK(p.padding[d] >= 0 && 2 * p.padding[d] <= p.kernel[d], ValueError, op,
                ": padding must be between 0 and half the kernel size, got padding ", pair_str(p.padding),
                " for kernel ", pair_str(p.kernel));
  }
  // The forward's output size (ops::avg_pool2d): floor mode, so every window starts inside the padded input.
  const int64_t num_h = input_shape[2] + 2 * p.padding[0] - p.kernel[0];
  const int64_t num_w = input_shape[3] + 2 * p.padding[1] - p.kernel[1];
  const int64_t oh = num_h < 0 ? 0 : num_h / p.stride[0] + 1, ow = num_w < 0 ? 0 : num_w / p.stride[1] + 1;
  EMBER_CHECK(oh > 0 && ow > 0, ShapeError, op, ": input ", shape_str(input_shape), " is too small for kernel ",
              pair_str(p.kernel), " with padding ", pair_str(p.padding), " (output size ", oh, "x", ow, ")");
  check_grad_out_shape(op, grad_out, {input_shape[0], input_shape[1], oh, ow});
  const Device dev = grad_out.device();
  const TensorOptions opts(grad_out.dtype(), dev);
  if (grad_out.numel() == 0) return zeros(input_shape, opts);
  Tensor grad_in = empty(input_shape, opts);
  run_kernel(avg_pool2d_backward_stub, dev, grad_out, p, grad_in);  // Note [Meta kernels]
  return grad_in;
}

}  // namespace ops
}  // namespace ember
