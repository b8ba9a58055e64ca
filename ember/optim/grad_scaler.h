// GradScaler: dynamic loss scaling for training under autocast with fp32 weights (torch.amp.GradScaler's defaults,
// semantics and call sequence: scale(loss).backward(); [unscale_(opt); clip]; step(opt); update()).
// Invariant: the scale and growth tracker live on the device of the first scaled loss and change only in update();
// per optimizer, unscale_ runs at most once between two update() calls, and step() runs the optimizer only when no
// gradient it unscaled was NaN or inf (DESIGN.md reference numbers: init 2^16, x2 after 2000 clean steps, x0.5 and
// the step skipped on inf/nan).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include "ember/optim/optimizer.h"

namespace ember::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;  // false: every method is a pass-through (scale returns its input, step just steps)
};

class GradScaler {
 public:
  // ValueError unless init_scale is a positive normal f32 value, growth_factor > 1, 0 < backoff_factor < 1 and
  // 1 <= growth_interval <= 2^31 - 1.
  explicit GradScaler(GradScalerOptions options = {});

  // outputs * scale (the multiplication is recorded, so backward produces scaled gradients). The scale tensor is
  // made on outputs' device at the first call. ValueError for a non-floating output.
  Tensor scale(const Tensor& outputs);

  // Divides the optimizer's gradients by the scale in place and records whether any is NaN or inf (one fused pass
  // per device). ValueError when called twice for one optimizer before update(), after step(), or when no parameter
  // has a gradient (PyTorch: "No inf checks were recorded for this optimizer"); DTypeError for
  // f16 gradients (they would be unscaled in f16, where small values flush to zero: keep fp32 weights under
  // autocast, or use MixedPrecisionOptimizer for f16 weights), as PyTorch refuses them.
  void unscale_(Optimizer& optimizer);

  // Unscales (unless unscale_ ran) and runs optimizer.step() only when no gradient was NaN or inf. Returns whether
  // the optimizer stepped. ValueError when called twice for one optimizer before update().
  bool step(Optimizer& optimizer);

  // Adjusts the scale from every optimizer stepped since the last update (backoff when any found inf/nan, growth
  // after growth_interval clean updates) and clears the per-optimizer records. new_scale sets the scale directly
  // instead (ValueError unless > 0), as PyTorch's update(new_scale).
  void update(std::optional<double> new_scale = std::nullopt);

  // The current scale (reads it back: a device sync on CUDA); init_scale before the first scale() call; 1 when
  // disabled.
  double get_scale() const;
  int64_t growth_tracker() const;
  bool is_enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }
  // Whether the last step() of this optimizer was skipped because of NaN/inf gradients (false before any step).
  bool step_skipped(const Optimizer& optimizer) const;

  // "scale" (0-d f64), "growth_factor", "backoff_factor", "growth_interval", "growth_tracker" (0-d f64 each):
  // PyTorch's state_dict keys ("_growth_tracker" there). load_state_dict validates every name first (ValueError,
  // nothing changed).
  StateDict state_dict() const;
  void load_state_dict(const StateDict& dict);

  // The step of `optimizer` is abandoned (its gradients are being cleared without a step: an OOM after unscale_, a
  // trial step thrown away): forgets that they were unscaled or checked, so the next step unscales afresh. The scale
  // and the growth tracker are unchanged. (PyTorch has no such call; its per-optimizer state resets only in update().)
  void discard_step(const Optimizer& optimizer);

 private:
  enum class Stage { ready, unscaled, stepped };
  struct PerOptimizer {
    Stage stage = Stage::ready;
    Tensor found_inf;  // 1-element f32 on the scale's device: 1 when a gradient was not finite
    bool skipped = false;
  };
  void lazy_init(Device device);
  PerOptimizer& record(const Optimizer& optimizer);

  GradScalerOptions options_;
  Tensor scale_;           // 1-element f32 (undefined until the first scale())
  Tensor growth_tracker_;  // 1-element i32
  int64_t init_growth_tracker_ = 0;  // growth_tracker_'s value when made (a state_dict loaded before scale())
  std::unordered_map<const Optimizer*, PerOptimizer> per_optimizer_;
};

namespace detail {
// Shared by GradScaler and MixedPrecisionOptimizer (which keeps its own scale tensors).
// ValueError naming `who` unless init_scale is a positive normal f32 value, growth_factor > 1,
// 0 < backoff_factor < 1 and 1 <= growth_interval <= 2^31 - 1 (the tracker is i32).
void check_scaler_options(const char* who, const GradScalerOptions& options);
// ValueError unless `scale` (named `what`) is a positive normal f32 value: the scale tensor is f32.
void check_scale_value(const char* who, const char* what, double scale);
// GradScaler::state_dict's entries for these values, each name prefixed with `prefix`.
StateDict scaler_state_dict(double scale, int64_t growth_tracker, const GradScalerOptions& options,
                            const std::string& prefix);
// The values of such entries (names without the prefix): every name must be there once and valid (ValueError).
// options.enabled is true; options.init_scale is the loaded scale.
struct ScalerState {
  double scale = 0.0;
  int64_t growth_tracker = 0;
  GradScalerOptions options;
};
ScalerState parse_scaler_state(const char* who, const StateDict& entries);
}  // namespace detail

}  // namespace ember::optim
