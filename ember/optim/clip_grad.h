// Gradient clipping (torch.nn.utils.clip_grad_norm_ / clip_grad_value_): in-place scaling or clamping of the .grad
// of a list of parameters, under NoGradGuard. Parameters without a .grad are ignored.
// Invariant: the grads keep their tensors (the same storage is written), so views into a flat buffer stay valid.
#pragma once

#include <limits>
#include <vector>

#include "ember/core/tensor.h"

namespace ember::optim {

// The norm of all grads taken together, as if concatenated into one vector: (sum |g|^p)^(1/p), or max |g| for
// norm_type = inf. Accumulated in double; 0 when no parameter has a grad. ValueError unless norm_type > 0.
double grad_norm(const std::vector<Tensor>& params, double norm_type = 2.0);

// Computes the total norm as grad_norm, and multiplies every grad by clip_coef = max_norm / (total + 1e-6) when
// clip_coef < 1 (PyTorch multiplies by min(clip_coef, 1); a NaN total makes every grad NaN, as there). Returns the
// total norm before clipping. error_if_nonfinite: ValueError when the total is NaN or inf (grads left unchanged).
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

// Clamps every grad elementwise into [-clip_value, clip_value]. ValueError for a negative clip_value.
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

inline constexpr double kInfNorm = std::numeric_limits<double>::infinity();

}  // namespace ember::optim
