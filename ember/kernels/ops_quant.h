// Int8 quantization ops: symmetric per-output-channel weight quantization, and the linear / conv2d ops that run on
// the int8 weights (weight-only with the weights dequantized block by block inside the kernel, or int8 x int8 with
// int32 accumulation on per-tensor quantized activations). Invariant: q * scale reproduces each weight within
// scale / 2 (Note [Symmetric per-channel int8]); no op here ever holds a whole dequantized Linear weight.
#pragma once

#include <cstdint>
#include <optional>

#include "ember/core/tensor.h"
#include "ember/kernels/stubs.h"

namespace ember {

// Note [Symmetric per-channel int8]
// Row o of a weight [O, ...] (everything after dim 0 flattened: R elements) is stored as int8 q[o, r] in [-127, 127]
// and one f32 scale[o] = max_r |w[o, r]| / 127 (computed in f32), so that w ~ q * scale:
//   q[o, r] = clamp(round_half_even(w[o, r] / scale[o]), -127, 127)   (the quotient in f64, std::nearbyint)
// -128 is never used, so the range is symmetric and negation is exact. A row whose scale would be 0 (all zeros, or
// a maximum so small that max / 127 underflows f32) gets scale 1: its q are 0 and it dequantizes to exact zeros
// (error <= its max, below 1e-43). For every element |q * scale - w| <= scale / 2 (exact arithmetic; the f32 product
// adds one rounding). Non-finite weights, and f64 rows with a maximum beyond f32's range, are rejected (ValueError).
// Dequantized weight bytes: an f32 [O, R] weight (4*O*R bytes) becomes O*R + 4*O bytes.

// The int32 accumulation of int8_dynamic_linear holds sum_k qx * qw with |qx| <= 127 (activations are clamped) and
// |qw| <= 128 (quantize never writes -128, but a weight loaded from a file may hold it): it cannot overflow for
// K <= this bound (= floor((2^31 - 1) / (127 * 128)) = 132,104).
inline constexpr int64_t kInt8DotMaxK = 2147483647LL / (127 * 128);

// The weight-only kernel dequantizes tiles of the weight of at most this many bytes of f32 (f64 for an f64 input)
// at a time (Note [Blocked dequantization] in cpu/quant_kernels.cpp).
inline constexpr int64_t kInt8DequantBlockBytes = 256 * 1024;

// ---- kernel signatures (CPU kernels in kernels/cpu/quant_kernels.cpp) -----------------------------------------------
// w [O, R] (contiguous, any floating dtype) -> q [O, R] i8 and scale [O] f32, both fresh and contiguous.
using QuantizePerChannelFn = void (*)(const Tensor& w, const Tensor& q, const Tensor& scale);
// out [O, R] (contiguous floating, fresh) = q [O, R] i8 * scale [O] f32, the product in f32 (exact f64 for an f64
// out) rounded to out's dtype.
using DequantizePerChannelFn = void (*)(const Tensor& q, const Tensor& scale, const Tensor& out);
// out [M, N] = x [M, K] (contiguous, floating) @ (q [N, K] i8 * scale [N] f32)^T + bias [N] f32 (or undefined).
// out has x's dtype; f16/bf16 compute in f32, f64 in f64.
using Int8WeightLinearFn = void (*)(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias,
                                    const Tensor& out);
// out [M, N] f32 = (sum_k qx[m, k] * q[n, k]) * act_scale * scale[n] + bias[n], where qx = clamp(round_half_even(
// x / act_scale), -127, 127) and x [M, K] is contiguous f32. dynamic: act_scale = max|x| / 127 over the whole x
// (1 when x is all zeros), the given act_scale is ignored; otherwise act_scale (> 0, finite) is used as given.
// K <= kInt8DotMaxK (checked by the front end).
using Int8DynamicLinearFn = void (*)(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias,
                                     bool dynamic, float act_scale, const Tensor& out);

EMBER_DECLARE_STUB(quantize_per_channel, QuantizePerChannelFn);
EMBER_DECLARE_STUB(dequantize_per_channel, DequantizePerChannelFn);
EMBER_DECLARE_STUB(int8_weight_linear, Int8WeightLinearFn);
EMBER_DECLARE_STUB(int8_dynamic_linear, Int8DynamicLinearFn);

struct QuantizedPerChannel {
  Tensor q;      // i8, the weight's shape
  Tensor scale;  // f32 [O]
};

namespace ops {

// Symmetric per-output-channel int8 quantization of a floating weight [O, ...] (>= 1 dim; Note [Symmetric
// per-channel int8]). DTypeError for a non-floating w, ShapeError for a 0-d one, ValueError for NaN/inf values.
QuantizedPerChannel quantize_per_channel_symmetric(const Tensor& w);
// q [O, ...] i8 times scale [O] (any floating dtype, read as f32) -> a tensor of q's shape and `dtype` (floating).
Tensor dequantize_per_channel(const Tensor& q, const Tensor& scale, DType dtype = DType::f32);

// x [..., K] @ W^T + bias with W = q [N, K] i8 * scale [N], dequantized kernel-side kInt8DequantBlockBytes at a
// time. x: f32, f64, f16 or bf16 (the result has x's dtype); scale and bias: [N], any floating dtype (used as f32,
// f64 for an f64 x); bias may be undefined.
Tensor int8_weight_linear(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias = Tensor());
// The same product on int8 activations: x [..., K] f32 quantized per tensor (symmetric, act_scale = max|x| / 127 of
// this x when act_scale is nullopt — dynamic — else the given calibrated value — static — with values beyond
// +-127 * act_scale clamped), int8 x int8 products accumulated in int32, result f32 (see Int8DynamicLinearFn).
// ValueError when K > kInt8DotMaxK or act_scale is not a positive finite number.
Tensor int8_dynamic_linear(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias = Tensor(),
                           std::optional<float> act_scale = std::nullopt);
// conv2d(x, q * scale, bias, p): the whole weight [O, C/groups, KH, KW] is dequantized into a temporary of x's dtype
// for the call (conv weights are small), then the conv2d op runs.
Tensor int8_weight_conv2d(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias = Tensor(),
                          const Conv2dParams& p = {});

}  // namespace ops
}  // namespace ember
