// Differentiable elementwise ops: binary arithmetic (broadcast gradients are summed back by the engine), unary
// activations (one fused unary_backward kernel per op, fed the input or the output — whichever the op saves), where,
// cast, and the operators. Each formula saves only what the inputs that need a gradient require.
#include <cmath>
#include <limits>

#include "ember/autograd/function_node.h"
#include "ember/autograd/autocast.h"
#include "ember/autograd/functions.h"
#include "ember/core/grad_mode.h"

namespace ember {

using autograd::BackwardContext;
using autograd::forward_op;
using autograd::make_node;
using autograd::TensorList;

namespace {

Tensor scalar_like(double v, const Tensor& like) { return scalar_tensor(v, {like.dtype(), like.device()}); }
Tensor mask_as(const Tensor& mask, const Tensor& like) { return mask.to(like.dtype()); }

// A unary op whose backward is ops::unary_backward(op, params, grad, saved): saved is the output for the ops
// unary_backward_uses_output() names, else the input — except relu, which saves its output: y > 0 exactly where
// x > 0, and the next layer usually keeps y anyway, so x can be freed after the forward.
Tensor unary(const char* name, UnaryOp op, UnaryParams params, const Tensor& x, Tensor out) {
  if (auto node = make_node(name, {&x})) {
    node->save(unary_backward_uses_output(op) || op == UnaryOp::Relu ? out : x);
    node->formula = [op, params](const BackwardContext& c, const TensorList& g) -> TensorList {
      return {ops::unary_backward(op, params, g[0], c.saved(0))};
    };
    node->set_outputs({&out});
  }
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = forward_op("add", {&a, &b}, [&] { return ops::add(a, b); });
  if (auto node = make_node("add", {&a, &b})) {
    node->formula = [](const BackwardContext&, const TensorList& g) -> TensorList { return {g[0], g[0]}; };
    node->set_outputs({&out});
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = forward_op("sub", {&a, &b}, [&] { return ops::sub(a, b); });
  if (auto node = make_node("sub", {&a, &b})) {
    node->formula = [](const BackwardContext& c, const TensorList& g) -> TensorList {
      return {g[0], c.needs_grad(1) ? ops::neg(g[0]) : Tensor()};
    };
    node->set_outputs({&out});
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = forward_op("mul", {&a, &b}, [&] { return ops::mul(a, b); });
  if (auto node = make_node("mul", {&a, &b})) {
    node->save(node->needs_grad(1) ? a : Tensor());
    node->save(node->needs_grad(0) ? b : Tensor());
    node->formula = [](const BackwardContext& c, const TensorList& g) -> TensorList {
      return {c.needs_grad(0) ? ops::mul(g[0], c.saved(1)) : Tensor(),
              c.needs_grad(1) ? ops::mul(g[0], c.saved(0)) : Tensor()};
    };
    node->set_outputs({&out});
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = forward_op("div", {&a, &b}, [&] { return ops::div(a, b); });
  if (auto node = make_node("div", {&a, &b})) {
    node->save(node->needs_grad(1) ? a : Tensor());
    node->save(b);
    node->formula = [](const BackwardContext& c, const TensorList& g) -> TensorList {
      const Tensor b = c.saved(1);
      Tensor ga = c.needs_grad(0) ? ops::div(g[0], b) : Tensor();
      Tensor gb;
      if (c.needs_grad(1)) gb = ops::neg(ops::div(ops::mul(g[0], c.saved(0)), ops::mul(b, b)));  // -g a / b^2
      return {ga, gb};
    };
    node->set_outputs({&out});
  }
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  if (autocast::should_cast({&a, &b})) {
    autocast::BodyGuard body;
    return pow(autocast::fp32(a), autocast::fp32(b));
  }
  Tensor out = forward_op("pow", {&a, &b}, [&] { return ops::pow(a, b); });
  if (auto node = make_node("pow", {&a, &b})) {
    node->save(a);
    node->save(b);
    node->save(node->needs_grad(1) ? out : Tensor());
    node->formula = [](const BackwardContext& c, const TensorList& g) -> TensorList {
      const Tensor a = c.saved(0), b = c.saved(1);
      Tensor ga, gb;
      if (c.needs_grad(0)) {
        // b * a^(b-1), and 0 where b == 0 (so 0^0 contributes no NaN through 0^-1).
        const Tensor d = ops::mul(b, ops::pow(a, ops::sub(b, 1)));
        ga = ops::mul(ops::mul(g[0], d), mask_as(ops::ne(b, scalar_like(0, b)), d));
      }
      if (c.needs_grad(1)) {
        // a^b * log(a), and 0 where a == 0 and b >= 0 (the limit PyTorch uses).
        const Tensor d = ops::mul(c.saved(2), ops::log(a));
        const Tensor keep = ops::add(ops::ne(a, scalar_like(0, a)), ops::lt(b, scalar_like(0, b)));  // or
        gb = ops::mul(g[0], ops::where(keep, d, scalar_like(0, d)));
      }
      return {ga, gb};
    };
    node->set_outputs({&out});
  }
  return out;
}

Tensor pow(const Tensor& a, double exponent) {
  if (autocast::should_cast({&a})) {
    autocast::BodyGuard body;
    return pow(autocast::fp32(a), exponent);
  }
  Tensor out = forward_op("pow", {&a}, [&] { return ops::pow(a, exponent); });
  return unary("pow", UnaryOp::PowScalar, UnaryParams{exponent, 0.0}, a, std::move(out));
}

namespace {

// maximum/minimum: the gradient goes to the selected operand; ties split it evenly (PyTorch's rule).
Tensor extremum(const char* name, const Tensor& a, const Tensor& b, bool is_max) {
  Tensor out = forward_op(name, {&a, &b}, [&] { return is_max ? ops::maximum(a, b) : ops::minimum(a, b); });
  if (auto node = make_node(name, {&a, &b})) {
    node->save(a);
    node->save(b);
    node->formula = [is_max](const BackwardContext& c, const TensorList& g) -> TensorList {
      const Tensor a = c.saved(0), b = c.saved(1);
      const Tensor wins = is_max ? ops::gt(a, b) : ops::lt(a, b);
      const Tensor weight_a = ops::add(mask_as(wins, g[0]), ops::mul(mask_as(ops::eq(a, b), g[0]), 0.5));
      return {c.needs_grad(0) ? ops::mul(g[0], weight_a) : Tensor(),
              c.needs_grad(1) ? ops::mul(g[0], ops::sub(scalar_like(1, weight_a), weight_a)) : Tensor()};
    };
    node->set_outputs({&out});
  }
  return out;
}

}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum("maximum", a, b, true); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum("minimum", a, b, false); }

Tensor add(const Tensor& a, Scalar b) {
  Tensor out = forward_op("add", {&a}, [&] { return ops::add(a, b); });
  if (auto node = make_node("add", {&a})) {
    node->formula = [](const BackwardContext&, const TensorList& g) -> TensorList { return {g[0]}; };
    node->set_outputs({&out});
  }
  return out;
}

Tensor sub(const Tensor& a, Scalar b) {
  Tensor out = forward_op("sub", {&a}, [&] { return ops::sub(a, b); });
  if (auto node = make_node("sub", {&a})) {
    node->formula = [](const BackwardContext&, const TensorList& g) -> TensorList { return {g[0]}; };
    node->set_outputs({&out});
  }
  return out;
}

Tensor mul(const Tensor& a, Scalar b) {
  Tensor out = forward_op("mul", {&a}, [&] { return ops::mul(a, b); });
  if (auto node = make_node("mul", {&a})) {
    node->formula = [b](const BackwardContext&, const TensorList& g) -> TensorList { return {ops::mul(g[0], b)}; };
    node->set_outputs({&out});
  }
  return out;
}

Tensor div(const Tensor& a, Scalar b) {
  Tensor out = forward_op("div", {&a}, [&] { return ops::div(a, b); });
  if (auto node = make_node("div", {&a})) {
    node->formula = [b](const BackwardContext&, const TensorList& g) -> TensorList { return {ops::div(g[0], b)}; };
    node->set_outputs({&out});
  }
  return out;
}

Tensor neg(const Tensor& x) {
  Tensor out = forward_op("neg", {&x}, [&] { return ops::neg(x); });
  if (auto node = make_node("neg", {&x})) {
    node->formula = [](const BackwardContext&, const TensorList& g) -> TensorList { return {ops::neg(g[0])}; };
    node->set_outputs({&out});
  }
  return out;
}

#define EMBER_UNARY_FN(fn, OP)                                                \
  Tensor fn(const Tensor& x) {                                                \
    Tensor out = forward_op(#fn, {&x}, [&] { return ops::fn(x); });           \
    return unary(#fn, UnaryOp::OP, UnaryParams{}, x, std::move(out));         \
  }
// The ops autocast runs in fp32 (Note [Autocast policy]): the cast, then the op itself.
#define EMBER_UNARY_FP32_FN(fn, OP)                                           \
  Tensor fn(const Tensor& x) {                                                \
    if (autocast::should_cast({&x})) {                                        \
      autocast::BodyGuard body;                                               \
      return fn(autocast::fp32(x));                                           \
    }                                                                         \
    Tensor out = forward_op(#fn, {&x}, [&] { return ops::fn(x); });           \
    return unary(#fn, UnaryOp::OP, UnaryParams{}, x, std::move(out));         \
  }
EMBER_UNARY_FP32_FN(exp, Exp)
EMBER_UNARY_FP32_FN(log, Log)
EMBER_UNARY_FN(sqrt, Sqrt)
EMBER_UNARY_FP32_FN(rsqrt, Rsqrt)
EMBER_UNARY_FN(tanh, Tanh)
EMBER_UNARY_FN(sigmoid, Sigmoid)
EMBER_UNARY_FN(relu, Relu)
EMBER_UNARY_FN(silu, Silu)
EMBER_UNARY_FN(abs, Abs)
#undef EMBER_UNARY_FN
#undef EMBER_UNARY_FP32_FN

// Note [In-place ReLU]
// relu_(x) writes max(x, 0) into x's own storage, as PyTorch's relu_ / nn.ReLU(inplace=True): the forward then
// holds one activation where relu holds two (its input until the next op drops it, and its output), and touches
// x's bytes once instead of reading them and filling a fresh buffer. The checks of every in-place write come first
// (Tensor::check_inplace_write): a leaf that requires grad, a view of a tensor with history, or a tracked tensor
// whose storage something else shares — a view, or a backward node that saved it (exp's output, say) — is refused
// with a ValueError, since that holder would see the new values under the old history. Otherwise the node takes x's
// old history as its input, saves x after the write (relu's backward reads its output: y > 0 exactly where x > 0),
// and becomes x's history; a retained gradient follows (Note [retain_grad across in-place writes] in node.cpp). An op
// that saved x after this and finds it written again refuses its backward through the saved tensor's version.
// nn::ReLU(inplace) is in place only where can_write_in_place(x) holds, and otherwise computes relu: PyTorch's module
// "can optionally do the operation in-place", and a block's input may be anything — a checkpointed region's saved
// input, the leaf the checkpoint planner profiles a block with, a tensor the caller keeps an alias of.
bool can_write_in_place(const Tensor& x) {
  if (!x.defined() || !x.is_contiguous() || x.storage().use_count() > 1) return false;
  if (x.is_inference() && !InferenceMode::is_enabled()) return false;
  if (!GradMode::is_enabled()) return true;
  const autograd::AutogradMeta* m = autograd::meta_of(x);
  if (m == nullptr) return true;
  return !(m->grad_fn == nullptr && m->requires_grad) && !(m->is_view && m->grad_fn != nullptr);  // check_inplace's
}

Tensor relu_(const Tensor& x) {
  x.check_inplace_write("relu_", nullptr);
  auto node = make_node("relu_", {&x});  // the edge to x's history before the write replaces it
  forward_op("relu_", {&x}, [&] {
    ops::relu_(x);
    return x;
  });
  if (node) {
    node->save(x);
    node->formula = [](const BackwardContext& c, const TensorList& g) -> TensorList {
      return {ops::unary_backward(UnaryOp::Relu, UnaryParams{}, g[0], c.saved(0))};
    };
    node->set_outputs({&x});
  }
  return x;
}

Tensor gelu(const Tensor& x, GeluApprox approx) {
  Tensor out = forward_op("gelu", {&x}, [&] { return ops::gelu(x, approx); });
  return unary("gelu", approx == GeluApprox::Tanh ? UnaryOp::GeluTanh : UnaryOp::GeluErf, UnaryParams{}, x,
               std::move(out));
}

Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  Tensor out = forward_op("clamp", {&x}, [&] { return ops::clamp(x, min, max); });
  constexpr double inf = std::numeric_limits<double>::infinity();
  // The gradient passes where min <= x <= max (none passes when min > max), as in PyTorch.
  return unary("clamp", UnaryOp::Clamp, UnaryParams{min.value_or(-inf), max.value_or(inf)}, x, std::move(out));
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = forward_op("where", {&cond, &a, &b}, [&] { return ops::where(cond, a, b); });
  if (auto node = make_node("where", {&cond, &a, &b})) {
    node->save(cond);
    node->formula = [](const BackwardContext& c, const TensorList& g) -> TensorList {
      const Tensor cond = c.saved(0), zero = scalar_like(0, g[0]);
      return {Tensor(), c.needs_grad(1) ? ops::where(cond, g[0], zero) : Tensor(),
              c.needs_grad(2) ? ops::where(cond, zero, g[0]) : Tensor()};
    };
    node->set_outputs({&out});
  }
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  // x.to() records the copy itself (autograd_hooks record_copy) when the target dtype is floating.
  EMBER_CHECK(!autograd::should_record({&x}) || is_floating(dtype), DTypeError, "cast: ", x.description(),
              " requires grad; casting it to ", dtype_name(dtype), " would silently drop the gradient — detach() "
              "it first");
  return x.to(dtype);
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }

}  // namespace ember
