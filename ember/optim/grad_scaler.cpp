// GradScaler: torch.amp.GradScaler's call sequence over ember's fused mixed-precision ops (ops::amp_unscale_ and
// ops::amp_update_scale_), plus the scaler state_dict helpers MixedPrecisionOptimizer shares.
// Invariant: the scale changes only in update() (or load_state_dict); a per-optimizer record holds a found_inf tensor
// exactly between its unscale_ and the next update().
#include "ember/optim/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>

#include "ember/autograd/functions.h"
#include "ember/core/grad_mode.h"
#include "ember/kernels/ops.h"
#include "ember/memory/tags.h"

namespace ember::optim {

// ---- shared helpers ---------------------------------------------------------------------------------------------

namespace detail {

void check_scale_value(const char* who, const char* what, double scale) {
  // The scale is kept in f32: a value f32 cannot hold as a normal number would become inf or 0, and every step
  // would then be skipped without an error.
  EMBER_CHECK(scale >= static_cast<double>(std::numeric_limits<float>::min()) &&
                  scale <= static_cast<double>(std::numeric_limits<float>::max()),
              ValueError, who, ": ", what, " must be a positive normal f32 value (between ",
              std::numeric_limits<float>::min(), " and ", std::numeric_limits<float>::max(), "), got ", scale);
}

void check_scaler_options(const char* who, const GradScalerOptions& o) {
  check_scale_value(who, "init_scale", o.init_scale);
  EMBER_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1.0, ValueError, who,
              ": growth_factor must be > 1, got ", o.growth_factor);
  EMBER_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0, ValueError, who,
              ": backoff_factor must be in (0, 1), got ", o.backoff_factor);
  // The growth tracker is an i32 tensor (PyTorch's too).
  EMBER_CHECK(o.growth_interval >= 1 && o.growth_interval <= std::numeric_limits<int32_t>::max(), ValueError, who,
              ": growth_interval must be in [1, 2^31 - 1], got ", o.growth_interval);
}

StateDict scaler_state_dict(double scale, int64_t growth_tracker, const GradScalerOptions& o,
                            const std::string& prefix) {
  auto value = [](double v) { return scalar_tensor(v, TensorOptions(DType::f64, Device::cpu())); };
  return {{prefix + "scale", value(scale)},
          {prefix + "growth_factor", value(o.growth_factor)},
          {prefix + "backoff_factor", value(o.backoff_factor)},
          {prefix + "growth_interval", value(static_cast<double>(o.growth_interval))},
          {prefix + "growth_tracker", value(static_cast<double>(growth_tracker))}};
}

ScalerState parse_scaler_state(const char* who, const StateDict& entries) {
  static const std::set<std::string> kNames = {"scale", "growth_factor", "backoff_factor", "growth_interval",
                                               "growth_tracker"};
  std::map<std::string, double> values;
  for (const auto& [name, t] : entries) {
    EMBER_CHECK(kNames.count(name) == 1, ValueError, who, ": unexpected name '", name,
                "' (expected scale, growth_factor, backoff_factor, growth_interval, growth_tracker)");
    EMBER_CHECK(t.defined() && t.numel() == 1, ValueError, who, ": '", name, "' must hold one value, got ",
                t.defined() ? t.description() : std::string("an undefined tensor"));
    EMBER_CHECK(values.emplace(name, t.item_double()).second, ValueError, who, ": the name '", name,
                "' appears twice");
  }
  for (const std::string& name : kNames)
    EMBER_CHECK(values.count(name) == 1, ValueError, who, ": '", name, "' is missing");
  ScalerState s;
  s.scale = values["scale"];
  const double interval = values["growth_interval"], tracker = values["growth_tracker"];
  EMBER_CHECK(interval >= 1.0 && interval <= 2147483647.0 && interval == std::floor(interval), ValueError, who,
              ": growth_interval must be a whole number >= 1, got ", interval);
  EMBER_CHECK(tracker >= 0.0 && tracker <= 2147483647.0 && tracker == std::floor(tracker), ValueError, who,
              ": growth_tracker must be a whole number >= 0, got ", tracker);
  s.growth_tracker = static_cast<int64_t>(tracker);
  s.options.init_scale = s.scale;
  s.options.growth_factor = values["growth_factor"];
  s.options.backoff_factor = values["backoff_factor"];
  s.options.growth_interval = static_cast<int64_t>(interval);
  s.options.enabled = true;
  check_scaler_options(who, s.options);
  return s;
}

}  // namespace detail

// ---- GradScaler -------------------------------------------------------------------------------------------------

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  detail::check_scaler_options("GradScaler", options_);
}

void GradScaler::lazy_init(Device device) {
  if (scale_.defined()) return;
  scale_ = full({1}, options_.init_scale, TensorOptions(DType::f32, device));
  growth_tracker_ = full({1}, init_growth_tracker_, TensorOptions(DType::i32, device));
}

GradScaler::PerOptimizer& GradScaler::record(const Optimizer& optimizer) { return per_optimizer_[&optimizer]; }

void GradScaler::discard_step(const Optimizer& optimizer) { per_optimizer_.erase(&optimizer); }

Tensor GradScaler::scale(const Tensor& outputs) {
  EMBER_CHECK(outputs.defined(), ValueError, "GradScaler::scale: outputs is an undefined tensor");
  if (!options_.enabled) return outputs;
  EMBER_CHECK(is_floating(outputs.dtype()), ValueError, "GradScaler::scale: expects floating outputs, got ",
              outputs.description());
  lazy_init(outputs.device());
  // The f32 scale promotes f16/bf16 outputs to f32 (loss * 2^16 would overflow f16). A 0-d output (a loss) is
  // multiplied by a 0-d view, so it stays 0-d; others by the [1] tensor, which promotes them as in PyTorch.
  const Tensor s = scale_.to(outputs.device());
  return ember::mul(outputs, outputs.dim() == 0 ? s.view({}) : s);
}

void GradScaler::unscale_(Optimizer& optimizer) {
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);
  if (!options_.enabled) return;
  const char* op = "GradScaler::unscale_";
  EMBER_CHECK(scale_.defined(), ValueError, op, ": no scale yet; call scale(loss) and backward before unscale_ "
              "(the scale is made at the first scale() call)");
  PerOptimizer& rec = record(optimizer);
  EMBER_CHECK(rec.stage != Stage::unscaled, ValueError, op,
              ": unscale_() has already been called on this optimizer since the last update()");
  EMBER_CHECK(rec.stage != Stage::stepped, ValueError, op, ": unscale_() is being called after step()");

  std::vector<std::pair<Device, std::vector<Tensor>>> by_device;  // grads grouped by device, in first-seen order
  bool any_grad = false;
  for (const Tensor& p : optimizer.parameters()) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    EMBER_CHECK(g.dtype() != DType::f16, DTypeError, op, ": attempting to unscale f16 gradients (", g.description(),
                "); keep fp32 weights under autocast, or use MixedPrecisionOptimizer for f16 weights");
    auto it = std::find_if(by_device.begin(), by_device.end(), [&](const auto& e) { return e.first == g.device(); });
    if (it == by_device.end()) it = by_device.insert(by_device.end(), {g.device(), {}});
    it->second.push_back(g);
    any_grad = true;
  }
  // PyTorch asserts "No inf checks were recorded for this optimizer": an update without any gradient checked would
  // count as a clean step and grow the scale.
  EMBER_CHECK(any_grad, ValueError, op, ": none of the optimizer's parameters has a gradient (call backward on the "
              "scaled loss first)");

  NoGradGuard no_grad;
  const Device home = scale_.device();
  // PyTorch: inv_scale = scale.double().reciprocal().float(), on the device, without a host sync.
  const Tensor inv_scale = ops::cast(ops::div(ones({1}, TensorOptions(DType::f64, home)), ops::cast(scale_, DType::f64)),
                                     DType::f32);
  Tensor found = zeros({1}, TensorOptions(DType::f32, home));
  for (const auto& [device, grads] : by_device) {
    if (device == home) {
      ops::amp_unscale_(grads, found, inv_scale);
      continue;
    }
    const Tensor found_dev = zeros({1}, TensorOptions(DType::f32, device));
    ops::amp_unscale_(grads, found_dev, inv_scale.to(device));
    found = ops::add(found, found_dev.to(home));  // found_inf summed over devices
  }
  rec.found_inf = found;
  rec.stage = Stage::unscaled;
}

bool GradScaler::step(Optimizer& optimizer) {
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  const char* op = "GradScaler::step";
  PerOptimizer& rec = record(optimizer);
  EMBER_CHECK(rec.stage != Stage::stepped, ValueError, op,
              ": step() has already been called on this optimizer since the last update()");
  if (rec.stage == Stage::ready) unscale_(optimizer);
  rec.skipped = rec.found_inf.item_double() != 0.0;  // the one host sync of a step
  if (!rec.skipped) optimizer.step();
  rec.stage = Stage::stepped;
  return !rec.skipped;
}

void GradScaler::update(std::optional<double> new_scale) {
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);
  if (!options_.enabled) return;
  const char* op = "GradScaler::update";
  EMBER_CHECK(scale_.defined(), ValueError, op, ": no scale yet; call scale(loss) first");
  if (new_scale.has_value()) {
    detail::check_scale_value(op, "new_scale", *new_scale);
    scale_.fill_(*new_scale);
  } else {
    Tensor found;
    for (const auto& [opt, rec] : per_optimizer_) {
      if (!rec.found_inf.defined()) continue;
      found = found.defined() ? ops::add(found, rec.found_inf) : rec.found_inf;
    }
    EMBER_CHECK(found.defined(), ValueError, op, ": no inf checks were recorded before update(); call step(optimizer) "
                "(or unscale_) after backward");
    ops::amp_update_scale_(scale_, growth_tracker_, found, options_.growth_factor, options_.backoff_factor,
                           options_.growth_interval);
  }
  for (auto& [opt, rec] : per_optimizer_) {  // `skipped` stays, for step_skipped()
    rec.stage = Stage::ready;
    rec.found_inf = Tensor();
  }
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  return scale_.defined() ? scale_.item_double() : options_.init_scale;
}

int64_t GradScaler::growth_tracker() const {
  return growth_tracker_.defined() ? growth_tracker_.item<int32_t>() : init_growth_tracker_;
}

bool GradScaler::step_skipped(const Optimizer& optimizer) const {
  auto it = per_optimizer_.find(&optimizer);
  return it != per_optimizer_.end() && it->second.skipped;
}

StateDict GradScaler::state_dict() const {
  if (!options_.enabled) return {};  // PyTorch: a disabled scaler's state_dict is empty
  return detail::scaler_state_dict(get_scale(), growth_tracker(), options_, "");
}

void GradScaler::load_state_dict(const StateDict& dict) {
  const char* op = "GradScaler::load_state_dict";
  EMBER_CHECK(options_.enabled, ValueError, op, ": the scaler is disabled");
  EMBER_CHECK(!dict.empty(), ValueError, op, ": the state dict is empty (saved from a disabled scaler?)");
  const detail::ScalerState s = detail::parse_scaler_state(op, dict);
  options_ = s.options;
  init_growth_tracker_ = s.growth_tracker;
  if (scale_.defined()) {
    scale_.fill_(s.scale);
    growth_tracker_.fill_(s.growth_tracker);
  }
}

}  // namespace ember::optim
