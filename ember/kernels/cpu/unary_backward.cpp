// CPU kernel of unary_backward: grad_in = grad * d op(x)/dx over strided grad and saved operands.
// Invariant: the hot (op, f32/f64) pairs get one loop each with the op fixed at compile time (Note [Unit-stride fast
// path] in loops.h), the rest one instantiation per dtype with the op a runtime argument of the inner loop; f16/bf16
// are loaded into op_math_t (float), computed with unary_backward_fn (elementwise_math.h, shared with CUDA), rounded once.
#include <type_traits>

#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/cpu/vec_math.h"
#include "ember/kernels/elementwise_math.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

// The generic path's formula (unary_backward_fn) with Op a constant so the switch folds away; the f32 exact GELU uses
// the vectorisable form of vec_math.h (Note [Vectorisable float math]).
template <class T, UnaryOp Op>
T backward_fixed_fn(T g, T s, double p0, double p1) {
  if constexpr (std::is_same_v<T, float> && Op == UnaryOp::GeluErf) return gelu_backward_vec(g, s);
  return unary_backward_fn<T>(Op, g, s, p0, p1);
}

template <class T, UnaryOp Op>
void backward_fixed(UnaryParams p, const Tensor& grad, const Tensor& saved, const Tensor& out) {
  const double p0 = p.p0, p1 = p.p1;
  map_elements_fast<T, T, T>(out, {grad, saved},
                             [p0, p1](T g, T s) { return backward_fixed_fn<T, Op>(g, s, p0, p1); });
}

// Runs the hot ops of f32/f64 through backward_fixed; false for every other (op, dtype).
template <class T>
bool backward_hot(UnaryOp op, UnaryParams p, const Tensor& grad, const Tensor& saved, const Tensor& out) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    switch (op) {
      case UnaryOp::Relu: backward_fixed<T, UnaryOp::Relu>(p, grad, saved, out); return true;
      case UnaryOp::GeluTanh: backward_fixed<T, UnaryOp::GeluTanh>(p, grad, saved, out); return true;
      case UnaryOp::GeluErf: backward_fixed<T, UnaryOp::GeluErf>(p, grad, saved, out); return true;
      case UnaryOp::Exp: backward_fixed<T, UnaryOp::Exp>(p, grad, saved, out); return true;
      case UnaryOp::Tanh: backward_fixed<T, UnaryOp::Tanh>(p, grad, saved, out); return true;
      case UnaryOp::Sigmoid: backward_fixed<T, UnaryOp::Sigmoid>(p, grad, saved, out); return true;
      default: return false;
    }
  }
  return false;
}

template <class scalar_t>
void unary_backward_typed(UnaryOp op, UnaryParams p, const Tensor& grad, const Tensor& saved, const Tensor& out) {
  using acc_t = op_math_t<scalar_t>;
  if (backward_hot<scalar_t>(op, p, grad, saved, out)) return;
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
