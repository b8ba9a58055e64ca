// Differentiable neural-network ops: softmax / log_softmax, layer norm, embedding, conv2d, max / avg pool2d and
// dropout. Invariant: only the main output of an op carries history (layer-norm statistics, pool indices and dropout
// masks never do), and each node saves only what the inputs that need a gradient will read.
#include <cmath>

#include "ember/autograd/function_node.h"
#include "ember/autograd/autocast.h"
#include "ember/autograd/functions.h"

namespace ember {

using autograd::BackwardContext;
using autograd::forward_op;
using autograd::make_node;
using autograd::should_record;
using autograd::TensorList;

namespace {

// ---- softmax ---------------------------------------------------------------------------------------------------

// Both formulas read only the output y: softmax gx = y * (g - sum(g * y)), log_softmax gx = g - exp(y) * sum(g),
// sums along `dim` (keepdim). A 0-d output is treated as [1] so the reductions have a dim to run over.
Tensor softmax_grad(const Tensor& g_in, const Tensor& y_in, int64_t dim, bool log) {
  const bool scalar = y_in.dim() == 0;
  const Tensor g = scalar ? g_in.view({1}) : g_in;
  const Tensor y = scalar ? y_in.view({1}) : y_in;
  const int64_t d = scalar ? 0 : dim;
  Tensor gx = log ? ops::sub(g, ops::mul(ops::exp(y), ops::sum(g, {d}, true)))
                  : ops::mul(y, ops::sub(g, ops::sum(ops::mul(g, y), {d}, true)));
  return scalar ? gx.view({}) : gx;
}

Tensor softmax_impl(const char* name, const Tensor& x, int64_t dim, bool log) {
  Tensor out = forward_op(name, {&x}, [&] { return log ? ops::log_softmax(x, dim) : ops::softmax(x, dim); });
  if (auto node = make_node(name, {&x})) {
    node->save(out);
    node->formula = [dim, log](const BackwardContext& c, const TensorList& g) -> TensorList {
      return {softmax_grad(g[0], c.saved(0), dim, log)};
    };
    node->set_outputs({&out});
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  if (autocast::should_cast({&x})) {
    autocast::BodyGuard body;
    return softmax(autocast::fp32(x), dim);
  }
  return softmax_impl("softmax", x, dim, false);
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  if (autocast::should_cast({&x})) {
    autocast::BodyGuard body;
    return log_softmax(autocast::fp32(x), dim);
  }
  return softmax_impl("log_softmax", x, dim, true);
}

// ---- layer norm --------------------------------------------------------------------------------------------------

// Note [Layer norm backward]
// With xhat = (x - mean) * rstd over the n normalised (trailing) dims and dxhat = g * w (g without a weight):
//   gx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))   (means over the normalised dims)
//   gw = sum over the leading dims of g * xhat,   gb = sum over the leading dims of g.
// Everything runs in the statistics' dtype (f32 for f16/bf16 x, f64 for f64): the gradients come back in it and the
// engine rounds them to the inputs' dtypes once. mean/rstd have x's leading shape; they broadcast after a reshape
// that appends n ones.
// One node for the whole attention (Note [Fused attention] in kernels/cpu/attention.cpp): saves qkv and one
// log-sum-exp per query row (Note [Attention saves lse]); backward writes the gradient of qkv in one piece.
Tensor attention_qkv(const Tensor& qkv, int64_t n_head, bool causal) {
  AttentionResult r =
      forward_op("attention_qkv", {&qkv}, [&] { return ops::attention_qkv(qkv, n_head, causal); });
  if (auto node = make_node("attention_qkv", {&qkv})) {
    node->save(qkv);      // 0
    node->save(r.lse);    // 1
    node->save(r.out);    // 2: the output the next layer keeps anyway; the CUDA flash backward reads it
    node->formula = [n_head, causal](const BackwardContext& c, const TensorList& g) -> TensorList {
      return {ops::attention_qkv_backward(g[0], c.saved(0), c.saved(1), n_head, causal, c.saved(2))};
    };
    node->set_outputs({&r.out});
  }
  return r.out;
}

// One node for the fused softmax + cross-entropy (Note [Fused cross-entropy] in kernels/stubs.h): saves the
// logits, the targets and the rows' log-sum-exp; backward recomputes the probabilities and writes the logits'
// gradient in one piece.
Tensor cross_entropy_rows(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing) {
  Tensor lse;
  Tensor loss = forward_op("cross_entropy_rows", {&logits}, [&] {
    CrossEntropyResult r = ops::cross_entropy_rows(logits, target, ignore_index, smoothing);
    lse = r.lse;
    return r.loss;
  });
  if (auto node = make_node("cross_entropy_rows", {&logits})) {
    node->save(logits);  // 0
    node->save(target);  // 1
    node->save(lse);     // 2
    node->formula = [ignore_index, smoothing](const BackwardContext& c, const TensorList& g) -> TensorList {
      // The forward checked these targets (Note [Targets checked once] in kernels/ops_loss.cpp).
      return {ops::cross_entropy_rows_backward(g[0], c.saved(0), c.saved(1), c.saved(2), ignore_index, smoothing,
                                               ops::TargetValues::checked)};
    };
    node->set_outputs({&loss});
  }
  return loss;
}

LayerNormResult layer_norm_with_stats(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                                      const Tensor& bias, double eps) {
  if (autocast::should_cast({&x, &weight, &bias})) {
    autocast::BodyGuard body;
    // With an affine parameter, the mixed form keeps x in f16/bf16 and returns f32 (Note [Mixed layer norm] in
    // kernels/ops_norm.cpp): fp32 arithmetic and result, without an f32 copy of x saved for backward.
    const bool mixed = is_reduced_float(x.dtype()) && (weight.defined() || bias.defined());
    return layer_norm_with_stats(mixed ? x : autocast::fp32(x), normalized_shape, autocast::fp32(weight),
                                 autocast::fp32(bias), eps);
  }
  LayerNormResult r = forward_op("layer_norm", {&x, &weight, &bias}, [&] {
    return ops::layer_norm_with_stats(x, normalized_shape, weight, bias, eps);
  });
  if (auto node = make_node("layer_norm", {&x, &weight, &bias})) {
    const bool need_xhat = node->needs_grad(0) || node->needs_grad(1);
    node->save(need_xhat ? x : Tensor());                               // 0
    node->save(node->needs_grad(0) ? weight : Tensor());                // 1
    node->save(need_xhat ? r.mean : Tensor());                          // 2
    node->save(need_xhat ? r.rstd : Tensor());                          // 3
    const int64_t n = static_cast<int64_t>(normalized_shape.size());
    // One fused kernel (Note [Fused layer-norm backward] in kernels/ops_norm.cpp).
    node->formula = [n](const BackwardContext& c, const TensorList& grads) -> TensorList {
      const LayerNormGrads d = ops::layer_norm_backward(grads[0], c.saved(0), c.saved(1), c.saved(2), c.saved(3), n,
                                                       c.needs_grad(0), c.needs_grad(1), c.needs_grad(2));
      return {d.x, d.weight, d.bias};
    };
    node->set_outputs({&r.out});  // mean and rstd stay statistics without history
  }
  return r;
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  return layer_norm_with_stats(x, normalized_shape, weight, bias, eps).out;
}

// Note [Residual add and layer norm] in kernels/ops_norm.cpp. Where the fused form does not apply (broadcasting,
// other dtype pairs) the composed ops run: add (promote) and layer_norm (fp32 under autocast, the mixed form). Under
// autocast the fused form runs where it computes what they would without casting: an f32 x (the residual stream) with
// an f32, f16 or bf16 residual and f32 (or no) affine parameters — add promotes to f32 and layer_norm keeps f32.
AddLayerNormOutputs add_layer_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                   const Tensor& weight, const Tensor& bias, double eps) {
  auto f32_or_none = [](const Tensor& t) { return !t.defined() || t.dtype() == DType::f32; };
  bool fused = x.defined() && residual.defined() && x.sizes() == residual.sizes() && is_floating(x.dtype()) &&
               (x.dtype() == residual.dtype() || (x.dtype() == DType::f32 && is_reduced_float(residual.dtype())));
  if (fused && autocast::should_cast({&x, &residual, &weight, &bias}))
    fused = x.dtype() == DType::f32 && f32_or_none(weight) && f32_or_none(bias);
  if (!fused) {
    Tensor sum = add(x, residual);
    Tensor out = layer_norm(sum, normalized_shape, weight, bias, eps);
    return {sum, out};
  }
  AddLayerNormResult r = forward_op("add_layer_norm", {&x, &residual, &weight, &bias}, [&] {
    return ops::add_layer_norm_with_stats(x, residual, normalized_shape, weight, bias, eps);
  });
  if (auto node = make_node("add_layer_norm", {&x, &residual, &weight, &bias})) {
    const bool need_in = node->needs_grad(0) || node->needs_grad(1);
    const bool need_xhat = need_in || node->needs_grad(2);
    node->save(need_xhat ? r.sum : Tensor());           // 0
    node->save(need_in ? weight : Tensor());            // 1
    node->save(need_xhat ? r.mean : Tensor());          // 2
    node->save(need_xhat ? r.rstd : Tensor());          // 3
    const int64_t n = static_cast<int64_t>(normalized_shape.size());
    // grads: [0] of sum (the residual stream), [1] of out; either may be undefined. The gradient reaching the sum is
    // g_sum + layer norm's input gradient, added inside the layer-norm backward kernel (grad_add); it is the gradient
    // of both x and residual (the same tensor: the engine adds it out of place where it meets another).
    node->formula = [n](const BackwardContext& c, const TensorList& grads) -> TensorList {
      const bool need_in = c.needs_grad(0) || c.needs_grad(1);
      if (!grads[1].defined()) return {grads[0], grads[0], Tensor(), Tensor()};
      const LayerNormGrads d = ops::layer_norm_backward(grads[1], c.saved(0), c.saved(1), c.saved(2), c.saved(3), n,
                                                       need_in, c.needs_grad(2), c.needs_grad(3),
                                                       need_in ? grads[0] : Tensor());
      return {d.x, d.x, d.weight, d.bias};
    };
    node->set_outputs({&r.sum, &r.out});  // mean and rstd stay statistics without history
  }
  return {r.sum, r.out};
}

// ---- bias + GELU ---------------------------------------------------------------------------------------------------

Tensor bias_gelu(const Tensor& x, const Tensor& bias, GeluApprox approx) {
  if (autocast::should_cast({&x, &bias})) {
    autocast::BodyGuard body;
    return bias_gelu(autocast::lower(x), autocast::lower(bias), approx);
  }
  Tensor out = forward_op("bias_gelu", {&x, &bias}, [&] { return ops::bias_gelu(x, bias, approx); });
  if (auto node = make_node("bias_gelu", {&x, &bias})) {
    node->save(x);     // 0
    node->save(bias);  // 1
    node->formula = [approx](const BackwardContext& c, const TensorList& g) -> TensorList {
      const BiasGeluGrads d =
          ops::bias_gelu_backward(g[0], c.saved(0), c.saved(1), approx, c.needs_grad(0), c.needs_grad(1));
      return {d.x, d.bias};
    };
    node->set_outputs({&out});
  }
  return out;
}

// ---- embedding -----------------------------------------------------------------------------------------------------

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  Tensor out = forward_op("embedding", {&weight, &indices}, [&] { return ops::embedding(weight, indices); });
  // indices are integers: never differentiable, so only the weight gets an edge.
  if (auto node = make_node("embedding", {&weight})) {
    node->save(indices);
    node->formula = [](const BackwardContext& c, const TensorList& g) -> TensorList {
      // embedding_backward takes grad_out shaped as the indices plus [D]: the forward output's shape.
      return {ops::embedding_backward(g[0], c.saved(0), c.input(0).sizes[0])};
    };
    node->set_outputs({&out});
  }
  return out;
}

// ---- convolution ---------------------------------------------------------------------------------------------------

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p) {
  if (autocast::should_cast({&x, &weight})) {
    autocast::BodyGuard body;
    return conv2d(autocast::lower(x), autocast::lower(weight), autocast::lower(bias), p);
  }
  Tensor out = forward_op("conv2d", {&x, &weight, &bias}, [&] { return ops::conv2d(x, weight, bias, p); });
  if (auto node = make_node("conv2d", {&x, &weight, &bias})) {
    node->save(node->needs_grad(1) ? x : Tensor());       // 0: read by grad_w only
    node->save(node->needs_grad(0) ? weight : Tensor());  // 1: read by grad_x only
    node->formula = [p](const BackwardContext& c, const TensorList& g) -> TensorList {
      Tensor gx, gw, gb;
      if (c.needs_grad(0)) gx = ops::conv2d_backward_input(g[0], c.saved(1), c.input(0).sizes, p);
      if (c.needs_grad(1)) gw = ops::conv2d_backward_weight(g[0], c.saved(0), c.input(1).sizes, p);
      if (c.needs_grad(2)) gb = ops::sum(g[0], {0, 2, 3});
      return {gx, gw, gb};
    };
    node->set_outputs({&out});
  }
  return out;
}

// ---- pooling -------------------------------------------------------------------------------------------------------

MaxPoolResult max_pool2d_with_indices(const Tensor& x, const Pool2dParams& p) {
  MaxPoolResult r = forward_op("max_pool2d", {&x}, [&] { return ops::max_pool2d_with_indices(x, p); });
  if (auto node = make_node("max_pool2d", {&x})) {
    node->save(r.indices);
    node->formula = [](const BackwardContext& c, const TensorList& g) -> TensorList {
      return {ops::max_pool2d_backward(g[0], c.saved(0), c.input(0).sizes)};
    };
    node->set_outputs({&r.out});  // the indices carry no history
  }
  return r;
}

// Without a graph to record the indices are never read, so the cheaper kernel without them runs.
Tensor max_pool2d(const Tensor& x, const Pool2dParams& p) {
  if (should_record({&x})) return max_pool2d_with_indices(x, p).out;
  return forward_op("max_pool2d", {&x}, [&] { return ops::max_pool2d(x, p); });
}

Tensor avg_pool2d(const Tensor& x, const Pool2dParams& p) {
  Tensor out = forward_op("avg_pool2d", {&x}, [&] { return ops::avg_pool2d(x, p); });
  if (auto node = make_node("avg_pool2d", {&x})) {
    node->formula = [p](const BackwardContext& c, const TensorList& g) -> TensorList {
      return {ops::avg_pool2d_backward(g[0], c.input(0).sizes, p)};
    };
    node->set_outputs({&out});
  }
  return out;
}

// ---- dropout -------------------------------------------------------------------------------------------------------

// Note [Dropout identity]
// With train=false or p == 0, ops::dropout returns x itself (the same TensorImpl), so the result already carries x's
// history and requires_grad: no node is recorded, and gradients reach x directly, as PyTorch's dropout returns its
// input. An in-place write to the result is a write to x and is checked and versioned as such.
// With p == 1 every element is dropped: the gradient is zero (g * mask / (1 - p) would be 0 * inf = NaN).
DropoutResult dropout_with_mask(const Tensor& x, double p, bool train) {
  DropoutResult r = forward_op("dropout", {&x}, [&] { return ops::dropout_with_mask(x, p, train); });
  if (!train || p == 0.0) return r;  // Note [Dropout identity]
  if (auto node = make_node("dropout", {&x})) {
    node->save(p < 1.0 ? r.mask : Tensor());
    node->formula = [p](const BackwardContext& c, const TensorList& g) -> TensorList {
      if (p >= 1.0) return {zeros(g[0].sizes(), {g[0].dtype(), g[0].device()})};
      return {ops::mul(ops::mul(g[0], c.saved(0)), 1.0 / (1.0 - p))};
    };
    node->set_outputs({&r.out});  // the mask carries no history
  }
  return r;
}

// Without a graph to record the mask is never read, so the kernel without it runs (it draws the same numbers).
Tensor dropout(const Tensor& x, double p, bool train) {
  if (should_record({&x})) return dropout_with_mask(x, p, train).out;
  return forward_op("dropout", {&x}, [&] { return ops::dropout(x, p, train); });
}

}  // namespace ember
