// Dispatch stubs for the op set (DESIGN.md §3): the kernel signature each device implements.
// The front-end functions (ops_*.cpp) check arguments, promote dtypes, broadcast (inputs arrive expanded to the
// output shape), allocate outputs, then call the stub of the tensors' device. Kernels may assume:
//   * every tensor passed is on the same device and was checked for shape/dtype by the front end;
//   * outputs are freshly allocated, contiguous, and do not alias inputs;
//   * inputs may have any strides (including 0 for broadcast dims) unless the signature says "contiguous".
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ember/core/core_stubs.h"
#include "ember/core/dispatch.h"
#include "ember/core/meta_scope.h"
#include "ember/core/tensor.h"
#include "ember/memory/tags.h"

namespace ember {

// Note [Meta kernels]
// Meta tensors have no data, so the front ends run no kernel for them — except through a stub's Meta entry: a kernel
// whose CPU implementation allocates scratch tensors (packed operands, GEMM panels, im2col columns, f32 staging and
// accumulators: Note [Kernel workspace] in cpu/conv_pool.cpp) registers, for DeviceType::Meta, a function that
// allocates the same workspace on meta and computes nothing (cpu/meta_workspace.h). Inside a MetaAllocationScope a
// dry run then sees the workspace a CPU run takes; outside one the meta tensors are byte-free and cost nothing.
// A dry run that stands in for CUDA (Note [Dry-run targets] in core/meta_scope.h) replays the CUDA kernel's workspace
// instead, through the stub's CUDA replay (kernels/meta/); tests/kernels/test_cuda_replay.cpp holds the replays to
// hand-computed bytes and, on a GPU, to the CUDA allocator's measured peak.
// Front ends call kernels through run_kernel, which skips meta where the target's entry does not exist. Whatever the
// kernel allocates is scratch (its outputs were allocated by the front end), so it runs under
// memory::Phase::Workspace: the bytes stay with the running module, as "MODULE/workspace" (DESIGN.md §6).
template <class Fn, class... Args>
void run_kernel(const DispatchStub<Fn>& stub, Device device, Args&&... args) {
  Fn fn = nullptr;
  if (!device.is_meta()) fn = stub.get(device.type);
  else if (current_meta_target().is_cuda()) fn = stub.cuda_replay();
  else if (stub.has(DeviceType::Meta)) fn = stub.get(DeviceType::Meta);
  if (fn == nullptr) return;
  memory::PhaseScope workspace(memory::Phase::Workspace);
  fn(std::forward<Args>(args)...);
}

// ---- elementwise -------------------------------------------------------------------------------------------------
enum class UnaryOp : int8_t {
  Neg, Exp, Log, Sqrt, Rsqrt, Tanh, Sigmoid, Relu, GeluTanh, GeluErf, Silu, Abs,
  Clamp,     // min(max(x, p0), p1); a missing bound is +-inf
  PowScalar  // x ^ p0
};
struct UnaryParams {
  double p0 = 0.0, p1 = 0.0;
};
enum class BinaryOp : int8_t {
  Add, Sub, Mul, Div, Pow, Maximum, Minimum,
  Eq, Ne, Lt, Le, Gt, Ge  // comparisons: output dtype bool
};
inline bool is_comparison(BinaryOp op) { return op >= BinaryOp::Eq; }

// out = op(in); in and out share dtype: floating for every op; also the integer dtypes (u8, i8 to i64) for Neg, Abs,
// Relu and Clamp (Clamp's p0/p1 arrive saturated to the integer dtype's range; kernels convert them with convert.h).
using UnaryFn = void (*)(UnaryOp op, UnaryParams params, const Tensor& in, const Tensor& out);
// out = op(a, b), computed in op_math_t of the operand dtype (float for f16/bf16) with elementwise_math.h.
// Comparisons (Eq..Ge): a and b share one dtype (any, bool included); out is bool.
// Arithmetic ops: out has the result dtype (any; bool only for Add/Mul/Maximum/Minimum = or/and/or/and); a and b
// have out's dtype, except a Scalar operand: a 0-d tensor expanded to out's shape (all strides 0) whose dtype is
// out's compute dtype (op_math_dtype: f32 for f16/bf16 outputs, else out's dtype). Kernels load each operand with
// its own dtype into the compute type (Note [Scalar operands] in ops_elementwise.cpp).
using BinaryFn = void (*)(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);
// out = cond ? a : b; cond is bool; a, b, out share dtype.
using WhereFn = void (*)(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);

EMBER_DECLARE_STUB(unary, UnaryFn);
EMBER_DECLARE_STUB(binary, BinaryFn);
EMBER_DECLARE_STUB(where, WhereFn);

// ---- reductions -----------------------------------------------------------------------------------------------
enum class ReduceOp : int8_t { Sum, Mean, Max, Min, Var, ArgMax, ArgMin };
// out has the input's rank with reduced dims of size 1 (keepdim form; the front end squeezes).
// dims: sorted, unique, non-empty. Var uses `correction` (N - correction in the denominator).
// ArgMax/ArgMin: exactly one dim; out dtype i64; ties resolve to the first index; NaN wins (PyTorch semantics).
using ReduceFn = void (*)(ReduceOp op, const Tensor& in, const Tensor& out, const std::vector<int64_t>& dims,
                          int64_t correction);
EMBER_DECLARE_STUB(reduce, ReduceFn);

// ---- linear algebra ---------------------------------------------------------------------------------------------
// out[b] = a[b] @ bm[b] with a [B, M, K], bm [B, K, N], out [B, M, N] (contiguous); batch dims may have stride 0.
// accumulate: out[b] += a[b] @ bm[b], out's old value the first term of every sum (a linear layer's bias, Note
// [Bias inside the GEMM] in ops_linalg.cpp).
using BmmFn = void (*)(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate);
EMBER_DECLARE_STUB(bmm, BmmFn);
// out = x @ weight^T + bias for x [rows, in] (any strides), weight [out, in] (any strides), bias [out] and out
// [rows, out] (both contiguous), one dtype. Optional per device: ops::linear uses it where registered, else fills out
// with the bias rows and accumulates through bmm (Note [Bias inside the GEMM] in ops_linalg.cpp).
using LinearBiasFn = void (*)(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);
EMBER_DECLARE_STUB(linear_bias, LinearBiasFn);

// ---- normalisation and softmax ------------------------------------------------------------------------------
// Softmax (or log-softmax) along `dim` of a floating tensor.
using SoftmaxFn = void (*)(const Tensor& in, const Tensor& out, int64_t dim, bool log);
EMBER_DECLARE_STUB(softmax, SoftmaxFn);
// Layer norm over the trailing dims of x viewed as [rows, cols]: out = (x - mean) * rstd * weight + bias.
// weight/bias: [cols] or undefined. mean/rstd: [rows] f32 (f64 when x is f64), saved for the backward pass.
// weight, bias and out share a dtype: x's, or f32 for an f16/bf16 x (Note [Mixed layer norm] in ops_norm.cpp).
using LayerNormFn = void (*)(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& out,
                             const Tensor& mean, const Tensor& rstd);
EMBER_DECLARE_STUB(layer_norm, LayerNormFn);
// Residual add + layer norm (Note [Residual add and layer norm] in ops_norm.cpp): sum = x + residual rounded to x's
// dtype T (x and residual [rows, cols], any strides, one dtype or an f16/bf16 residual with an f32 x; sum fresh and
// contiguous, x's dtype), then layer_norm of sum with
// the layer_norm stub's conventions for weight, bias, out, mean and rstd.
using AddLayerNormFn = void (*)(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                                double eps, const Tensor& sum, const Tensor& out, const Tensor& mean,
                                const Tensor& rstd);
EMBER_DECLARE_STUB(add_layer_norm, AddLayerNormFn);
// Layer-norm backward over [rows, cols] views, in one kernel (Note [Fused layer-norm backward] in ops_norm.cpp): g is
// the output's gradient (out's dtype P), x the input (T; undefined when grad_x and grad_weight are), weight [cols]
// (P) or undefined, mean/rstd [rows] (S: f32, f64 for an f64 x) as the forward saved them. Writes whichever outputs
// are defined: grad_x [rows, cols] (T), grad_weight and grad_bias [cols] (P), all contiguous; rows may be 0 (the
// column sums are then 0). grad_add [rows, cols] (T, any strides) or undefined: added to grad_x before its rounding.
using LayerNormBackwardFn = void (*)(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                     const Tensor& rstd, const Tensor& grad_add, const Tensor& grad_x,
                                     const Tensor& grad_weight, const Tensor& grad_bias);
EMBER_DECLARE_STUB(layer_norm_backward, LayerNormBackwardFn);

// ---- bias + GELU ----------------------------------------------------------------------------------------------
// out = gelu(x + bias) (Note [Bias and GELU] in ops_bias_gelu.cpp): x [rows, cols] contiguous, bias [cols]
// contiguous, out fresh [rows, cols]; one floating dtype; the sum and the GELU in op_math_t, rounded once.
using BiasGeluFn = void (*)(const Tensor& x, const Tensor& bias, bool tanh_approx, const Tensor& out);
// grad_x = g * gelu'(x + bias) (rounded once) and grad_bias = its column sums (in op_math_t, or double on the CPU,
// from the unrounded products), whichever is defined; g and x [rows, cols] contiguous, bias [cols] contiguous; rows
// may be 0 (grad_bias is then 0).
using BiasGeluBackwardFn = void (*)(const Tensor& g, const Tensor& x, const Tensor& bias, bool tanh_approx,
                                    const Tensor& grad_x, const Tensor& grad_bias);
EMBER_DECLARE_STUB(bias_gelu, BiasGeluFn);
EMBER_DECLARE_STUB(bias_gelu_backward, BiasGeluBackwardFn);

// ---- embedding -----------------------------------------------------------------------------------------------
// out[i, :] = weight[indices[i], :]; weight [V, D]; indices (i32/i64, flattened) [N]; out [N, D]. IndexError if out of range.
using EmbeddingFn = void (*)(const Tensor& weight, const Tensor& indices, const Tensor& out);
// grad_weight[indices[i], :] += grad_out[i, :]; grad_weight [V, D] is accumulated into (not cleared).
using EmbeddingBackwardFn = void (*)(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_weight);
EMBER_DECLARE_STUB(embedding, EmbeddingFn);
EMBER_DECLARE_STUB(embedding_backward, EmbeddingBackwardFn);

// ---- convolution and pooling (NCHW) ---------------------------------------------------------------------------
struct Conv2dParams {
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  int64_t groups = 1;
};
// x [N, C, H, W], weight [O, C/groups, KH, KW], bias [O] or undefined, out [N, O, OH, OW].
using Conv2dFn = void (*)(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p,
                          const Tensor& out);
EMBER_DECLARE_STUB(conv2d, Conv2dFn);

struct Pool2dParams {
  int64_t kernel[2] = {2, 2};
  int64_t stride[2] = {2, 2};
  int64_t padding[2] = {0, 0};
  bool count_include_pad = true;  // avg pool only
};
// Max pool: out [N, C, OH, OW] and indices (i64, flat h*W+w within the plane, or undefined when not wanted).
using MaxPool2dFn = void (*)(const Tensor& x, const Pool2dParams& p, const Tensor& out, const Tensor& indices);
using AvgPool2dFn = void (*)(const Tensor& x, const Pool2dParams& p, const Tensor& out);
EMBER_DECLARE_STUB(max_pool2d, MaxPool2dFn);
EMBER_DECLARE_STUB(avg_pool2d, AvgPool2dFn);

// ---- dropout ----------------------------------------------------------------------------------------------------
// Element i (row-major over the contiguous out) is kept iff double(philox_uniform_element(seed, offset, i)) < 1 - p
// (compared in double on every device: in float the mask differs, e.g. at p = 0.3); dropped elements are exactly 0;
// kept elements are scaled by 1 / (1 - p). mask: bool, same shape (or undefined when not wanted).
using DropoutFn = void (*)(const Tensor& in, double p, uint64_t seed, uint64_t offset, const Tensor& out,
                           const Tensor& mask);
EMBER_DECLARE_STUB(dropout, DropoutFn);

// ---- backward kernels ----------------------------------------------------------------------------------------------
// The gradients the autograd layer needs that are not compositions of forward ops. Floating dtypes only; every
// gradient output arrives freshly allocated, contiguous and uninitialised: kernels write each of its elements.

// Whether unary_backward's `saved` is the forward output y (Exp, Tanh, Sigmoid, Sqrt, Rsqrt) rather than the forward
// input x (every other op). Autograd saves the tensor this names.
inline bool unary_backward_uses_output(UnaryOp op) {
  return op == UnaryOp::Exp || op == UnaryOp::Tanh || op == UnaryOp::Sigmoid || op == UnaryOp::Sqrt ||
         op == UnaryOp::Rsqrt;
}
// out = grad * d op(x)/dx, elementwise (kernels::unary_backward_fn in elementwise_math.h); grad, saved and out share
// shape and a floating dtype; params as the forward op got them (Clamp: a missing bound is +-inf).
using UnaryBackwardFn = void (*)(UnaryOp op, UnaryParams params, const Tensor& grad, const Tensor& saved,
                                 const Tensor& out);
EMBER_DECLARE_STUB(unary_backward, UnaryBackwardFn);

// Gradients of conv2d (no bias) for grad_out [N, O, OH, OW]: grad_x [N, C, H, W] and grad_w [O, C/groups, KH, KW],
// either undefined when not wanted. x is read only for grad_w and weight only for grad_x: the one not read is a
// meta-device placeholder of the right shape and dtype (it holds no bytes); the kernel takes only its sizes.
using Conv2dBackwardFn = void (*)(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                  const Conv2dParams& p, const Tensor& grad_x, const Tensor& grad_w);
EMBER_DECLARE_STUB(conv2d_backward, Conv2dBackwardFn);

// grad_in [N, C, H, W] = scatter-add of grad_out [N, C, OH, OW] at the i64 flat (h*W + w) plane indices of
// max_pool2d_with_indices (same shape as grad_out); an index outside [0, H*W) raises IndexError.
using MaxPool2dBackwardFn = void (*)(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_in);
// grad_in [N, C, H, W]: each grad_out element spread over its window's in-bounds inputs, divided by the forward's
// divisor (count_include_pad: the window clipped to the padded input; else its in-bounds elements).
using AvgPool2dBackwardFn = void (*)(const Tensor& grad_out, const Pool2dParams& p, const Tensor& grad_in);
EMBER_DECLARE_STUB(max_pool2d_backward, MaxPool2dBackwardFn);
EMBER_DECLARE_STUB(avg_pool2d_backward, AvgPool2dBackwardFn);

// ---- optimizer updates (in place) ---------------------------------------------------------------------------------
// torch.optim's single-tensor update rules applied to one parameter in one pass over memory (the element math and
// Note [Optimizer update rules] are in kernels/optim_math.h). param and grad share a floating dtype; the state
// tensors (momentum_buf, exp_avg, exp_avg_sq) are f32, or f64 for f64 params; every tensor is contiguous, has
// param's shape, lives on param's device and does not overlap the others. Math runs in op_math_t of param's dtype
// (f32 for f16/bf16); the double hyper-parameters are rounded to that type once per call.
struct SgdParams {
  double lr = 1e-3, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer is set to the (weight-decayed) grad instead of being updated
};
struct AdamParams {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decoupled = false;  // AdamW: p *= 1 - lr * weight_decay instead of g += weight_decay * p
  int64_t step = 1;        // the step being taken, counted from 1 (it sets the bias corrections)
};
// momentum_buf is undefined when momentum == 0 (and not read then).
using SgdStepFn = void (*)(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p);
using AdamStepFn = void (*)(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                            const AdamParams& p);
EMBER_DECLARE_STUB(sgd_step, SgdStepFn);
EMBER_DECLARE_STUB(adam_step, AdamStepFn);
// One Adam/AdamW update of many parameters in few launches (Note [Multi-tensor Adam] in ops_optim.cpp). Each entry
// is one adam_step call's operands, laid out as adam_step's; all entries share a device and a param dtype.
struct AdamStepEntry {
  Tensor param, grad, exp_avg, exp_avg_sq;
  AdamParams p;
};
using AdamStepMultiFn = void (*)(const std::vector<AdamStepEntry>& entries);
EMBER_DECLARE_STUB(adam_step_multi, AdamStepMultiFn);

// ---- mixed precision ---------------------------------------------------------------------------------------------
// outs[i] = grads[i] * inv_scale (outs[i] may be grads[i]); found_inf = 1 when a result is not finite. Every tensor
// contiguous, on one device; outs[i] has grads[i]'s numel; found_inf/inv_scale are 1-element f32.
using AmpUnscaleFn = void (*)(const std::vector<Tensor>& grads, const std::vector<Tensor>& outs,
                              const Tensor& found_inf, const Tensor& inv_scale);
using AmpUpdateScaleFn = void (*)(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                                  double growth_factor, double backoff_factor, int64_t growth_interval);
EMBER_DECLARE_STUB(amp_unscale, AmpUnscaleFn);
EMBER_DECLARE_STUB(amp_update_scale, AmpUpdateScaleFn);

// ---- fused softmax + cross-entropy over rows ---------------------------------------------------------------------
// Note [Fused cross-entropy]: logits [M, C] (contiguous, floating) and target [M] (i64, contiguous; every value is
// ignore_index or in [0, C): the front end checked). With s the label smoothing, lse_i = log sum_j e^(x_ij) and
// acc the accumulation dtype (f32 for f16/bf16 logits, else the logits' dtype):
//   forward:  loss[i] = lse_i - (1 - s) x_i,t - (s / C) sum_j x_ij   (0 for an ignored row); loss, lse [M] in acc;
//   backward: grad_logits[i, j] = grad_loss[i] (e^(x_ij - lse_i) - (1 - s) [j == t_i] - s / C)   (0 for an ignored
//             row); grad_loss [M] contiguous in acc, grad_logits [M, C] in the logits' dtype, every element written.
// The normalised logits (log-softmax) are never materialised: forward keeps two numbers per row, backward recomputes
// the probabilities from the logits and lse.
using CrossEntropyFn = void (*)(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                                const Tensor& loss, const Tensor& lse);
using CrossEntropyBackwardFn = void (*)(const Tensor& grad_loss, const Tensor& logits, const Tensor& target,
                                        const Tensor& lse, int64_t ignore_index, double smoothing,
                                        const Tensor& grad_logits);
EMBER_DECLARE_STUB(cross_entropy, CrossEntropyFn);
EMBER_DECLARE_STUB(cross_entropy_backward, CrossEntropyBackwardFn);

// ---- fused attention over packed q, k, v ---------------------------------------------------------------------------
// qkv [B, T, 3 C] (contiguous): q, k, v side by side, each [B, T, H, C / H]. With s_ij = q_i . k_j / sqrt(C / H) over
// the unmasked keys of row i (j <= i when causal, every j otherwise): out [B, T, C] = the heads' outputs
// sum_j e^(s_ij - lse_i) v_j side by side, and lse [B, H, T] = log sum_j e^(s_ij), in the accumulation dtype (f32 for
// f16/bf16 qkv, else qkv's). Backward: grad_out [B, T, C] (contiguous), qkv and lse -> grad_qkv [B, T, 3 C], every
// element written; the weights are recomputed as e^(s_ij - lse_i) (Note [Attention saves lse] in
// kernels/cpu/attention.cpp): nothing of size T x T outlives a call. `out` is the forward's output (contiguous, qkv's
// dtype) or undefined; a kernel may read it instead of recomputing it (the CUDA flash path does).
using AttentionFn = void (*)(const Tensor& qkv, int64_t n_head, bool causal, const Tensor& out, const Tensor& lse);
using AttentionBackwardFn = void (*)(const Tensor& grad_out, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                     int64_t n_head, bool causal, const Tensor& grad_qkv);
EMBER_DECLARE_STUB(attention, AttentionFn);
EMBER_DECLARE_STUB(attention_backward, AttentionBackwardFn);

}  // namespace ember
