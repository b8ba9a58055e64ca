// Fused multi-head attention front ends over the packed projection qkv [B, T, 3 C] of a GPT block.
// Invariant: the kernels see contiguous qkv [B, T, 3 C] and grad_out [B, T, C] of one floating dtype, lse [B, H, T]
// (accumulation dtype) as the forward wrote it, the forward's out (contiguous, qkv's dtype) or an undefined tensor,
// and fresh contiguous outputs (out [B, T, C], lse, grad_qkv).
#include "ember/kernels/ops.h"

namespace ember {

EMBER_DEFINE_STUB(attention, AttentionFn);
EMBER_DEFINE_STUB(attention_backward, AttentionBackwardFn);

namespace ops {

namespace {

// B, T, C of a valid qkv for n_head heads.
struct AttentionShape {
  int64_t B, T, C;
};

AttentionShape check_qkv(const char* op, const Tensor& qkv, int64_t n_head) {
  EMBER_CHECK(qkv.defined(), ValueError, op, ": qkv must be defined");
  check_floating(op, qkv);
  EMBER_CHECK(n_head > 0, ValueError, op, ": n_head must be positive, got ", n_head);
  EMBER_CHECK(qkv.dim() == 3 && qkv.size(2) % (3 * n_head) == 0 && qkv.size(2) > 0, ShapeError, op,
              ": expects qkv [B, T, 3 C] with C a multiple of n_head = ", n_head, ", got ", qkv.description());
  return {qkv.size(0), qkv.size(1), qkv.size(2) / 3};
}

}  // namespace

DType attention_lse_dtype(DType qkv) { return is_reduced_float(qkv) ? DType::f32 : qkv; }

bool has_attention_kernel(Device device, DType dtype) {
  if (!attention_stub.has(device.type) || !attention_backward_stub.has(device.type)) return false;
  // Every floating dtype: the CPU kernel (and the meta replay of its workspace) runs f16/bf16 through f32 copies
  // (Note [16-bit attention on the CPU] in cpu/attention.cpp), the CUDA one takes 16-bit qkv directly.
  return is_floating(dtype);
}

AttentionResult attention_qkv(const Tensor& qkv, int64_t n_head, bool causal) {
  const char* op = "attention_qkv";
  const AttentionShape s = check_qkv(op, qkv, n_head);
  const TensorOptions opts(qkv.dtype(), qkv.device());
  Tensor out = empty({s.B, s.T, s.C}, opts);
  Tensor lse = empty({s.B, n_head, s.T}, TensorOptions(attention_lse_dtype(qkv.dtype()), qkv.device()));
  if (out.numel() > 0) run_kernel(attention_stub, qkv.device(), qkv.contiguous(), n_head, causal, out, lse);
  return {out, lse};
}

Tensor attention_qkv_backward(const Tensor& grad_out, const Tensor& qkv, const Tensor& lse, int64_t n_head,
                              bool causal, const Tensor& out) {
  const char* op = "attention_qkv_backward";
  const AttentionShape s = check_qkv(op, qkv, n_head);
  common_device(op, {&grad_out, &qkv, &lse});
  EMBER_CHECK(grad_out.dtype() == qkv.dtype() && lse.dtype() == attention_lse_dtype(qkv.dtype()), DTypeError, op,
              ": grad_out must have qkv's dtype and lse ", dtype_name(attention_lse_dtype(qkv.dtype())), ", got ",
              grad_out.description(), ", ", qkv.description(), " and ", lse.description());
  EMBER_CHECK(grad_out.sizes() == Shape({s.B, s.T, s.C}) && lse.sizes() == Shape({s.B, n_head, s.T}), ShapeError, op,
              ": grad_out ", shape_str(grad_out.sizes()), " and lse ", shape_str(lse.sizes()), " do not fit qkv ",
              shape_str(qkv.sizes()), " with ", n_head, " heads");
  if (out.defined()) {
    common_device(op, {&out, &qkv});
    EMBER_CHECK(out.dtype() == qkv.dtype() && out.sizes() == Shape({s.B, s.T, s.C}), ShapeError, op,
                ": out must be the forward's output (", dtype_name(qkv.dtype()), " ", shape_str(Shape({s.B, s.T, s.C})),
                "), got ", out.description());
  }
  Tensor grad_qkv = empty(qkv.sizes(), TensorOptions(qkv.dtype(), qkv.device()));
  if (grad_qkv.numel() > 0)
    run_kernel(attention_backward_stub, qkv.device(), grad_out.contiguous(), qkv.contiguous(),
               out.defined() ? out.contiguous() : Tensor(), lse.contiguous(), n_head, causal, grad_qkv);
  return grad_qkv;
}

}  // namespace ops
}  // namespace ember
