// Gradient norms and clipping over a parameter list, with the raw op front ends (ember::ops) so that any device with
// the elementwise and reduction kernels works.
// Invariant: grads are written in place through copy_, under NoGradGuard.
#include "ember/optim/clip_grad.h"

#include <cmath>

#include "ember/core/grad_mode.h"
#include "ember/kernels/ops.h"
#include "ember/memory/tags.h"

namespace ember::optim {

namespace {

std::vector<Tensor> defined_grads(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    EMBER_CHECK(p.defined(), ValueError, "clip_grad: a parameter is an undefined tensor");
    Tensor g = p.grad();
    if (g.defined() && g.numel() > 0) grads.push_back(g);
  }
  return grads;
}

}  // namespace

// The per-gradient partial results stay on the device (0-d tensors in f32, or f64 for f64 grads) and are combined
// there; the total is read back once, so a step costs one device synchronisation, not one per parameter.
double grad_norm(const std::vector<Tensor>& params, double norm_type) {
  EMBER_CHECK(norm_type > 0.0, ValueError, "clip_grad_norm_: norm_type must be > 0 or inf, got ", norm_type);
  NoGradGuard no_grad;
  const bool inf = std::isinf(norm_type);
  Tensor acc;
  for (const Tensor& g : defined_grads(params)) {
    // f16/bf16 grads are widened to f32 first: their squares and sums would lose precision (or overflow) in 16 bits.
    const Tensor a = ops::abs(g.dtype() == DType::f64 ? g : g.to(DType::f32));
    Tensor part;
    if (inf) part = ops::amax(a);
    else if (norm_type == 2.0) part = ops::sum(ops::mul(a, a));
    else if (norm_type == 1.0) part = ops::sum(a);
    else part = ops::sum(ops::pow(a, norm_type));
    if (acc.defined() && acc.device() != part.device()) acc = acc.to(part.device());  // grads on several devices
    // maximum() propagates NaN, so a NaN gradient makes the inf-norm NaN as in PyTorch.
    acc = !acc.defined() ? part : inf ? ops::maximum(acc, part) : ops::add(acc, part);
  }
  if (!acc.defined()) return 0.0;
  const double total = acc.item_double();
  if (inf || norm_type == 1.0) return total;
  if (norm_type == 2.0) return std::sqrt(total);
  return std::pow(total, 1.0 / norm_type);
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);
  const double total = grad_norm(params, norm_type);
  EMBER_CHECK(!error_if_nonfinite || std::isfinite(total), ValueError, "clip_grad_norm_: the total norm of order ",
              norm_type, " of the gradients is non-finite (", total, "), so it cannot be clipped; pass "
              "error_if_nonfinite = false to clip anyway");
  const double clip_coef = max_norm / (total + 1e-6);
  if (clip_coef >= 1.0) return total;  // PyTorch multiplies by min(clip_coef, 1): nothing to do
  NoGradGuard no_grad;
  for (Tensor g : defined_grads(params)) g.copy_(ops::mul(g, clip_coef));
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);
  EMBER_CHECK(clip_value >= 0.0, ValueError, "clip_grad_value_: clip_value must be >= 0, got ", clip_value);
  NoGradGuard no_grad;
  for (Tensor g : defined_grads(params)) g.copy_(ops::clamp(g, -clip_value, clip_value));
}

}  // namespace ember::optim
