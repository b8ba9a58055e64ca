// ember::nn::init — in-place parameter initialisation with PyTorch's schemes and formulas (torch.nn.init).
// Invariant: every function writes under NoGradGuard and draws only from ember's Philox default generator (the
// uniform/normal factories), so manual_seed(s) makes a model's initial weights reproducible on every device.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "ember/core/tensor.h"

namespace ember::nn::init {

// The recommended gain for a nonlinearity (torch.nn.init.calculate_gain): "linear", "identity", "conv1d", "conv2d",
// "conv3d", "conv_transpose1d/2d/3d", "sigmoid" -> 1; "tanh" -> 5/3; "relu" -> sqrt(2); "leaky_relu" ->
// sqrt(2 / (1 + slope^2)) with slope = param (default 0.01); "selu" -> 3/4. Anything else: ValueError.
double calculate_gain(const std::string& nonlinearity, std::optional<double> param = std::nullopt);

// (fan_in, fan_out) of a weight: fan_in = size(1) * receptive field, fan_out = size(0) * receptive field, where the
// receptive field is the product of the sizes after the first two (1 for a 2-d tensor). Fewer than 2 dims:
// ValueError (PyTorch's _calculate_fan_in_and_fan_out).
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);

// Each returns t, filled in place. Random fills need a floating t (DTypeError otherwise); a zero-element t is left
// as it is.
Tensor uniform_(const Tensor& t, double a = 0.0, double b = 1.0);
Tensor normal_(const Tensor& t, double mean = 0.0, double std = 1.0);
Tensor constant_(const Tensor& t, double value);
Tensor zeros_(const Tensor& t);
Tensor ones_(const Tensor& t);

// Glorot: U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)); N(0, std) with std = gain * sqrt(2 / (fan_in +
// fan_out)).
Tensor xavier_uniform_(const Tensor& t, double gain = 1.0);
Tensor xavier_normal_(const Tensor& t, double gain = 1.0);

// He: with fan = fan_in or fan_out (mode "fan_in" | "fan_out") and gain = calculate_gain(nonlinearity, a):
// U(-bound, bound), bound = gain * sqrt(3 / fan); N(0, std), std = gain / sqrt(fan). PyTorch's defaults (a = 0,
// "fan_in", "leaky_relu"). nn.Linear and nn.Conv2d use kaiming_uniform_(w, sqrt(5)), i.e. bound 1 / sqrt(fan_in).
Tensor kaiming_uniform_(const Tensor& t, double a = 0.0, const std::string& mode = "fan_in",
                        const std::string& nonlinearity = "leaky_relu");
Tensor kaiming_normal_(const Tensor& t, double a = 0.0, const std::string& mode = "fan_in",
                       const std::string& nonlinearity = "leaky_relu");

}  // namespace ember::nn::init
