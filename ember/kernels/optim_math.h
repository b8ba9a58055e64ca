// Element math of the optimizer updates (sgd_step, adam_step in kernels/stubs.h), shared by the CPU kernel and the
// CUDA kernel to come (EMBER_HD). Invariant: the operations and their order are those of torch.optim's single-tensor
// implementations (Note [Optimizer update rules]); an element's update depends only on its inputs and the coefficients.
#pragma once

#include <cmath>

#include "ember/base/host_device.h"
#include "ember/kernels/elementwise_math.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels {

// Note [Optimizer update rules]
// torch.optim (sgd.py / adam.py, _single_tensor_*) updates one parameter with a sequence of tensor ops. Python floats
// enter each op as a scalar rounded to the op-math type M (float for f32/f16/bf16, double for f64), every op
// computes in M, and these kernels keep the intermediate values in M (in torch they are rounded to the tensor's dtype
// between ops; for f32/f64 parameters that is the same thing). With g the gradient and p the parameter:
//   SGD:   if wd != 0: g = g + wd * p                              (grad.add(param, alpha=wd))
//          if momentum != 0:
//            buf = first step ? g : buf * momentum + (1 - dampening) * g
//            g = nesterov ? g + momentum * buf : buf
//          p = p + (-lr) * g                                      (param.add_(grad, alpha=-lr))
//   Adam:  if wd != 0: AdamW: p = p * (1 - lr * wd)   Adam: g = g + wd * p
//          m = lerp(m, g, 1 - beta1)                              (= beta1 * m + (1 - beta1) * g; torch's lerp form)
//          v = v * beta2 + (1 - beta2) * g * g
//          denom = sqrt(v) / sqrt(1 - beta2^step) + eps
//          p = p + (-lr / (1 - beta1^step)) * m / denom           (param.addcdiv_(m, denom, value=-step_size))
// The coefficients (1 - dampening, 1 - lr * wd, the bias corrections, step_size) are computed in double on the host,
// as Python computes them, and rounded to M once. The `!= 0` tests are real branches (0 * inf is NaN).

// torch's lerp (ATen/native/Lerp.h): self + w * (end - self) for |w| < 0.5, else end - (end - self) * (1 - w).
template <class M>
EMBER_HD_INLINE M torch_lerp(M self, M end, M w) {
  return (w < M(0.5) && w > M(-0.5)) ? self + w * (end - self) : end - (end - self) * (M(1) - w);
}

template <class M>
struct SgdCoeffs {
  M lr, momentum, one_minus_dampening, weight_decay;
  bool use_weight_decay, use_momentum, nesterov, first_step;
};

template <class M>
inline SgdCoeffs<M> sgd_coeffs(const SgdParams& p) {
  return {static_cast<M>(p.lr), static_cast<M>(p.momentum), static_cast<M>(1.0 - p.dampening),
          static_cast<M>(p.weight_decay), p.weight_decay != 0.0, p.momentum != 0.0, p.nesterov, p.first_step};
}

// One element: returns the new parameter value; buf is read and written only when c.use_momentum.
template <class M>
EMBER_HD_INLINE M sgd_update(M p, M g, M& buf, const SgdCoeffs<M>& c) {
  if (c.use_weight_decay) g = g + c.weight_decay * p;
  if (c.use_momentum) {
    buf = c.first_step ? g : buf * c.momentum + c.one_minus_dampening * g;
    g = c.nesterov ? g + c.momentum * buf : buf;
  }
  return p + (-c.lr) * g;
}

template <class M>
struct AdamCoeffs {
  M weight_decay, decay_factor;  // decay_factor = 1 - lr * wd (AdamW)
  M one_minus_beta1, beta2, one_minus_beta2, eps;
  M bias_correction2_sqrt, neg_step_size;  // sqrt(1 - beta2^step), -lr / (1 - beta1^step)
  bool use_weight_decay, decoupled;
};

template <class M>
inline AdamCoeffs<M> adam_coeffs(const AdamParams& p) {
  const double step = static_cast<double>(p.step);
  const double bc1 = 1.0 - std::pow(p.beta1, step), bc2 = 1.0 - std::pow(p.beta2, step);
  return {static_cast<M>(p.weight_decay),
          static_cast<M>(1.0 - p.lr * p.weight_decay),
          static_cast<M>(1.0 - p.beta1),
          static_cast<M>(p.beta2),
          static_cast<M>(1.0 - p.beta2),
          static_cast<M>(p.eps),
          static_cast<M>(std::sqrt(bc2)),
          static_cast<M>(-(p.lr / bc1)),
          p.weight_decay != 0.0,
          p.decoupled};
}

// One element: updates m and v, returns the new parameter value.
template <class M>
EMBER_HD_INLINE M adam_update(M p, M g, M& m, M& v, const AdamCoeffs<M>& c) {
  if (c.use_weight_decay) {
    if (c.decoupled)
      p = p * c.decay_factor;
    else
      g = g + c.weight_decay * p;
  }
  m = torch_lerp(m, g, c.one_minus_beta1);
  v = v * c.beta2 + c.one_minus_beta2 * g * g;
  const M denom = ember_sqrt(v) / c.bias_correction2_sqrt + c.eps;
  return p + c.neg_step_size * m / denom;
}

}  // namespace ember::kernels
