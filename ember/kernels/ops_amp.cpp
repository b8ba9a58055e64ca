// Front ends of the mixed-precision ops (amp_unscale_, amp_update_scale_) and their dispatch stubs.
// Invariant: a kernel is reached only with the layout kernels/stubs.h promises (one device, contiguous, outs[i] with
// grads[i]'s numel, 1-element f32 found_inf/inv_scale), and every tensor the op writes has its version bumped.
#include <vector>

#include "ember/core/grad_mode.h"
#include "ember/kernels/ops.h"

namespace ember {

EMBER_DEFINE_STUB(amp_unscale, AmpUnscaleFn);
EMBER_DEFINE_STUB(amp_update_scale, AmpUpdateScaleFn);

namespace ops {

namespace {

// Whether two tensors share bytes of one storage (by the byte ranges their elements can reach).
bool may_overlap(const Tensor& a, const Tensor& b) {
  if (a.storage().get() != b.storage().get() || a.numel() == 0 || b.numel() == 0) return false;
  auto range = [](const Tensor& t) {
    int64_t last = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    return std::pair<int64_t, int64_t>{t.storage_offset() * t.itemsize(), (last + 1) * t.itemsize()};
  };
  const auto [a0, a1] = range(a);
  const auto [b0, b1] = range(b);
  return a0 < b1 && b0 < a1;
}

void check_one_element(const char* op, const char* name, const Tensor& t, DType dtype) {
  EMBER_CHECK(t.defined(), ValueError, op, ": ", name, " is an undefined tensor");
  EMBER_CHECK(t.dtype() == dtype, DTypeError, op, ": ", name, " must be a one-element ", dtype_name(dtype),
              " tensor, got ", t.description());
  EMBER_CHECK(t.numel() == 1, ShapeError, op, ": ", name, " must have one element, got ", t.description());
}

}  // namespace

void amp_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf, const Tensor& inv_scale,
                  const std::vector<Tensor>& outs) {
  const char* op = "amp_unscale_";
  const bool in_place = outs.empty();
  EMBER_CHECK(in_place || outs.size() == grads.size(), ValueError, op, ": got ", grads.size(), " grads but ",
              outs.size(), " outs (pass no outs to unscale in place)");
  if (grads.empty()) return;
  check_one_element(op, "found_inf", found_inf, DType::f32);
  check_one_element(op, "inv_scale", inv_scale, DType::f32);
  const Device device = common_device(op, {&found_inf, &inv_scale});
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    EMBER_CHECK(g.defined(), ValueError, op, ": grads[", i, "] is an undefined tensor");
    check_floating(op, g);
    common_device(op, {&found_inf, &g});
    if (in_place) continue;
    const Tensor& o = outs[i];
    EMBER_CHECK(o.defined(), ValueError, op, ": outs[", i, "] is an undefined tensor");
    check_floating(op, o);
    common_device(op, {&found_inf, &o});
    EMBER_CHECK(o.sizes() == g.sizes(), ShapeError, op, ": outs[", i, "] must have the shape of grads[", i,
                "], got grad ", g.description(), " and out ", o.description());
    EMBER_CHECK(o.is_contiguous(), ValueError, op, ": outs[", i, "] must be contiguous, got ", o.description(),
                " with strides ", shape_str(o.strides()));
    EMBER_CHECK(!may_overlap(o, g), ValueError, op, ": outs[", i, "] shares memory with grads[", i,
                "] (pass no outs to unscale in place)");
  }
  EMBER_CHECK(!found_inf.is_inference() || InferenceMode::is_enabled(), ValueError, op,
              ": found_inf is an inference tensor written outside InferenceMode");

  // The kernel's lists: contiguous inputs and their destinations, empty tensors left out. A non-contiguous grad is
  // read through a contiguous copy; unscaled in place, the copy is the destination and is written back afterwards.
  std::vector<Tensor> k_in, k_out, write_back_dst, write_back_src;
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (in_place) g.bump_version();
    else outs[i].bump_version();
    if (g.numel() == 0) continue;
    const Tensor gc = g.contiguous();
    k_in.push_back(gc);
    if (!in_place) {
      k_out.push_back(outs[i]);
    } else {
      k_out.push_back(gc);
      if (!gc.is_same(g)) {
        write_back_dst.push_back(g);
        write_back_src.push_back(gc);
      }
    }
  }
  found_inf.bump_version();
  if (k_in.empty() || device.is_meta()) return;
  amp_unscale_stub.get(device.type)(k_in, k_out, found_inf, inv_scale);
  NoGradGuard no_grad;
  for (size_t k = 0; k < write_back_dst.size(); ++k) write_back_dst[k].copy_(write_back_src[k]);
}

void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval) {
  const char* op = "amp_update_scale_";
  check_one_element(op, "scale", scale, DType::f32);
  check_one_element(op, "growth_tracker", growth_tracker, DType::i32);
  check_one_element(op, "found_inf", found_inf, DType::f32);
  const Device device = common_device(op, {&scale, &growth_tracker, &found_inf});
  EMBER_CHECK(growth_interval >= 1, ValueError, op, ": growth_interval must be >= 1, got ", growth_interval);
  scale.bump_version();
  growth_tracker.bump_version();
  if (device.is_meta()) return;
  amp_update_scale_stub.get(device.type)(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                                         growth_interval);
}

}  // namespace ops
}  // namespace ember
