// Front ends for the neural-network ops: embedding (+ backward), conv2d, max/avg pool2d and dropout.
// Each checks its arguments (typed errors naming op, shapes, dtypes), allocates a fresh contiguous output and calls
// the kernel of the inputs' device; meta tensors get their outputs' shapes without running a kernel.
#include <cmath>
#include <string>

#include "ember/core/generator.h"
#include "ember/core/philox.h"
#include "ember/kernels/ops.h"

namespace ember {

EMBER_DEFINE_STUB(embedding, EmbeddingFn);
EMBER_DEFINE_STUB(embedding_backward, EmbeddingBackwardFn);
EMBER_DEFINE_STUB(conv2d, Conv2dFn);
EMBER_DEFINE_STUB(max_pool2d, MaxPool2dFn);
EMBER_DEFINE_STUB(avg_pool2d, AvgPool2dFn);
EMBER_DEFINE_STUB(dropout, DropoutFn);

namespace ops {

namespace {

void check_index_dtype(const char* op, const Tensor& indices) {
  EMBER_CHECK(indices.dtype() == DType::i32 || indices.dtype() == DType::i64, DTypeError, op,
              ": indices must be i32 or i64, got ", indices.description());
}

std::string pair_str(const int64_t v[2]) { return detail::concat("(", v[0], ", ", v[1], ")"); }

// The (OH, OW) of a pooling window sweep; checks the parameters against x [N, C, H, W].
void pool_output_size(const char* op, const Tensor& x, const Pool2dParams& p, int64_t& oh, int64_t& ow) {
  EMBER_CHECK(x.dim() == 4, ShapeError, op, ": expects x of shape [N, C, H, W], got ", x.description());
  check_floating(op, x);
  for (int d = 0; d < 2; ++d) {
    EMBER_CHECK(p.kernel[d] > 0, ValueError, op, ": kernel size must be positive, got ", pair_str(p.kernel));
    EMBER_CHECK(p.stride[d] > 0, ValueError, op, ": stride must be positive, got ", pair_str(p.stride));
    EMBER_CHECK(p.padding[d] >= 0 && 2 * p.padding[d] <= p.kernel[d], ValueError, op,
                ": padding must be between 0 and half the kernel size, got padding ", pair_str(p.padding),
                " for kernel ", pair_str(p.kernel));
  }
  const int64_t h = x.size(2), w = x.size(3);
  oh = (h + 2 * p.padding[0] - p.kernel[0]) / p.stride[0] + 1;
  ow = (w + 2 * p.padding[1] - p.kernel[1]) / p.stride[1] + 1;
  // Integer division truncates toward zero; a negative numerator must give a non-positive size.
  if (h + 2 * p.padding[0] - p.kernel[0] < 0) oh = 0;
  if (w + 2 * p.padding[1] - p.kernel[1] < 0) ow = 0;
  EMBER_CHECK(oh > 0 && ow > 0, ShapeError, op, ": input ", x.description(), " is too small for kernel ",
              pair_str(p.kernel), " with padding ", pair_str(p.padding), " (output size ", oh, "x", ow, ")");
}

}  // namespace

// ---- embedding ------------------------------------------------------------------------------------------------

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  const char* op = "embedding";
  const Device dev = common_device(op, {&weight, &indices});
  EMBER_CHECK(weight.dim() == 2, ShapeError, op, ": expects weight of shape [V, D], got ", weight.description());
  check_index_dtype(op, indices);
  const int64_t n = indices.numel(), d = weight.size(1);
  Shape out_shape = indices.sizes();
  out_shape.push_back(d);
  Tensor out = empty({n, d}, {weight.dtype(), dev});
  // run_kernel: the indices' reshape (a copy when strided) is made on meta too (Note [Meta kernels]).
  if (n > 0 && d > 0) run_kernel(embedding_stub, dev, weight, indices.reshape({n}), out);
  return out.view(out_shape);
}

Tensor embedding_backward(const Tensor& grad_out, const Tensor& indices, int64_t num_weights) {
  const char* op = "embedding_backward";
  const Device dev = common_device(op, {&grad_out, &indices});
  check_index_dtype(op, indices);
  check_floating(op, grad_out);
  EMBER_CHECK(num_weights >= 0, ValueError, op, ": num_weights must be non-negative, got ", num_weights);
  EMBER_CHECK(grad_out.dim() == indices.dim() + 1, ShapeError, op, ": grad_out ", grad_out.description(),
              " must have the indices' shape ", shape_str(indices.sizes()), " plus one trailing dim");
  for (int64_t k = 0; k < indices.dim(); ++k)
    EMBER_CHECK(grad_out.size(k) == indices.size(k), ShapeError, op, ": grad_out ", grad_out.description(),
                " does not match indices shape ", shape_str(indices.sizes()));
  const int64_t n = indices.numel(), d = grad_out.size(-1);
  Tensor grad_weight = zeros({num_weights, d}, {grad_out.dtype(), dev});
  if (n > 0 && d > 0)  // Note [Meta kernels]: workspace on meta
    run_kernel(embedding_backward_stub, dev, grad_out.reshape({n, d}), indices.reshape({n}), grad_weight);
  return grad_weight;
}

// ---- convolution --------------------------------------------------------------------------------------------------

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p) {
  const char* op = "conv2d";
  const Device dev = common_device(op, {&x, &weight, &bias});
  EMBER_CHECK(x.dim() == 4, ShapeError, op, ": expects x of shape [N, C, H, W], got ", x.description());
  EMBER_CHECK(weight.dim() == 4, ShapeError, op, ": expects weight of shape [O, C/groups, KH, KW], got ",
              weight.description());
  check_floating(op, x);
  EMBER_CHECK(weight.dtype() == x.dtype(), DTypeError, op, ": x ", x.description(), " and weight ",
              weight.description(), " must have the same dtype");
  if (bias.defined()) {
    EMBER_CHECK(bias.dtype() == x.dtype(), DTypeError, op, ": x ", x.description(), " and bias ", bias.description(),
                " must have the same dtype");
  }
  EMBER_CHECK(p.groups > 0, ValueError, op, ": groups must be positive, got ", p.groups);
  for (int d = 0; d < 2; ++d) {
    EMBER_CHECK(p.stride[d] > 0, ValueError, op, ": stride must be positive, got ", pair_str(p.stride));
    EMBER_CHECK(p.dilation[d] > 0, ValueError, op, ": dilation must be positive, got ", pair_str(p.dilation));
    EMBER_CHECK(p.padding[d] >= 0, ValueError, op, ": padding must be non-negative, got ", pair_str(p.padding));
  }
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t o = weight.size(0), kh = weight.size(2), kw = weight.size(3);
  EMBER_CHECK(weight.size(1) * p.groups == c, ShapeError, op, ": x ", x.description(), " has ", c,
              " channels but weight ", weight.description(), " with groups=", p.groups, " expects ",
              weight.size(1) * p.groups);
  EMBER_CHECK(o % p.groups == 0, ShapeError, op, ": out channels ", o, " of weight ", weight.description(),
              " are not divisible by groups=", p.groups);
  EMBER_CHECK(kh > 0 && kw > 0, ShapeError, op, ": weight ", weight.description(), " has an empty kernel");
  if (bias.defined()) {
    EMBER_CHECK(bias.dim() == 1 && bias.size(0) == o, ShapeError, op, ": bias ", bias.description(),
                " must have shape [", o, "]");
  }
  const int64_t num_h = h + 2 * p.padding[0] - p.dilation[0] * (kh - 1) - 1;
  const int64_t num_w = w + 2 * p.padding[1] - p.dilation[1] * (kw - 1) - 1;
  const int64_t oh = num_h < 0 ? 0 : num_h / p.stride[0] + 1;
  const int64_t ow = num_w < 0 ? 0 : num_w / p.stride[1] + 1;
  EMBER_CHECK(oh > 0 && ow > 0, ShapeError, op, ": input ", x.description(), " is too small for kernel ", kh, "x",
              kw, " with padding ", pair_str(p.padding), " and dilation ", pair_str(p.dilation), " (output size ",
              oh, "x", ow, ")");
  Tensor out = empty({n, o, oh, ow}, {x.dtype(), dev});
  if (out.numel() > 0) run_kernel(conv2d_stub, dev, x, weight, bias, p, out);  // Note [Meta kernels]
  return out;
}

// ---- pooling ------------------------------------------------------------------------------------------------------

namespace {

// The one max-pool front end: indices are allocated and filled only when wanted (else left undefined).
MaxPoolResult max_pool2d_impl(const Tensor& x, const Pool2dParams& p, bool want_indices) {
  int64_t oh = 0, ow = 0;
  pool_output_size("max_pool2d", x, p, oh, ow);
  const Device dev = x.device();
  const Shape shape{x.size(0), x.size(1), oh, ow};
  MaxPoolResult r{empty(shape, {x.dtype(), dev}), want_indices ? empty(shape, {DType::i64, dev}) : Tensor()};
  if (r.out.numel() > 0 && !dev.is_meta()) max_pool2d_stub.get(dev.type)(x, p, r.out, r.indices);
  return r;
}

}  // namespace

MaxPoolResult max_pool2d_with_indices(const Tensor& x, const Pool2dParams& p) {
  return max_pool2d_impl(x, p, /*want_indices=*/true);
}

Tensor max_pool2d(const Tensor& x, const Pool2dParams& p) { return max_pool2d_impl(x, p, /*want_indices=*/false).out; }

Tensor avg_pool2d(const Tensor& x, const Pool2dParams& p) {
  int64_t oh = 0, ow = 0;
  pool_output_size("avg_pool2d", x, p, oh, ow);
  const Device dev = x.device();
  Tensor out = empty({x.size(0), x.size(1), oh, ow}, {x.dtype(), dev});
  if (out.numel() > 0 && !dev.is_meta()) avg_pool2d_stub.get(dev.type)(x, p, out);
  return out;
}

// ---- dropout ------------------------------------------------------------------------------------------------------

namespace {

DropoutResult dropout_impl(const Tensor& x, double p, bool train, bool want_mask) {
  const char* op = "dropout";
  EMBER_CHECK(p >= 0.0 && p <= 1.0, ValueError, op, ": probability must be in [0, 1], got ", p);
  check_floating(op, x);
  const Device dev = x.device();
  if (!train || p == 0.0) return {x, want_mask ? ones(x.sizes(), {DType::b8, dev}) : Tensor()};
  Tensor out = empty(x.sizes(), {x.dtype(), dev});
  Tensor mask = want_mask ? empty(x.sizes(), {DType::b8, dev}) : Tensor();
  // Note [Philox stream]: the generator advances by exactly the counters this draw uses. A meta tensor draws
  // nothing, so shape-only planning passes leave the random stream of the real run untouched.
  if (dev.is_meta()) return {out, mask};
  const PhiloxState st = default_generator().reserve(philox_uniform_counters(static_cast<uint64_t>(x.numel())));
  if (x.numel() > 0) dropout_stub.get(dev.type)(x, p, st.seed, st.offset, out, mask);
  return {out, mask};
}

}  // namespace

DropoutResult dropout_with_mask(const Tensor& x, double p, bool train) { return dropout_impl(x, p, train, true); }

Tensor dropout(const Tensor& x, double p, bool train) { return dropout_impl(x, p, train, false).out; }

}  // namespace ops
}  // namespace ember
