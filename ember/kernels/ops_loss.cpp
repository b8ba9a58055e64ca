// Front ends of the fused softmax + cross-entropy over rows (Note [Fused cross-entropy] in kernels/stubs.h).
// Invariant: the kernels see contiguous logits [M, C], contiguous i64 targets each ignore_index or in [0, C),
// contiguous grad_loss [M] and lse [M] in the accumulation dtype, and fresh contiguous outputs.
#include <limits>
#include <vector>

#include "ember/kernels/ops.h"

namespace ember {

EMBER_DEFINE_STUB(cross_entropy, CrossEntropyFn);
EMBER_DEFINE_STUB(cross_entropy_backward, CrossEntropyBackwardFn);

namespace ops {

namespace {

DType accumulation_dtype(DType logits) { return is_reduced_float(logits) ? DType::f32 : logits; }

// Note [Targets checked once]
// The kernels read a row's target: the forward's gathers that logit, the CPU backward writes that element. So the
// targets' values are checked on the host first (IndexError), which on a GPU copies them back and synchronises the
// device. A training step would pay that twice, forward and backward, for the same targets; the autograd node calls
// the backward with TargetValues::checked, since it passes the targets its forward checked, saved, and version-checked
// on unpacking (an in-place write since the forward refuses the backward). Where unchecked targets still reach a
// backward kernel (a saved-tensor hook returning other values), neither kernel leaves the row: the CUDA kernel only
// compares the target with column indices, and the CPU kernel writes the target's element only when it is in [0, C).
//
// Checks logits [M, C] and target [M] of a fused cross-entropy op (the targets' values unless `values` is checked);
// returns the targets contiguous.
Tensor check_rows(const char* op, const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                  TargetValues values = TargetValues::check) {
  EMBER_CHECK(logits.defined() && target.defined(), ValueError, op, ": logits and target must be defined");
  check_floating(op, logits);
  EMBER_CHECK(target.dtype() == DType::i64, DTypeError, op, ": target must hold i64 class indices, got ",
              target.description());
  common_device(op, {&logits, &target});
  EMBER_CHECK(logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0), ShapeError, op,
              ": expects logits [M, C] and target [M], got ", logits.description(), " and ", target.description());
  EMBER_CHECK(smoothing >= 0.0 && smoothing <= 1.0, ValueError, op, ": label smoothing must be in [0, 1], got ",
              smoothing);
  const Tensor t = target.contiguous();
  if (values == TargetValues::check && !t.device().is_meta() && t.numel() > 0) {
    // Note [Target check] in nn/functional.cpp: the kernels index rows with these values, so they are checked here,
    // on the host.
    const int64_t classes = logits.size(1);
    const std::vector<int64_t> values = t.to_vector<int64_t>();
    for (size_t i = 0; i < values.size(); ++i) {
      const int64_t v = values[i];
      EMBER_CHECK(v == ignore_index || (v >= 0 && v < classes), IndexError, op, ": target ", v, " at row ", i,
                  " is out of bounds for ", classes, " classes (ignore_index ", ignore_index, ")");
    }
  }
  return t;
}

}  // namespace

bool has_cross_entropy_kernel(Device device) {
  if (device.is_meta()) return true;  // outputs only: the kernels take no workspace
  return cross_entropy_stub.has(device.type) && cross_entropy_backward_stub.has(device.type);
}

CrossEntropyResult cross_entropy_rows(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                      double smoothing) {
  const char* op = "cross_entropy_rows";
  const Tensor t = check_rows(op, logits, target, ignore_index, smoothing);
  const TensorOptions acc(accumulation_dtype(logits.dtype()), logits.device());
  CrossEntropyResult r{empty({logits.size(0)}, acc), empty({logits.size(0)}, acc)};
  if (logits.numel() > 0) {
    run_kernel(cross_entropy_stub, logits.device(), logits.contiguous(), t, ignore_index, smoothing, r.loss, r.lse);
  } else if (r.loss.numel() > 0 && !logits.device().is_meta()) {
    // C == 0: no class to score; the per-row loss of nothing is NaN (log of an empty sum), as log_softmax gives.
    r.loss.fill_(std::numeric_limits<double>::quiet_NaN());
    r.lse.fill_(-std::numeric_limits<double>::infinity());
  }
  return r;
}

Tensor cross_entropy_rows_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& target,
                                   const Tensor& lse, int64_t ignore_index, double smoothing, TargetValues values) {
  const char* op = "cross_entropy_rows_backward";
  const Tensor t = check_rows(op, logits, target, ignore_index, smoothing, values);
  common_device(op, {&grad_loss, &logits, &lse});
  const DType acc = accumulation_dtype(logits.dtype());
  EMBER_CHECK(grad_loss.sizes() == Shape{logits.size(0)} && lse.sizes() == Shape{logits.size(0)}, ShapeError, op,
              ": grad_loss ", grad_loss.description(), " and lse ", lse.description(), " must be [", logits.size(0),
              "]");
  EMBER_CHECK(lse.dtype() == acc, DTypeError, op, ": lse ", lse.description(), " must be ", dtype_name(acc));
  check_floating(op, grad_loss);
  Tensor grad_logits = empty(logits.sizes(), TensorOptions(logits.dtype(), logits.device()));
  if (grad_logits.numel() > 0)
    run_kernel(cross_entropy_backward_stub, logits.device(), grad_loss.to(acc).contiguous(), logits.contiguous(), t,
               lse.contiguous(), ignore_index, smoothing, grad_logits);
  return grad_logits;
}

}  // namespace ops
}  // namespace ember
