// Linear-algebra front ends: matmul (PyTorch semantics), bmm and linear, all lowered onto the one bmm kernel.
// Invariant: the kernel sees a [B, M, K] and b [B, K, N] views of one floating dtype (batch stride 0 where a side
// broadcasts) and a fresh contiguous out [B, M, N]; the front end reshapes that result back to the user's shape.
#include "ember/kernels/ops.h"

namespace ember {

EMBER_DEFINE_STUB(bmm, BmmFn);
EMBER_DEFINE_STUB(linear_bias, LinearBiasFn);

namespace ops {

namespace {

void check_operands(const char* op, const Tensor& a, const Tensor& b) {
  common_device(op, {&a, &b});
  EMBER_CHECK(a.dtype() == b.dtype(), DTypeError, op, ": both operands must have one dtype, got ", a.description(),
              " and ", b.description());
  check_floating(op, a);
  EMBER_CHECK(a.dim() > 0 && b.dim() > 0, ShapeError, op, ": both operands need at least 1 dim, got ",
              a.description(), " and ", b.description());
}

// a [B, M, K] x b [B, K, N] -> fresh contiguous [B, M, N]; shapes already checked.
Tensor run_bmm(const Tensor& a, const Tensor& b) {
  Tensor out = empty({a.size(0), a.size(1), b.size(2)}, TensorOptions(a.dtype(), a.device()));
  if (out.numel() > 0) run_kernel(bmm_stub, a.device(), a, b, out, false);  // Note [Meta kernels]: workspace on meta
  return out;
}

}  // namespace

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_operands("bmm", a, b);
  EMBER_CHECK(a.dim() == 3 && b.dim() == 3, ShapeError, "bmm: expects 3-d operands [B, M, K] and [B, K, N], got ",
              a.description(), " and ", b.description());
  EMBER_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), ShapeError, "bmm: shapes ", shape_str(a.sizes()),
              " and ", shape_str(b.sizes()), " cannot be multiplied (expected [B, M, K] x [B, K, N])");
  return run_bmm(a, b);
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_operands("matmul", a, b);
  const int64_t ka = a.size(-1);
  const int64_t kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  EMBER_CHECK(ka == kb, ShapeError, "matmul: shapes ", shape_str(a.sizes()), " and ", shape_str(b.sizes()),
              " cannot be multiplied (inner dims ", ka, " and ", kb, " differ)");
  const int64_t K = ka;

  if (b.dim() <= 2) {
    // Fold every leading dim of a into M: one GEMM, no broadcast copy of b.
    const Tensor b2 = b.dim() == 1 ? b.view({K, 1}) : b;
    const int64_t N = b2.size(1);
    const Tensor a2 = a.reshape({numel_of(Shape(a.sizes().begin(), a.sizes().end() - 1)), K});
    Tensor out = run_bmm(a2.unsqueeze(0), b2.unsqueeze(0));  // [1, M, N]
    Shape shape(a.sizes().begin(), a.sizes().end() - 1);      // a's leading dims (and M when a is not 1-d)
    if (b.dim() == 2) shape.push_back(N);
    return out.view(shape);
  }

  // b has >= 3 dims: broadcast the batch dims of both sides.
  const Tensor a2 = a.dim() == 1 ? a.view({1, K}) : a;
  const int64_t M = a2.size(-2), N = b.size(-1);
  const Shape a_batch(a2.sizes().begin(), a2.sizes().end() - 2);
  const Shape b_batch(b.sizes().begin(), b.sizes().end() - 2);
  const Shape batch = broadcast_shapes(a_batch, b_batch, "matmul");
  const int64_t B = numel_of(batch);
  Shape a_full = batch, b_full = batch;
  a_full.insert(a_full.end(), {M, K});
  b_full.insert(b_full.end(), {K, N});
  // reshape keeps broadcast (stride-0) batch dims as views when they merge, else packs a copy.
  const Tensor a3 = a2.expand(a_full).reshape({B, M, K});
  const Tensor b3 = b.expand(b_full).reshape({B, K, N});
  Tensor out = run_bmm(a3, b3);
  Shape shape = batch;
  if (a.dim() > 1) shape.push_back(M);
  shape.push_back(N);
  return out.view(shape);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  common_device("linear", {&x, &weight, &bias});
  EMBER_CHECK(weight.dim() == 2, ShapeError, "linear: weight must be 2-d [out_features, in_features], got ",
              weight.description());
  EMBER_CHECK(x.dim() > 0 && x.size(-1) == weight.size(1), ShapeError, "linear: input ", shape_str(x.sizes()),
              " does not end in in_features ", weight.size(1), " of weight ", shape_str(weight.sizes()));
  EMBER_CHECK(x.dtype() == weight.dtype(), DTypeError, "linear: input and weight must have one dtype, got ",
              x.description(), " and ", weight.description());
  if (bias.defined()) {
    EMBER_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), ShapeError, "linear: bias must be [",
                weight.size(0), "] for weight ", shape_str(weight.sizes()), ", got ", bias.description());
    EMBER_CHECK(bias.dtype() == x.dtype(), DTypeError, "linear: bias dtype must match the input, got ",
                bias.description(), " and ", x.description());
  }
  if (!bias.defined()) return matmul(x, weight.t());
  // Note [Bias inside the GEMM]
  // y = x W^T + bias is one GEMM into an output that starts as the bias rows, with the product accumulated into it:
  // the bias is the first term of every sum (one rounding for f16/bf16, whose GEMM runs in f32), the result is
  // written once, and no [rows, out] product is held beside the biased copy — matmul then add held both at once.
  // A device registering linear_bias adds the bias inside its GEMM instead (CUDA: cuBLASLt's bias epilogue, which
  // adds it in f32 before the one store; Note [Bias epilogue] in cuda/blas.cu): there the fill above would be a pass
  // over the output in device memory, read back by the GEMM.
  const int64_t in = weight.size(1), out_features = weight.size(0);
  const Shape lead(x.sizes().begin(), x.sizes().end() - 1);
  const int64_t rows = numel_of(lead);
  Tensor y = empty({1, rows, out_features}, TensorOptions(x.dtype(), x.device()));
  if (y.numel() > 0) {
    if (linear_bias_stub.has(x.device().type)) {
      run_kernel(linear_bias_stub, x.device(), x.reshape({rows, in}), weight, bias.contiguous(),
                 y.view({rows, out_features}));
    } else {
      run_kernel(copy_stub, x.device(), bias.view({1, out_features}).expand({rows, out_features}),
                 y.view({rows, out_features}));
      run_kernel(bmm_stub, x.device(), x.reshape({1, rows, in}), weight.t().unsqueeze(0), y, true);
    }
  }
  Shape shape = lead;
  shape.push_back(out_features);
  return y.view(shape);
}

}  // namespace ops
}  // namespace ember
