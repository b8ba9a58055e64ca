// BatchNorm2d and LayerNorm (layers.h). Invariant: the normalisation is composed of differentiable ember ops (or
// ember::layer_norm), so autograd supplies the backward; running statistics change only under NoGradGuard.
#include <sstream>

#include "ember/core/grad_mode.h"
#include "ember/autograd/checkpoint.h"
#include "ember/nn/init.h"
#include "ember/nn/layers.h"

namespace ember::nn {

namespace {
const char* py_bool(bool b) { return b ? "True" : "False"; }
}  // namespace

// ---- BatchNorm2d -------------------------------------------------------------------------------------------------

BatchNorm2d::BatchNorm2d(int64_t num_features_, double eps_, std::optional<double> momentum_, bool affine_,
                         bool track_running_stats_)
    : Module("BatchNorm2d"),
      num_features(num_features_),
      eps(eps_),
      momentum(momentum_),
      affine(affine_),
      track_running_stats(track_running_stats_) {
  EMBER_CHECK(num_features > 0, ValueError, "BatchNorm2d: num_features must be positive, got ", num_features);
  EMBER_CHECK(eps >= 0.0, ValueError, "BatchNorm2d: eps must be non-negative, got ", eps);
  weight = register_parameter("weight", affine ? empty({num_features}) : Tensor());
  bias = register_parameter("bias", affine ? empty({num_features}) : Tensor());
  running_mean = register_buffer("running_mean", track_running_stats ? empty({num_features}) : Tensor());
  running_var = register_buffer("running_var", track_running_stats ? empty({num_features}) : Tensor());
  num_batches_tracked =
      register_buffer("num_batches_tracked", track_running_stats ? scalar_tensor(0, DType::i64) : Tensor());
  reset_parameters();
}

void BatchNorm2d::reset_running_stats() {
  if (!track_running_stats) return;
  init::zeros_(running_mean);
  init::ones_(running_var);
  init::zeros_(num_batches_tracked);
}

void BatchNorm2d::reset_parameters() {
  reset_running_stats();
  if (affine) {
    init::ones_(weight);
    init::zeros_(bias);
  }
}

// Note [BatchNorm statistics]
// Training (and always without running stats): y = (x - mean) / sqrt(var + eps) with the batch mean and the
// *biased* batch variance over (N, H, W) of each channel. The running statistics are updated with the *unbiased*
// variance (times n / (n - 1), n = N*H*W): running = (1 - f) * running + f * batch, f = momentum, or
// 1 / num_batches_tracked when momentum is nullopt (cumulative average). num_batches_tracked counts training
// forwards. Eval with running stats normalises with running_mean / running_var. Matches torch.nn.BatchNorm2d.
Tensor BatchNorm2d::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  EMBER_CHECK(x.dim() == 4, ShapeError, "BatchNorm2d(", num_features, "): expects input of shape [N, C, H, W], got ",
              x.description());
  EMBER_CHECK(x.size(1) == num_features, ShapeError, "BatchNorm2d(", num_features, "): expects ", num_features,
              " channels, got input ", x.description());
  check_floating("BatchNorm2d", x);
  const int64_t c = num_features;
  const Shape per_channel{1, c, 1, 1};
  const bool use_batch_stats = is_training() || !track_running_stats;

  Tensor y;
  if (use_batch_stats) {
    const int64_t n = x.size(0) * x.size(2) * x.size(3);
    EMBER_CHECK(!is_training() || n > 1, ValueError, "BatchNorm2d(", num_features,
                "): expected more than 1 value per channel when training, got input ", x.description());
    const Tensor mean = ember::mean(x, {0, 2, 3}, /*keepdim=*/true);
    const Tensor var = ember::var(x, {0, 2, 3}, /*correction=*/0, /*keepdim=*/true);
    // A checkpointed region re-run during backward must not count the batch twice: the recomputation repeats the
    // forward's math, not its side effects.
    if (is_training() && track_running_stats && !autograd::is_recomputing()) {
      NoGradGuard no_grad;
      num_batches_tracked.copy_(add(num_batches_tracked, 1));
      const double f = momentum ? *momentum : 1.0 / num_batches_tracked.item_double();
      const Tensor batch_mean = mean.view({c}).to(running_mean.dtype());
      const Tensor batch_var = mul(var.view({c}).to(running_var.dtype()), static_cast<double>(n) / (n - 1));
      running_mean.copy_(add(mul(running_mean, 1.0 - f), mul(batch_mean, f)));
      running_var.copy_(add(mul(running_var, 1.0 - f), mul(batch_var, f)));
    }
    y = mul(sub(x, mean), rsqrt(add(var, eps)));
  } else {
    const Tensor rm = running_mean.to(x.dtype()).view(per_channel);
    const Tensor rv = running_var.to(x.dtype()).view(per_channel);
    y = mul(sub(x, rm), rsqrt(add(rv, eps)));
  }
  if (affine) y = add(mul(y, weight.view(per_channel)), bias.view(per_channel));
  return y;
}

std::string BatchNorm2d::extra_repr() const {
  std::ostringstream os;
  os << num_features << ", eps=" << eps << ", momentum=";
  if (momentum) {
    os << *momentum;
  } else {
    os << "None";
  }
  os << ", affine=" << py_bool(affine) << ", track_running_stats=" << py_bool(track_running_stats);
  return os.str();
}

// ---- LayerNorm ---------------------------------------------------------------------------------------------------

LayerNorm::LayerNorm(Shape normalized_shape_, double eps_, bool elementwise_affine_, bool with_bias)
    : Module("LayerNorm"), normalized_shape(std::move(normalized_shape_)), eps(eps_),
      elementwise_affine(elementwise_affine_) {
  EMBER_CHECK(!normalized_shape.empty(), ValueError, "LayerNorm: normalized_shape must not be empty");
  for (int64_t s : normalized_shape) {
    EMBER_CHECK(s > 0, ValueError, "LayerNorm: normalized_shape ", shape_str(normalized_shape),
                " must have positive sizes");
  }
  weight = register_parameter("weight", elementwise_affine ? empty(normalized_shape) : Tensor());
  bias = register_parameter("bias", elementwise_affine && with_bias ? empty(normalized_shape) : Tensor());
  reset_parameters();
}

LayerNorm::LayerNorm(int64_t normalized_size, double eps_, bool elementwise_affine_, bool with_bias)
    : LayerNorm(Shape{normalized_size}, eps_, elementwise_affine_, with_bias) {}

void LayerNorm::reset_parameters() {
  if (weight.defined()) init::ones_(weight);
  if (bias.defined()) init::zeros_(bias);
}

void LayerNorm::check_input(const Tensor& x) const {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  bool matches = x.dim() >= k;
  for (int64_t i = 0; matches && i < k; ++i) matches = x.size(x.dim() - k + i) == normalized_shape[i];
  EMBER_CHECK(matches, ShapeError, "LayerNorm(", shape_str(normalized_shape), "): expects input of shape [..., ",
              shape_str(normalized_shape).substr(1), ", got ", x.description());
}

Tensor LayerNorm::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  check_input(x);
  return layer_norm(x, normalized_shape, weight, bias, eps);
}

AddLayerNormOutputs LayerNorm::forward_add(const Tensor& x, const Tensor& residual) {
  EMBER_MODULE_SCOPE();
  check_input(x);
  return add_layer_norm(x, residual, normalized_shape, weight, bias, eps);
}

std::string LayerNorm::extra_repr() const {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < normalized_shape.size(); ++i) os << (i ? ", " : "") << normalized_shape[i];
  os << (normalized_shape.size() == 1 ? ",)" : ")") << ", eps=" << eps
     << ", elementwise_affine=" << py_bool(elementwise_affine);
  return os.str();
}

}  // namespace ember::nn
