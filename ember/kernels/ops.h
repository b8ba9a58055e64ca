// The op set: what users and the layers above call. Each function checks its arguments (typed errors naming the op,
// shapes, dtypes and devices), promotes dtypes, broadcasts, allocates the result and calls the kernel of the
// inputs' device through the dispatch table (stubs.h). No autograd here: these are `ember::ops::*`; the autograd
// layer (autograd/functions.h) defines the differentiable `ember::*` functions users call, which wrap these.
#pragma once

#include <optional>
#include <vector>

#include "ember/core/tensor.h"
#include "ember/kernels/stubs.h"

namespace ember {

enum class GeluApprox { None, Tanh };
struct LayerNormResult {
  Tensor out, mean, rstd;  // mean/rstd: shape of x without the normalised dims
};
struct LayerNormGrads {
  Tensor x, weight, bias;  // undefined where not asked for
};
struct AddLayerNormResult {
  Tensor sum, out, mean, rstd;  // sum = x + residual (x's sizes and dtype); out, mean, rstd: layer norm of sum
};
struct BiasGeluGrads {
  Tensor x, bias;  // undefined where not asked for
};
struct AttentionResult {
  Tensor out, lse;  // out [B, T, C]; lse [B, H, T], each query row's log-sum-exp, which backward reads
};
struct CrossEntropyResult {
  Tensor loss, lse;  // [M] each, in the accumulation dtype: the per-row loss and the row's log-sum-exp
};
struct MaxPoolResult {
  Tensor out, indices;
};
struct DropoutResult {
  Tensor out, mask;  // mask: bool
};

// ---- shared argument checks (used by every front end) ----------------------------------------------------------
// Throws DeviceError naming `op` unless all defined tensors are on one device; returns that device.
Device common_device(const char* op, std::initializer_list<const Tensor*> ts);
// Throws DTypeError naming `op` unless t is floating.
void check_floating(const char* op, const Tensor& t);

namespace ops {

// ---- elementwise (broadcasting, type promotion; f16/bf16 computed in f32) --------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);  // true division: integer inputs give f32
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
// Scalar operands take the tensor's dtype (a float scalar with an integer tensor gives f32), like PyTorch; their value
// is kept in the compute type (f32 for f16/bf16), not rounded to the tensor's dtype first.
Tensor add(const Tensor& a, Scalar b);
// a += b in place (b broadcast to a's shape and cast to a's dtype; a floating, non-overlapping and dense). Marks the
// write on a's version counter. Gradient accumulation uses it (Note [Gradient accumulation] in accumulate_grad.cpp).
void add_(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, Scalar b);
Tensor mul(const Tensor& a, Scalar b);
Tensor div(const Tensor& a, Scalar b);
// Comparisons with a scalar: bool results, compared in the dtype the rule above gives (an integer tensor against a
// floating scalar compares in f32, as in PyTorch).
Tensor eq(const Tensor& a, Scalar b);
Tensor ne(const Tensor& a, Scalar b);
Tensor lt(const Tensor& a, Scalar b);
Tensor le(const Tensor& a, Scalar b);
Tensor gt(const Tensor& a, Scalar b);
Tensor ge(const Tensor& a, Scalar b);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// relu into x itself (contiguous, not bool): no autograd bookkeeping; bumps x's version.
void relu_(const Tensor& x);
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::None);
Tensor silu(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);  // cond: bool; broadcasts all three
Tensor cast(const Tensor& x, DType dtype);                            // = x.to(dtype)


// ---- reductions (dims may be negative; empty dims = all dims) --------------------------------------------------
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);  // i64
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);  // i64

// ---- linear algebra -----------------------------------------------------------------------------------------
// PyTorch matmul semantics: 1-d x 1-d dot, 2-d x 2-d, batched with broadcast batch dims, 1-d promoted and squeezed.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);  // [B, M, K] x [B, K, N]
// y = x @ weight^T + bias, weight [out, in] (nn.Linear convention).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- softmax, normalisation ------------------------------------------------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
LayerNormResult layer_norm_with_stats(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                                      const Tensor& bias, double eps = 1e-5);
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// The gradients of layer_norm_with_stats (Note [Fused layer-norm backward] in ops_norm.cpp) from g, the gradient of
// its output (x's sizes, the output's dtype), and what the forward had: x, weight (or undefined: no affine scale) and
// the statistics mean/rstd. The last `normalized_dims` dims are the normalised ones. Returns the gradients of x (x's
// dtype), weight and bias (the output's dtype, the normalised shape), each only where its need_* flag is set; x, mean
// and rstd may be undefined when neither need_x nor need_weight is.
// grad_add (optional; x's sizes and dtype) is added to the gradient of x inside the kernel: the gradient a residual
// stream brings to the normalised tensor (add_layer_norm's backward), summed without a pass of its own.
LayerNormGrads layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, int64_t normalized_dims, bool need_x, bool need_weight,
                                   bool need_bias, const Tensor& grad_add = Tensor());
// Residual add + layer norm in one kernel (Note [Residual add and layer norm] in ops_norm.cpp): sum = x + residual
// (one shape, no broadcasting; one floating dtype, or an f16/bf16 residual with an f32 x), rounded to x's dtype, and
// the layer norm
// of sum as layer_norm_with_stats computes it — each element of x and residual read once.
AddLayerNormResult add_layer_norm_with_stats(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                             const Tensor& weight, const Tensor& bias, double eps = 1e-5);

// ---- bias + GELU ----------------------------------------------------------------------------------------------
// gelu(x + bias) in one pass (Note [Bias and GELU] in ops_bias_gelu.cpp): x [..., N] floating, bias [N] of x's dtype,
// broadcast over the leading dims; the sum is not rounded to x's dtype before the GELU (it is computed in the op's
// math type, as linear's bias epilogue followed by gelu would not — the difference is one rounding of x + bias).
Tensor bias_gelu(const Tensor& x, const Tensor& bias, GeluApprox approx = GeluApprox::None);
// Gradients of bias_gelu from g (x's sizes and dtype): x's = g * gelu'(x + bias), bias's = its sum over the leading
// dims, each only where its need_* flag is set.
BiasGeluGrads bias_gelu_backward(const Tensor& g, const Tensor& x, const Tensor& bias, GeluApprox approx, bool need_x,
                                 bool need_bias);

// ---- fused attention ----------------------------------------------------------------------------------------------
// Multi-head attention over the packed projection qkv [B, T, 3 C] of a GPT block (q, k, v side by side, n_head heads
// of C / n_head), scale 1 / sqrt(C / n_head): out [B, T, C] with the heads side by side, as y.transpose(1, 2)
// .reshape({B, T, C}) of scaled_dot_product_attention over the split heads, and lse [B, H, T] (f32 for f16/bf16
// qkv): backward recomputes the weights from it (Note [Attention saves lse] in kernels/cpu/attention.cpp). Devices
// and dtypes with the kernel: has_attention_kernel (CPU, CUDA and meta; every floating dtype); the composed ops
// elsewhere.
AttentionResult attention_qkv(const Tensor& qkv, int64_t n_head, bool causal);
// `out`, when given, is the forward's output (r.out): the backward may read it rather than recompute it.
Tensor attention_qkv_backward(const Tensor& grad_out, const Tensor& qkv, const Tensor& lse, int64_t n_head,
                              bool causal, const Tensor& out = Tensor());
bool has_attention_kernel(Device device, DType dtype);

// ---- fused softmax + cross-entropy (Note [Fused cross-entropy] in kernels/stubs.h) ---------------------------------
// Per-row loss of logits [M, C] (floating, any layout) against target [M] (i64; each ignore_index or in [0, C):
// IndexError otherwise, a host copy of the targets) with label smoothing s in [0, 1]: loss [M] and lse [M] in
// f32 for f16/bf16 logits, else the logits' dtype; ignored rows have loss 0. The backward takes grad_loss [M] (any
// floating dtype and layout) and returns grad_logits [M, C] in the logits' dtype. Devices with the kernel:
// has_cross_entropy_kernel (meta included: a dry run allocates what a real one does).
CrossEntropyResult cross_entropy_rows(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                      double smoothing);
// Whether the backward checks the targets' values (a host copy: one device synchronisation on a GPU) or takes them as
// checked (Note [Targets checked once]).
enum class TargetValues { check, checked };
Tensor cross_entropy_rows_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& target,
                                   const Tensor& lse, int64_t ignore_index, double smoothing,
                                   TargetValues values = TargetValues::check);
bool has_cross_entropy_kernel(Device device);

// ---- embedding ------------------------------------------------------------------------------------------------
Tensor embedding(const Tensor& weight, const Tensor& indices);  // out shape: indices.shape + [D]
// Returns grad_weight [V, D] = scatter-add of grad_out rows at indices.
Tensor embedding_backward(const Tensor& grad_out, const Tensor& indices, int64_t num_weights);

// ---- convolution, pooling ------------------------------------------------------------------------------------------
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv2dParams& p = {});
MaxPoolResult max_pool2d_with_indices(const Tensor& x, const Pool2dParams& p);
Tensor max_pool2d(const Tensor& x, const Pool2dParams& p);
Tensor avg_pool2d(const Tensor& x, const Pool2dParams& p);

// ---- dropout -------------------------------------------------------------------------------------------------------
// Draws from the default generator (Note [Philox stream]); train=false returns x unchanged.
DropoutResult dropout_with_mask(const Tensor& x, double p, bool train = true);
Tensor dropout(const Tensor& x, double p, bool train = true);

// ---- backward ops (the gradients autograd cannot compose from forward ops) -----------------------------------------
// grad * d op(x)/dx; saved is the forward output when unary_backward_uses_output(op), else the forward input.
// grad and saved: one shape, one floating dtype. params as the forward got them (see clamp and pow above).
Tensor unary_backward(UnaryOp op, UnaryParams params, const Tensor& grad, const Tensor& saved);
// Gradients of conv2d(x, weight, bias, p) with respect to x (of input_shape) and weight (of weight_shape).
// The bias gradient is grad_out summed over N, H, W.
Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Shape& input_shape,
                             const Conv2dParams& p = {});
Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Shape& weight_shape,
                              const Conv2dParams& p = {});
// grad_out and indices as returned by max_pool2d_with_indices on an input of input_shape.
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape);
Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, const Pool2dParams& p);

// ---- optimizer updates (in place; kernels/stubs.h: SgdParams, AdamParams) -----------------------------------------
// One torch.optim step of one parameter, written into param and its state tensors (see the stubs for the layout:
// contiguous, state in f32, or f64 for f64 params). Bumps the version counter of every tensor written. Raises
// ShapeError/DTypeError/DeviceError/ValueError for mismatched or non-contiguous tensors, and ValueError when param
// requires grad while grad mode is on (run optimizer steps under NoGradGuard).
void sgd_step_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p);
void adam_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamParams& p);
// adam_step_ for many parameters at once, with the same checks and the same result per entry (Note [Multi-tensor
// Adam] in ops_optim.cpp): on a device with a multi-tensor kernel (CUDA), the entries of one dtype are updated in a
// few launches; elsewhere one adam_step_ kernel per entry.
void adam_step_multi_(const std::vector<AdamStepEntry>& entries);
// The dtype optimizer state takes for a parameter of dtype `param_dtype`: f64 for f64, else f32.
DType optimizer_state_dtype(DType param_dtype);

// ---- mixed precision (kernels/stubs.h: AmpUnscaleFn, AmpUpdateScaleFn) ----------------------------------------------
// PyTorch's _amp_foreach_non_finite_check_and_unscale_, with an optional destination: for each i, out[i] = grads[i]
// * inv_scale computed in f32 (f64 for f64 grads) and rounded to out[i]'s dtype, and found_inf is set to 1 when any
// element of any result is NaN or inf (it is never reset to 0 here: callers zero it once per step). `outs` empty
// means in place (out[i] = grads[i]); otherwise outs[i] has grads[i]'s shape, is contiguous, is floating (f32 for
// the master gradients of f16/bf16 weights) and does not overlap grads[i]. found_inf and inv_scale are 1-element
// f32 tensors on the grads' device. Every tensor written has its version counter bumped. DeviceError when the
// tensors are on different devices, DTypeError for non-floating grads, ShapeError for mismatched shapes.
void amp_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf, const Tensor& inv_scale,
                  const std::vector<Tensor>& outs = {});
// PyTorch's _amp_update_scale_ (GradScaler's dynamic loss scale, on the scale's device without a host sync):
//   found_inf > 0:  scale *= backoff_factor, growth_tracker = 0
//   otherwise:      growth_tracker += 1; when it reaches growth_interval: scale *= growth_factor (kept if the
//                   product is not finite), growth_tracker = 0.
// scale: 1-element f32; growth_tracker: 1-element i32; found_inf: 1-element f32; all on one device.
void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval);

}  // namespace ops
}  // namespace ember
