// PyTorch's initialisation schemes: gains, fans, and the uniform/normal fills they reduce to. Invariant: random
// values come from the default Philox generator through ember::uniform / ember::normal drawn on t's device in t's
// dtype, then copied into t under NoGradGuard (so t may be a non-contiguous view or a leaf that requires grad).
#include "ember/nn/init.h"

#include <cmath>

#include "ember/base/error.h"
#include "ember/core/grad_mode.h"

namespace ember::nn::init {

namespace {

void check_random_target(const char* op, const Tensor& t) {
  EMBER_CHECK(t.defined(), ValueError, "init.", op, ": undefined tensor");
  EMBER_CHECK(is_floating(t.dtype()), DTypeError, "init.", op, ": needs a floating tensor, got ", t.description());
}

int64_t fan_for_mode(const Tensor& t, const std::string& mode, const char* op) {
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  if (mode == "fan_in") return fan_in;
  if (mode == "fan_out") return fan_out;
  EMBER_THROW(ValueError, "init.", op, ": mode must be 'fan_in' or 'fan_out', got '", mode, "'");
}

}  // namespace

double calculate_gain(const std::string& nonlinearity, std::optional<double> param) {
  if (nonlinearity == "linear" || nonlinearity == "identity" || nonlinearity == "conv1d" ||
      nonlinearity == "conv2d" || nonlinearity == "conv3d" || nonlinearity == "conv_transpose1d" ||
      nonlinearity == "conv_transpose2d" || nonlinearity == "conv_transpose3d" || nonlinearity == "sigmoid") {
    return 1.0;
  }
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") {
    const double slope = param.value_or(0.01);
    return std::sqrt(2.0 / (1.0 + slope * slope));
  }
  if (nonlinearity == "selu") return 3.0 / 4.0;
  EMBER_THROW(ValueError, "init.calculate_gain: unsupported nonlinearity '", nonlinearity, "'");
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  EMBER_CHECK(t.defined(), ValueError, "init: undefined tensor");
  EMBER_CHECK(t.dim() >= 2, ValueError, "init: fan in and fan out can not be computed for a tensor with fewer than "
              "2 dimensions, got ", t.description());
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

Tensor uniform_(const Tensor& t, double a, double b) {
  check_random_target("uniform_", t);
  EMBER_CHECK(a <= b, ValueError, "init.uniform_: a = ", a, " must not exceed b = ", b);
  if (t.numel() == 0) return t;
  NoGradGuard no_grad;
  const Tensor r = ember::uniform(t.sizes(), a, b, TensorOptions(t.dtype(), t.device()));
  Tensor(t).copy_(r);
  return t;
}

Tensor normal_(const Tensor& t, double mean, double std) {
  check_random_target("normal_", t);
  EMBER_CHECK(std >= 0.0, ValueError, "init.normal_: std must be non-negative, got ", std);
  if (t.numel() == 0) return t;
  NoGradGuard no_grad;
  const Tensor r = ember::normal(t.sizes(), mean, std, TensorOptions(t.dtype(), t.device()));
  Tensor(t).copy_(r);
  return t;
}

Tensor constant_(const Tensor& t, double value) {
  EMBER_CHECK(t.defined(), ValueError, "init.constant_: undefined tensor");
  NoGradGuard no_grad;
  Tensor(t).fill_(value);
  return t;
}

Tensor zeros_(const Tensor& t) { return constant_(t, 0.0); }
Tensor ones_(const Tensor& t) { return constant_(t, 1.0); }

Tensor xavier_uniform_(const Tensor& t, double gain) {
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  if (t.numel() == 0) return t;
  const double a = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_(t, -a, a);
}

Tensor xavier_normal_(const Tensor& t, double gain) {
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  if (t.numel() == 0) return t;
  const double std = gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  return normal_(t, 0.0, std);
}

Tensor kaiming_uniform_(const Tensor& t, double a, const std::string& mode, const std::string& nonlinearity) {
  const int64_t fan = fan_for_mode(t, mode, "kaiming_uniform_");
  if (t.numel() == 0) return t;
  const double bound = calculate_gain(nonlinearity, a) * std::sqrt(3.0 / static_cast<double>(fan));
  return uniform_(t, -bound, bound);
}

Tensor kaiming_normal_(const Tensor& t, double a, const std::string& mode, const std::string& nonlinearity) {
  const int64_t fan = fan_for_mode(t, mode, "kaiming_normal_");
  if (t.numel() == 0) return t;
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan));
  return normal_(t, 0.0, std);
}

}  // namespace ember::nn::init
