// nn::functional (torch.nn.functional; `namespace F = ember::nn::functional;` in user code): losses, batch norm and
// scaled dot-product attention composed from differentiable ember ops, so autograd derives every backward.
// Invariant: argument names, defaults and reduction semantics are PyTorch's; nothing here adds a kernel.
#pragma once

#include <cstdint>
#include <optional>

#include "ember/autograd/functions.h"

namespace ember::nn::functional {

// How a loss reduces its per-element values (PyTorch's reduction='none' | 'mean' | 'sum').
enum class Reduction { None, Mean, Sum };

// ---- losses --------------------------------------------------------------------------------------------------------
// input: unnormalised logits [N, C], [C] (target 0-d) or [N, C, d1, ...] (target [N, d1, ...]), class dim 1;
// target: i64 class indices in [0, C) or ignore_index. Ignored targets contribute 0 and are left out of the mean's
// denominator; label_smoothing eps gives (1 - eps) * nll + eps * mean over classes of -log p per non-ignored target.
// Mean over zero non-ignored targets is NaN (0/0), as in PyTorch. A target outside [0, C) other than ignore_index
// raises IndexError naming it (Note [Target check]).
Tensor cross_entropy(const Tensor& input, const Tensor& target, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, Reduction reduction = Reduction::Mean);
// input: log-probabilities with the layout cross_entropy takes; loss = -input[target] per non-ignored target.
Tensor nll_loss(const Tensor& input, const Tensor& target, int64_t ignore_index = -100,
                Reduction reduction = Reduction::Mean);
// (input - target)^2, reduced; input and target of the same shape (ShapeError otherwise: PyTorch broadcasts them
// with a warning, which turns a [N, 1] prediction against a [N] target into an [N, N] loss).
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

// ---- layers as functions ---------------------------------------------------------------------------------------
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor());
// Zeroes elements with probability p and scales the rest by 1/(1-p) when training; p outside [0, 1]: ValueError.
Tensor dropout(const Tensor& input, double p = 0.5, bool training = true);
// PyTorch's argument order: indices first, then the [num, dim] table.
Tensor embedding(const Tensor& input, const Tensor& weight);
Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
Tensor relu(const Tensor& input);
Tensor relu_(const Tensor& input);  // in place (Note [In-place ReLU] in autograd/formulas_elementwise.cpp)
Tensor gelu(const Tensor& input, GeluApprox approximate = GeluApprox::None);
Tensor silu(const Tensor& input);
Tensor softmax(const Tensor& input, int64_t dim);
Tensor log_softmax(const Tensor& input, int64_t dim);

// input [N, C, *]. training: normalises with the batch statistics over every dim but 1 (biased variance) and, when
// running_mean / running_var are defined, updates them in place without recording:
// running = (1 - momentum) * running + momentum * batch stat (unbiased variance for running_var).
// Not training: normalises with running_mean / running_var (ValueError when undefined).
// weight / bias [C] are optional.
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), bool training = false,
                  double momentum = 0.1, double eps = 1e-5);

// ---- attention -------------------------------------------------------------------------------------------------
// query [..., L, E], key [..., S, E], value [..., S, Ev] (leading dims broadcast, typically [B, H]) → [..., L, Ev]:
// softmax(q @ k^T * scale + mask) @ v with scale = 1/sqrt(E) unless given. attn_mask: bool (true = may attend) or
// floating (added to the scores), broadcast to [..., L, S]. is_causal: query i attends to keys j <= i (top-left
// aligned, as PyTorch); giving attn_mask too is a ValueError. Dropout on the attention weights is applied whenever
// dropout_p > 0, as in PyTorch: callers pass `training ? p : 0.0`.
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0.0,
                                    bool is_causal = false, std::optional<double> scale = std::nullopt);

}  // namespace ember::nn::functional
