// Adam and AdamW: torch.optim.Adam / AdamW's update rule (amsgrad off; Note [Optimizer update rules] in
// kernels/optim_math.h), applied per parameter by the fused ops::adam_step_ kernel.
// Invariant: a parameter's state is empty or complete: "step" (0-d f64 on the CPU, the number of steps taken),
// "exp_avg" and "exp_avg_sq" (f32, or f64 for f64 params, on the parameter's device).
#pragma once

#include <utility>
#include <vector>

#include "ember/optim/optimizer.h"

namespace ember::optim {

// torch.optim.Adam's arguments and defaults. Group option names: "lr", "beta1", "beta2", "eps", "weight_decay".
struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
};
// torch.optim.AdamW's: as Adam's, with decoupled weight decay defaulting to 1e-2.
struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// Adam: weight decay is L2 (g += weight_decay * p).
class Adam : public Optimizer {
 public:
  // ValueError for a negative lr, eps or weight_decay, or betas outside [0, 1).
  explicit Adam(std::vector<Tensor> params, AdamOptions options = {});
  Adam(std::vector<ParamGroup> groups, AdamOptions defaults = {});

  void step() override;
  bool decoupled_weight_decay() const { return decoupled_; }

  static GroupOptions to_group_options(const AdamOptions& o);
  static AdamOptions from_group_options(const GroupOptions& o);

 protected:
  Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults, bool decoupled);
  void validate_options(const GroupOptions& options) const override;
  std::vector<std::string> state_keys() const override { return {"step", "exp_avg", "exp_avg_sq"}; }
  StateSpec state_spec(const std::string& key, const Tensor& param) const override;

 private:
  bool decoupled_;
};

// AdamW: decoupled weight decay (p *= 1 - lr * weight_decay before the Adam update). nanoGPT's setup is two groups:
//   AdamW({{decay_params, {{"weight_decay", 0.1}}}, {nodecay_params, {{"weight_decay", 0.0}}}},
//         AdamWOptions{.lr = 6e-4, .betas = {0.9, 0.95}});
class AdamW : public Adam {
 public:
  explicit AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults = {});
};

}  // namespace ember::optim
