// CPU kernels of the mixed-precision ops: amp_unscale (grads times 1/scale into outs, NaN/inf detection) and
// amp_update_scale (the dynamic loss-scale rule), with the element math of kernels/amp_math.h.
// Invariant: every element is read once and written once; found_inf is only ever set to 1 here, never cleared.
#include "ember/kernels/amp_math.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

// out[i] = g[i] * inv_scale for one contiguous pair (out may be g itself); returns whether a result was not finite.
template <class G, class O>
bool unscale_typed(const Tensor& grad, const Tensor& out, float inv_scale) {
  using M = op_math_t<G>;
  const M inv = static_cast<M>(inv_scale);
  const int64_t n = grad.numel();
  const G* g = static_cast<const G*>(grad.raw_data());
  O* o = static_cast<O*>(out.raw_data());
  bool nonfinite = false;
  for (int64_t i = 0; i < n; ++i) o[i] = amp_unscale_element<G, O>(g[i], inv, nonfinite);
  return nonfinite;
}

void amp_unscale_kernel(const std::vector<Tensor>& grads, const std::vector<Tensor>& outs, const Tensor& found_inf,
                        const Tensor& inv_scale) {
  const float inv = *static_cast<const float*>(inv_scale.raw_data());
  bool nonfinite = false;
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    const Tensor& o = outs[i];
    EMBER_DISPATCH_FLOAT(g.dtype(), "amp_unscale_", [&] {
      using grad_t = scalar_t;
      EMBER_DISPATCH_FLOAT(o.dtype(), "amp_unscale_", [&] {
        if (unscale_typed<grad_t, scalar_t>(g, o, inv)) nonfinite = true;
      });
    });
  }
  if (nonfinite) *static_cast<float*>(found_inf.raw_data()) = 1.0f;
}

void amp_update_scale_kernel(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                             double growth_factor, double backoff_factor, int64_t growth_interval) {
  amp_update_scale_element(*static_cast<float*>(scale.raw_data()), *static_cast<int32_t*>(growth_tracker.raw_data()),
                           *static_cast<const float*>(found_inf.raw_data()), growth_factor, backoff_factor,
                           growth_interval);
}

}  // namespace

EMBER_REGISTER_KERNEL(amp_unscale, DeviceType::CPU, amp_unscale_kernel);
EMBER_REGISTER_KERNEL(amp_update_scale, DeviceType::CPU, amp_update_scale_kernel);

}  // namespace ember::kernels::cpu
