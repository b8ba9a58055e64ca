// The differentiable op set users call: `ember::add`, `ember::matmul`, `a + b`, ... Each function runs the kernel
// front end (`ember::ops::*`, kernels/ops.h) and, when grad mode is on and an input requires grad, records a node
// holding what its backward formula needs (autograd/formulas_*.cpp). Non-differentiable ops (comparisons, argmax)
// are the kernel front ends themselves, re-exported here so every op is spelled `ember::name`.
#pragma once

#include <optional>
#include <vector>

#include "ember/kernels/ops.h"

namespace ember {

// ---- elementwise ---------------------------------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);
Tensor maximum(const Tensor& a, const Tensor& b);  // ties split the gradient evenly (PyTorch)
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, Scalar b);
Tensor sub(const Tensor& a, Scalar b);
Tensor mul(const Tensor& a, Scalar b);
Tensor div(const Tensor& a, Scalar b);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// ReLU written into x (Note [In-place ReLU]); returns x, which now has relu_'s history.
Tensor relu_(const Tensor& x);
// Whether an in-place op may write into x and nothing else sees it: x is contiguous, its storage is held by x alone
// (no view, alias, or tensor a node or a checkpoint saved), and it is neither a leaf that requires grad under grad
// mode nor an inference tensor outside InferenceMode. nn::ReLU(inplace) writes in place only then.
bool can_write_in_place(const Tensor& x);
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::None);
Tensor silu(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor cast(const Tensor& x, DType dtype);

using ops::eq;
using ops::ge;
using ops::gt;
using ops::le;
using ops::lt;
using ops::ne;

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator/(const Tensor& a, Scalar b);

// ---- reductions ----------------------------------------------------------------------------------------------
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);  // ties share evenly
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
using ops::argmax;
using ops::argmin;

// ---- linear algebra ------------------------------------------------------------------------------------------
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- softmax, normalisation ----------------------------------------------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// out is differentiable; mean and rstd are statistics (no gradient flows through them).
LayerNormResult layer_norm_with_stats(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                                      const Tensor& bias, double eps = 1e-5);
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// (x + residual, layer_norm(x + residual)) — the residual stream of a pre-norm transformer block and the normalised
// input of its next sub-layer — in one kernel forward and backward (ops::add_layer_norm_with_stats) when x and
// residual share dtype and shape; otherwise (broadcasting, mixed dtypes as under autocast) the composed add and
// layer_norm, with the same results. Differentiable in x, residual, weight and bias.
struct AddLayerNormOutputs {
  Tensor sum, out;
};
AddLayerNormOutputs add_layer_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                   const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), double eps = 1e-5);
// gelu(x + bias), bias [N] broadcast over x [..., N] (ops::bias_gelu): one pass forward, and backward one pass for
// x's gradient with the bias gradient's column sums. Under autocast the bias takes x's dtype (as linear's does).
Tensor bias_gelu(const Tensor& x, const Tensor& bias, GeluApprox approx = GeluApprox::None);

// Multi-head attention of a GPT block over its packed projection qkv [B, T, 3 C] -> [B, T, C] (ops::attention_qkv;
// Note [Fused attention] in kernels/cpu/attention.cpp); differentiable in qkv, where has_attention_kernel(device,
// dtype).
Tensor attention_qkv(const Tensor& qkv, int64_t n_head, bool causal);
using ops::has_attention_kernel;

// Per-row softmax + cross-entropy of logits [M, C] against i64 target [M] (ops::cross_entropy_rows; Note [Fused
// cross-entropy] in kernels/stubs.h): loss [M] (f32 for f16/bf16 logits), 0 on ignored rows; differentiable in
// logits. Devices where has_cross_entropy_kernel.
Tensor cross_entropy_rows(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing);
using ops::has_cross_entropy_kernel;

// ---- embedding, convolution, pooling, dropout ------------------------------------------------------------------
Tensor embedding(const Tensor& weight, const Tensor& indices);  // differentiable in weight
using ops::embedding_backward;
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv2dParams& p = {});
MaxPoolResult max_pool2d_with_indices(const Tensor& x, const Pool2dParams& p);  // indices: no gradient
Tensor max_pool2d(const Tensor& x, const Pool2dParams& p);
Tensor avg_pool2d(const Tensor& x, const Pool2dParams& p);
DropoutResult dropout_with_mask(const Tensor& x, double p, bool train = true);  // mask: no gradient
Tensor dropout(const Tensor& x, double p, bool train = true);

}  // namespace ember
