// MixedPrecisionOptimizer: the loss-scaled mixed-precision optimizer of DESIGN.md's optim layer. The model's weights
// and gradients are f16 or bf16; the optimizer keeps an fp32 master copy of every weight and hands the masters to any
// ember optimizer (AdamW, SGD, ...), which keeps its state in fp32 too. Mixed-precision Adam thus holds 16 bytes per
// parameter: 2 (weight) + 2 (gradient) + 4 (master) + 8 (exp_avg, exp_avg_sq) — Note [Mixed-precision memory].
// Invariant: after every step() that was not skipped, each model weight equals its master rounded to the weight's
// dtype; a skipped step leaves weights, masters and the inner optimizer's state untouched.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ember/optim/grad_scaler.h"
#include "ember/optim/optimizer.h"

namespace ember::optim {

struct MixedPrecisionOptions {
  // f16: dynamic loss scaling (GradScaler's rule and defaults in `scaler`). bf16: its exponent range is fp32's, so no
  // scaling (the scale stays 1), but a step whose gradients hold NaN/inf is still skipped. scaler.enabled = false
  // turns the scaling off for f16 as well (scale 1; NaN/inf steps still skipped).
  DType dtype = DType::f16;
  GradScalerOptions scaler = {};
};

// Builds the wrapped optimizer over the fp32 master parameters; each master group carries the options of the
// model's group it mirrors. Example: [](std::vector<ParamGroup> g) { return std::make_unique<AdamW>(std::move(g)); }
using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup> master_groups)>;

// Note [Mixed-precision memory]
// Per parameter with Adam: the f16/bf16 weight (2), the fp32 master (4) and the fp32 state (8) always; after
// backward the f16/bf16 gradient (2): 16 bytes. unscale_() turns gradients into fp32 master gradients in fused calls
// over batches of at most 16 MiB of master gradients and frees each batch's f16/bf16 gradients right after it, so
// during step() a parameter holds 2 + 4 (master grad) + 4 + 8 = 18 bytes, never both gradients except within one
// batch; zero_grad() frees the master gradients (back to 14 until the next backward).
//
// Use (gradient accumulation: call backward once per micro-batch, step once per effective batch; the scale is
// constant in between and checked, applied and updated once):
//   model->to(DType::f16);
//   MixedPrecisionOptimizer opt(model->parameters(), [](auto g) { return std::make_unique<AdamW>(std::move(g)); });
//   opt.backward(loss);                               // (loss * scale).backward()
//   opt.unscale_(); clip_grad_norm_(opt.master_parameters(), 1.0);   // optional
//   opt.step(); opt.zero_grad();
class MixedPrecisionOptimizer {
 public:
  // params/groups: the model's parameters, all of options.dtype (DTypeError otherwise), leaves that require grad.
  // ValueError for an empty list, options.dtype other than f16/bf16, or a factory that returns null.
  MixedPrecisionOptimizer(std::vector<Tensor> params, const OptimizerFactory& make_optimizer,
                          MixedPrecisionOptions options = {});
  MixedPrecisionOptimizer(std::vector<ParamGroup> groups, const OptimizerFactory& make_optimizer,
                          MixedPrecisionOptions options = {});
  MixedPrecisionOptimizer(const MixedPrecisionOptimizer&) = delete;
  MixedPrecisionOptimizer& operator=(const MixedPrecisionOptimizer&) = delete;

  // loss * scale (loss itself for bf16). backward(loss) is scale_loss(loss).backward().
  Tensor scale_loss(const Tensor& loss);
  void backward(const Tensor& loss);

  // Writes every model gradient times 1/scale into its master's .grad (f32), checking for NaN/inf in the same pass,
  // and frees the model gradients batch by batch (Note [Mixed-precision memory]). Parameters without a gradient get
  // none. At most once per step: a second call before step() is a ValueError.
  void unscale_();
  // unscale_() unless done; then, when every gradient was finite, the inner optimizer's step and the rounding of each
  // master into its model weight. The loss scale is updated either way (f16). Returns whether the step was taken.
  // If the inner optimizer throws, the exception propagates and the next step() unscales afresh (this step's model
  // gradients were consumed; the master gradients stay until zero_grad()).
  bool step();
  // Frees (or zeroes) the model gradients and the master gradients.
  void zero_grad(bool set_to_none = true);

  Optimizer& inner() { return *inner_; }  // for LR schedulers: they set "lr" in the inner optimizer's groups
  const Optimizer& inner() const { return *inner_; }
  const std::vector<Tensor>& master_parameters() const { return masters_; }
  const std::vector<Tensor>& model_parameters() const { return params_; }
  const Tensor& master_of(const Tensor& param) const;  // ValueError for a tensor this optimizer does not hold
  double loss_scale() const;                           // 1 for bf16
  int64_t steps_skipped() const { return steps_skipped_; }
  bool last_step_skipped() const { return last_skipped_; }
  const MixedPrecisionOptions& options() const { return options_; }

  // Bytes held, by role (for memory reports): model weights, model gradients, masters, master gradients, and the
  // inner optimizer's state. Counts each storage once.
  struct MemoryUse {
    int64_t weights = 0, grads = 0, master_weights = 0, master_grads = 0, optimizer_state = 0;
  };
  MemoryUse memory_use() const;

  // The inner optimizer's state_dict, then "master.<i>" (the fp32 masters, aliasing), then the loss scaler's
  // entries prefixed "scaler." (GradScaler::state_dict). load_state_dict validates everything first (ValueError,
  // nothing changed), copies the masters and rounds them into the model weights.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& dict);
  // The loss scaler's entries alone (GradScaler::state_dict's names, no prefix), and loading them: validated first,
  // then written into the scale and growth tracker in place. For snapshots that restore the rest themselves.
  StateDict scaler_state_dict() const;
  void load_scaler_state_dict(const StateDict& entries);

 private:
  void apply_scaler_state(const detail::ScalerState& s);

  MixedPrecisionOptions options_;
  std::vector<Tensor> params_;   // model parameters (f16/bf16)
  std::vector<Tensor> masters_;  // fp32 masters, one per parameter, same order
  std::unique_ptr<Optimizer> inner_;
  Tensor scale_, growth_tracker_, found_inf_, inv_scale_;  // 1-element tensors on the parameters' device
  bool unscaled_ = false;
  bool last_skipped_ = false;
  int64_t steps_skipped_ = 0;
};

}  // namespace ember::optim
