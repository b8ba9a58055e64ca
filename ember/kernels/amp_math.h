// Element math of the mixed-precision ops (amp_unscale, amp_update_scale in kernels/stubs.h), shared by the CPU kernels
// and the CUDA kernels (EMBER_HD). Invariant: both devices unscale an element with the same multiplication in the
// same type and apply the same scale-update rule, so found_inf and the new scale never depend on the device.
#pragma once

#include <cmath>
#include <cstdint>

#include "ember/base/host_device.h"
#include "ember/core/dtype.h"
#include "ember/kernels/convert.h"

namespace ember::kernels {

// Whether x is neither NaN nor +-inf (libm's isfinite in the compute type on either device).
template <class M>
EMBER_HD_INLINE bool amp_isfinite(M x) {
#if defined(__CUDA_ARCH__)
  return ::isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// Note [Unscale element]
// One gradient element g (of type G) unscaled into an element of type O: the product g * inv_scale is computed in
// M = op_math_t<G> (float for f32/f16/bf16, double for f64; inv_scale is the f32 reciprocal of the scale, widened),
// as PyTorch's _amp_foreach_non_finite_check_and_unscale_ does, then rounded once to O. The finiteness test looks at
// the stored value, so a product that overflows O (an f32 gradient unscaled into f16) also counts as non-finite;
// for an f32 destination this is exactly "g is NaN or inf, or g * inv_scale overflowed".
// Returns the value to store; sets `nonfinite` (never clears it).
template <class G, class O>
EMBER_HD_INLINE O amp_unscale_element(G g, op_math_t<G> inv_scale, bool& nonfinite) {
  using M = op_math_t<G>;
  const O out = convert<O>(static_cast<M>(g) * inv_scale);  // Note [Casts] (kernels/convert.h)
  if (!amp_isfinite(static_cast<op_math_t<O>>(out))) nonfinite = true;
  return out;
}

// Note [Scale update rule]
// PyTorch's _amp_update_scale_ on one scale, in the same order and types (the products in double, stored as f32):
//   found_inf != 0:  scale = scale * backoff_factor, growth_tracker = 0
//   otherwise:       tracker = growth_tracker + 1
//                    when tracker reaches growth_interval: scale = scale * growth_factor unless that product is not
//                    finite in f32 (the scale then stays), growth_tracker = 0; else growth_tracker = tracker.
// found_inf is tested for "non-zero" (a NaN count counts as found, as `if (*found_inf)` does in PyTorch); a tracker
// at or beyond the interval (a hand-edited state) grows at the next clean step.
EMBER_HD_INLINE void amp_update_scale_element(float& scale, int32_t& growth_tracker, float found_inf,
                                              double growth_factor, double backoff_factor, int64_t growth_interval) {
  if (!(found_inf == 0.0f)) {
    scale = static_cast<float>(static_cast<double>(scale) * backoff_factor);
    growth_tracker = 0;
    return;
  }
  const int64_t successful = static_cast<int64_t>(growth_tracker) + 1;
  if (successful >= growth_interval) {
    const float grown = static_cast<float>(static_cast<double>(scale) * growth_factor);
    if (amp_isfinite(grown)) scale = grown;
    growth_tracker = 0;
  } else {
    growth_tracker = static_cast<int32_t>(successful);
  }
}

}  // namespace ember::kernels
