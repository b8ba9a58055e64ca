// CPU kernel of unary_backward: grad_in = grad * d op(x)/dx over strided grad and saved operands.
// Invariant: one instantiation per floating dtype; the op is a runtime argument of the inner loop, f16/bf16 are loaded
// into op_math_t (float), computed with unary_backward_fn (elementwise_math.h, shared with CUDA) and rounded once.
#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/elementwise_math.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

template <class scalar_t>
void unary_backward_typed(UnaryOp op, UnaryParams p, const Tensor& grad, const Tensor& saved, const Tensor& out) {
  using acc_t = op_math_t<scalar_t>;
  const double p0 = p.p0, p1 = p.p1;
  map_elements<scalar_t, scalar_t, scalar_t>(out, {grad, saved}, [op, p0, p1](scalar_t g, scalar_t s) {
    return scalar_t(unary_backward_fn<acc_t>(op, static_cast<acc_t>(g), static_cast<acc_t>(s), p0, p1));
  });
}

void unary_backward_kernel(UnaryOp op, UnaryParams p, const Tensor& grad, const Tensor& saved, const Tensor& out) {
  EMBER_DISPATCH_FLOAT(grad.dtype(), unary_op_name(op),
                       [&] { unary_backward_typed<scalar_t>(op, p, grad, saved, out); });
}

}  // namespace

EMBER_REGISTER_KERNEL(unary_backward, DeviceType::CPU, unary_backward_kernel);

}  // namespace ember::kernels::cpu
