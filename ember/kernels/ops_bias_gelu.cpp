// Front ends of the fused bias + GELU (ops.h): argument checks, allocation, the kernel call.
#include "ember/kernels/ops.h"

namespace ember {

EMBER_DEFINE_STUB(bias_gelu, BiasGeluFn);
EMBER_DEFINE_STUB(bias_gelu_backward, BiasGeluBackwardFn);

namespace ops {

namespace {

// x [..., N] floating and bias [N] of x's dtype; returns N.
int64_t check_bias(const char* op, const Tensor& x, const Tensor& bias) {
  EMBER_CHECK(x.defined() && bias.defined(), ValueError, op, ": x and bias must be defined");
  check_floating(op, x);
  EMBER_CHECK(x.dim() >= 1, ShapeError, op, ": x must have at least one dim, got ", x.description());
  const int64_t cols = x.size(x.dim() - 1);
  EMBER_CHECK(bias.dim() == 1 && bias.size(0) == cols, ShapeError, op, ": bias ", bias.description(), " must be [",
              cols, "] for x ", x.description());
  EMBER_CHECK(bias.dtype() == x.dtype(), DTypeError, op, ": bias ", bias.description(), " and x ", x.description(),
              " differ in dtype");
  return cols;
}

}  // namespace

// Note [Bias and GELU]
// The first linear of a transformer MLP is followed by a GELU. Split, the bias is added by the GEMM (the cuBLASLt
// epilogue, the CPU GEMM's first term) and GELU reads the product back; backward runs GELU's gradient, then sums it
// over the rows for the bias gradient, a second read of the [rows, 4 C] gradient. Fused, the GEMM leaves the bias out,
// bias_gelu adds it where it applies the GELU (the same single pass), and its backward computes the input gradient
// and the bias gradient's column sums in one pass over g and x. The sums run over a fixed grouping of the rows (from
// the sizes alone) and add the groups in order, so results do not depend on the thread count or the device.
Tensor bias_gelu(const Tensor& x, const Tensor& bias, GeluApprox approx) {
  const char* op = "bias_gelu";
  const int64_t cols = check_bias(op, x, bias);
  const Device device = common_device(op, {&x, &bias});
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype(), device));
  if (out.numel() > 0) {
    const int64_t rows = x.numel() / cols;
    run_kernel(bias_gelu_stub, device, x.contiguous().view({rows, cols}), bias.contiguous(), approx == GeluApprox::Tanh,
               out.view({rows, cols}));
  }
  return out;
}

BiasGeluGrads bias_gelu_backward(const Tensor& g, const Tensor& x, const Tensor& bias, GeluApprox approx, bool need_x,
                                 bool need_bias) {
  const char* op = "bias_gelu_backward";
  const int64_t cols = check_bias(op, x, bias);
  EMBER_CHECK(g.defined(), ValueError, op, ": the output's gradient is undefined");
  EMBER_CHECK(g.sizes() == x.sizes(), ShapeError, op, ": gradient ", g.description(), " and x ", x.description(),
              " differ in shape");
  EMBER_CHECK(g.dtype() == x.dtype(), DTypeError, op, ": gradient ", g.description(), " and x ", x.description(),
              " differ in dtype");
  const Device device = common_device(op, {&g, &x, &bias});
  BiasGeluGrads r;
  if (need_x) r.x = empty(x.sizes(), TensorOptions(x.dtype(), device));
  if (need_bias) r.bias = empty({cols}, TensorOptions(bias.dtype(), device));
  if ((need_x || need_bias) && cols > 0) {
    const int64_t rows = x.numel() / cols;
    run_kernel(bias_gelu_backward_stub, device, g.contiguous().view({rows, cols}), x.contiguous().view({rows, cols}),
               bias.contiguous(), approx == GeluApprox::Tanh, need_x ? r.x.view({rows, cols}) : Tensor(), r.bias);
  }
  return r;
}

}  // namespace ops
}  // namespace ember
