// nn::functional: losses, batch norm and attention written with the differentiable ember ops (autograd/functions.h).
// Invariant: every function here only composes recorded ops, so its gradient is autograd's; the in-place running
// statistics update of batch_norm is the one write, done with recording off.
#include "ember/nn/functional.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ember/base/error.h"
#include "ember/autograd/autocast.h"
#include "ember/autograd/checkpoint.h"
#include "ember/core/grad_mode.h"

namespace ember::nn::functional {

namespace {

Tensor reduce(const Tensor& per_element, Reduction reduction) {
  switch (reduction) {
    case Reduction::None: return per_element;
    case Reduction::Sum: return sum(per_element);
    case Reduction::Mean: return mean(per_element);
  }
  return per_element;
}

// Class-indexed losses work on [M, C] rows: the class dim of [N, C, d1, ...] is moved last and the rest flattened.
struct ClassRows {
  Tensor rows;       // [M, C]
  Tensor target;     // [M] i64
  Shape out_shape;   // the shape of the unreduced loss (target's shape)
  int64_t classes = 0;
};

ClassRows to_class_rows(const char* op, const Tensor& input, const Tensor& target) {
  EMBER_CHECK(input.defined() && target.defined(), ValueError, op, ": input and target must be defined");
  check_floating(op, input);
  EMBER_CHECK(target.dtype() == DType::i64, DTypeError, op, ": target must hold i64 class indices, got ",
              dtype_name(target.dtype()));
  common_device(op, {&input, &target});
  ClassRows r;
  if (input.dim() == 1) {
    EMBER_CHECK(target.dim() == 0, ShapeError, op, ": input ", shape_str(input.sizes()),
                " (one sample) needs a 0-d target, got ", shape_str(target.sizes()));
    r.classes = input.size(0);
    r.rows = input.unsqueeze(0);
    r.target = target.reshape({1});
    r.out_shape = {};
    return r;
  }
  EMBER_CHECK(input.dim() >= 2, ShapeError, op, ": input must be [C], [N, C] or [N, C, d1, ...], got ",
              shape_str(input.sizes()));
  Shape expected = input.sizes();
  expected.erase(expected.begin() + 1);
  if (target.sizes() != expected) {
    // The usual mistake: logits [B, T, V] with targets [B, T] — the class dim is dim 1 here, as in PyTorch.
    Shape last_dim_classes = input.sizes();
    last_dim_classes.pop_back();
    const bool hint = input.dim() >= 3 && target.sizes() == last_dim_classes;
    EMBER_THROW(ShapeError, op, ": input ", shape_str(input.sizes()), " needs a target of shape ", shape_str(expected),
                " (the classes are dim 1), got ", shape_str(target.sizes()),
                hint ? "; for classes in the last dim (logits [B, T, V]) flatten to input [B*T, V] and target "
                       "[B*T], or move the class dim to 1"
                     : "");
  }
  r.classes = input.size(1);
  r.out_shape = expected;
  if (input.dim() == 2) {
    r.rows = input;
  } else {
    std::vector<int64_t> perm{0};
    for (int64_t d = 2; d < input.dim(); ++d) perm.push_back(d);
    perm.push_back(1);
    r.rows = input.permute(perm).reshape({-1, r.classes});
  }
  r.target = target.reshape({-1});
  return r;
}

// Note [Target check]
// A target outside [0, C) (other than ignore_index) would match no class in the one-hot selection and silently add
// 0 to the loss; PyTorch raises (a device assert on CUDA). The check copies the targets to the host, which on a GPU
// costs one synchronisation per loss: cheap next to a training step, and the error names the offending value.
void check_targets(const char* op, const Tensor& target, int64_t classes, int64_t ignore_index) {
  if (target.device().is_meta()) {
    // No values to check in a dry run; the dense copy to_vector would make of a strided target is made all the same,
    // so a dry run allocates what a real one does (Note [Meta allocation scope] in core/storage.cpp).
    (void)target.contiguous();
    return;
  }
  for (int64_t v : target.to_vector<int64_t>()) {
    EMBER_CHECK(v == ignore_index || (v >= 0 && v < classes), IndexError, op, ": target ", v,
                " is out of bounds for ", classes, " classes (ignore_index ", ignore_index, ")");
  }
}

// The shared core of nll_loss and cross_entropy on log-probabilities [M, C].
// Note [Target selection]
// Each row's -log p[target] is gathered with embedding() over logp viewed as an [M*C, 1] table at index
// row*C + target: no [M, C] one-hot mask or negated copy is built (the backward scatters into one [M*C] gradient,
// the size logp's gradient has anyway), and a -inf log-probability of an unselected class (a masked logit) is never
// touched. Ignored rows gather class 0 and are zeroed with where. Sums and the mean's denominator are accumulated in
// f32 for f16/bf16 inputs (a count above 65504 overflows f16), and the result is cast back.
Tensor nll_rows(const char* op, const ClassRows& r, const Tensor& logp, int64_t ignore_index, double label_smoothing,
                Reduction reduction) {
  check_targets(op, r.target, r.classes, ignore_index);
  const Device dev = logp.device();
  const DType out_dtype = logp.dtype();
  const DType acc = is_reduced_float(out_dtype) ? DType::f32 : out_dtype;
  const int64_t rows = r.target.numel();
  const Tensor valid = ne(r.target, scalar_tensor(ignore_index, {DType::i64, dev}));  // [M] bool
  const Tensor safe_target = where(valid, r.target, scalar_tensor(int64_t{0}, {DType::i64, dev}));
  const Tensor index = add(mul(arange(rows, TensorOptions(DType::i64, dev)), Scalar(r.classes)), safe_target);
  const Tensor picked = ember::embedding(logp.reshape({rows * r.classes, 1}), index).reshape({rows});  // log p[target]
  const Tensor zero = scalar_tensor(0.0, {acc, dev});
  const Tensor per_row = where(valid, neg(cast(picked, acc)), zero);  // [M]; ignored rows 0

  auto reduce_rows = [&](const Tensor& per) -> Tensor {
    switch (reduction) {
      case Reduction::None: return per.reshape(r.out_shape);
      case Reduction::Sum: return sum(per);
      case Reduction::Mean: return div(sum(per), sum(cast(valid, acc)));  // mean over non-ignored rows
    }
    return per;
  };
  Tensor loss = reduce_rows(per_row);
  if (label_smoothing > 0.0) {
    const Tensor smooth = where(valid, neg(sum(cast(logp, acc), {1})), zero);  // [M]: sum over classes of -log p
    loss = add(mul(loss, 1.0 - label_smoothing), mul(reduce_rows(smooth), label_smoothing / double(r.classes)));
  }
  return cast(loss, out_dtype);
}

// Note [Fused cross-entropy path]
// Where the device has the fused kernel (ops::cross_entropy_rows; Note [Fused cross-entropy] in kernels/stubs.h),
// cross_entropy never materialises log_softmax: the node saves the logits and one log-sum-exp per row, and its
// backward writes the logits' gradient directly, instead of the [M, C] log-probabilities (saved), the [M*C]
// scattered gradient of the selection and the [M, C] log_softmax gradient of the composed path. Under autocast the
// kernel reads f16/bf16 logits and computes in f32, so no f32 copy of the logits is made either. The loss is the
// composed path's (same formula, f32/f64 accumulation); targets are checked by the op (IndexError).
Tensor fused_cross_entropy(const ClassRows& r, int64_t ignore_index, double label_smoothing, Reduction reduction,
                           DType out_dtype) {
  const Tensor per_row = ember::cross_entropy_rows(r.rows, r.target, ignore_index, label_smoothing);  // 0 if ignored
  Tensor loss;
  switch (reduction) {
    case Reduction::None: loss = per_row.reshape(r.out_shape); break;
    case Reduction::Sum: loss = sum(per_row); break;
    case Reduction::Mean: {
      const Tensor valid = ne(r.target, scalar_tensor(ignore_index, {DType::i64, r.target.device()}));
      loss = div(sum(per_row), sum(cast(valid, per_row.dtype())));  // mean over non-ignored rows
      break;
    }
  }
  return cast(loss, out_dtype);
}

}  // namespace

// ---- losses --------------------------------------------------------------------------------------------------------

Tensor cross_entropy(const Tensor& input, const Tensor& target, int64_t ignore_index, double label_smoothing,
                     Reduction reduction) {
  EMBER_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, ValueError,
              "cross_entropy: label_smoothing must be between 0.0 and 1.0, got ", label_smoothing);
  if (autocast::should_cast({&input})) {
    autocast::BodyGuard body;
    if (has_cross_entropy_kernel(input.device())) {  // f16/bf16 logits read as they are, f32 math and result
      const ClassRows r = to_class_rows("cross_entropy", input, target);
      const bool half = is_reduced_float(input.dtype());
      return fused_cross_entropy(r, ignore_index, label_smoothing, reduction, half ? DType::f32 : input.dtype());
    }
    return cross_entropy(autocast::fp32(input), target, ignore_index, label_smoothing, reduction);
  }
  const ClassRows r = to_class_rows("cross_entropy", input, target);
  if (has_cross_entropy_kernel(input.device()))
    return fused_cross_entropy(r, ignore_index, label_smoothing, reduction, input.dtype());
  return nll_rows("cross_entropy", r, ember::log_softmax(r.rows, 1), ignore_index, label_smoothing, reduction);
}

Tensor nll_loss(const Tensor& input, const Tensor& target, int64_t ignore_index, Reduction reduction) {
  if (autocast::should_cast({&input})) {
    autocast::BodyGuard body;
    return nll_loss(autocast::fp32(input), target, ignore_index, reduction);
  }
  const ClassRows r = to_class_rows("nll_loss", input, target);
  return nll_rows("nll_loss", r, r.rows, ignore_index, 0.0, reduction);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  if (autocast::should_cast({&input, &target})) {
    autocast::BodyGuard body;
    return mse_loss(autocast::fp32(input), autocast::fp32(target), reduction);
  }
  check_floating("mse_loss", input);
  check_floating("mse_loss", target);
  // PyTorch broadcasts and warns; a prediction [N, 1] against a target [N] would compare every prediction with
  // every target ([N, N]) and train on the wrong loss without an error, so ember refuses.
  EMBER_CHECK(input.sizes() == target.sizes(), ShapeError, "mse_loss: input ", shape_str(input.sizes()),
              " and target ", shape_str(target.sizes()),
              " differ in shape; broadcasting them would compare every element of one with several of the other "
              "(reshape or expand one explicitly)");
  const Tensor d = sub(input, target);
  return reduce(mul(d, d), reduction);
}

// ---- layers as functions ---------------------------------------------------------------------------------------

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  return ember::linear(input, weight, bias);
}

Tensor dropout(const Tensor& input, double p, bool training) {
  EMBER_CHECK(p >= 0.0 && p <= 1.0, ValueError, "dropout: probability has to be between 0 and 1, but got ", p);
  return ember::dropout(input, p, training);
}

Tensor embedding(const Tensor& input, const Tensor& weight) { return ember::embedding(weight, input); }

Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  return ember::layer_norm(input, normalized_shape, weight, bias, eps);
}

Tensor relu(const Tensor& input) { return ember::relu(input); }
Tensor relu_(const Tensor& input) { return ember::relu_(input); }
Tensor gelu(const Tensor& input, GeluApprox approximate) { return ember::gelu(input, approximate); }
Tensor silu(const Tensor& input) { return ember::silu(input); }
Tensor softmax(const Tensor& input, int64_t dim) { return ember::softmax(input, dim); }
Tensor log_softmax(const Tensor& input, int64_t dim) { return ember::log_softmax(input, dim); }

// ---- batch norm ------------------------------------------------------------------------------------------------

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  EMBER_CHECK(input.defined(), ValueError, "batch_norm: input is undefined");
  check_floating("batch_norm", input);
  EMBER_CHECK(input.dim() >= 2, ShapeError, "batch_norm: input must be [N, C, *], got ", shape_str(input.sizes()));
  const int64_t channels = input.size(1);
  for (const Tensor* t : {&running_mean, &running_var, &weight, &bias}) {
    EMBER_CHECK(!t->defined() || t->sizes() == Shape{channels}, ShapeError, "batch_norm: input ",
                shape_str(input.sizes()), " needs per-channel tensors of shape [", channels, "], got ",
                shape_str(t->sizes()));
  }
  common_device("batch_norm", {&input, &running_mean, &running_var, &weight, &bias});
  Shape channel_shape(input.dim(), 1);  // [1, C, 1, ...]: broadcasts a per-channel vector over the input
  channel_shape[1] = channels;
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);

  // Half inputs are normalised in f32 (PyTorch accumulates batch-norm statistics in f32 too).
  const DType out_dtype = input.dtype();
  const DType compute = is_reduced_float(out_dtype) ? DType::f32 : out_dtype;
  const Tensor x = cast(input, compute);
  Tensor mu, var;
  if (training) {
    const int64_t n = input.numel() / std::max<int64_t>(channels, 1);
    EMBER_CHECK(n > 1, ValueError, "batch_norm: expected more than 1 value per channel when training, got input ",
                shape_str(input.sizes()));
    mu = mean(x, dims, true);
    var = ember::var(x, dims, /*correction=*/0, true);
    NoGradGuard no_grad;
    auto update = [&](const Tensor& running, const Tensor& stat) {
      // Not again when a checkpointed region is re-run during backward (autograd::is_recomputing).
      if (!running.defined() || autograd::is_recomputing()) return;
      const Tensor s = stat.detach().reshape({channels}).to(running.dtype());
      Tensor target = running;
      target.copy_(ops::add(ops::mul(running, 1.0 - momentum), ops::mul(s, momentum)));
    };
    update(running_mean, mu);
    update(running_var, ops::mul(var.detach(), double(n) / double(n - 1)));  // unbiased
  } else {
    EMBER_CHECK(running_mean.defined() && running_var.defined(), ValueError,
                "batch_norm: running_mean and running_var must be defined when not training");
    mu = cast(running_mean, compute).view(channel_shape);
    var = cast(running_var, compute).view(channel_shape);
  }
  Tensor out = mul(sub(x, mu), rsqrt(add(var, eps)));
  if (weight.defined()) out = mul(out, cast(weight, compute).view(channel_shape));
  if (bias.defined()) out = add(out, cast(bias, compute).view(channel_shape));
  return cast(out, out_dtype);
}

// ---- attention -------------------------------------------------------------------------------------------------

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale) {
  const char* op = "scaled_dot_product_attention";
  if (autocast::should_cast({&query, &key, &value})) {
    autocast::BodyGuard body;
    return scaled_dot_product_attention(autocast::lower(query), autocast::lower(key), autocast::lower(value),
                                        autocast::lower(attn_mask), dropout_p, is_causal, scale);
  }
  EMBER_CHECK(query.defined() && key.defined() && value.defined(), ValueError, op, ": q, k, v must be defined");
  EMBER_CHECK(query.dim() >= 2 && key.dim() >= 2 && value.dim() >= 2, ShapeError, op,
              ": q, k, v need at least 2 dims, got ", shape_str(query.sizes()), ", ", shape_str(key.sizes()), ", ",
              shape_str(value.sizes()));
  const int64_t L = query.size(query.dim() - 2), E = query.size(query.dim() - 1);
  const int64_t S = key.size(key.dim() - 2);
  EMBER_CHECK(key.size(key.dim() - 1) == E && value.size(value.dim() - 2) == S, ShapeError, op,
              ": query ", shape_str(query.sizes()), ", key ", shape_str(key.sizes()), " and value ",
              shape_str(value.sizes()), " do not fit ([..., L, E], [..., S, E], [..., S, Ev])");
  EMBER_CHECK(!(is_causal && attn_mask.defined()), ValueError, op,
              ": give either attn_mask or is_causal, not both");
  EMBER_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, ValueError, op, ": dropout_p must be in [0, 1], got ", dropout_p);
  const double s = scale ? *scale : 1.0 / std::sqrt(double(E));
  const Device dev = query.device();

  Tensor att = mul(matmul(query, key.transpose(-2, -1)), s);  // [..., L, S]
  const Tensor minus_inf = scalar_tensor(-std::numeric_limits<double>::infinity(), {att.dtype(), dev});
  if (is_causal) {
    // allowed[i, j] = (j <= i): the lower triangle, top-left aligned when L != S.
    const Tensor q_pos = arange(L, TensorOptions(DType::i64, dev)).unsqueeze(1);
    const Tensor k_pos = arange(S, TensorOptions(DType::i64, dev)).unsqueeze(0);
    att = where(le(k_pos, q_pos), att, minus_inf);
  } else if (attn_mask.defined()) {
    bool fits = attn_mask.dim() <= att.dim();
    for (int64_t i = 1; fits && i <= attn_mask.dim(); ++i) {
      const int64_t m = attn_mask.size(attn_mask.dim() - i), a = att.size(att.dim() - i);
      fits = m == a || m == 1;
    }
    EMBER_CHECK(fits, ShapeError, op, ": attn_mask ", attn_mask.description(), " does not broadcast to the scores ",
                shape_str(att.sizes()), " ([..., L, S] for query ", shape_str(query.sizes()), " and key ",
                shape_str(key.sizes()), ")");
    EMBER_CHECK(attn_mask.dtype() == DType::b8 || is_floating(attn_mask.dtype()), DTypeError, op,
                ": attn_mask must be bool or floating, got ", attn_mask.description());
    att = attn_mask.dtype() == DType::b8 ? where(attn_mask, att, minus_inf) : add(att, attn_mask);
  }
  att = ember::softmax(att, -1);
  if (dropout_p > 0.0) att = ember::dropout(att, dropout_p, true);
  return matmul(att, value);
}

}  // namespace ember::nn::functional
