// SGD with momentum, dampening, weight decay and Nesterov momentum: torch.optim.SGD's update rule (Note [Optimizer
// update rules] in kernels/optim_math.h), applied per parameter by the fused ops::sgd_step_ kernel.
// Invariant: the momentum buffer ("momentum_buffer", f32, or f64 for f64 params) exists only when momentum != 0,
// and starts as the first step's weight-decayed gradient, as in PyTorch.
#pragma once

#include <vector>

#include "ember/optim/optimizer.h"

namespace ember::optim {

// torch.optim.SGD's arguments and defaults. Group option names: "lr", "momentum", "dampening", "weight_decay",
// "nesterov" (0 or 1).
struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  // ValueError for a negative lr, momentum or weight_decay, or nesterov without momentum > 0 and zero dampening.
  explicit SGD(std::vector<Tensor> params, SGDOptions options = {});
  SGD(std::vector<ParamGroup> groups, SGDOptions defaults = {});

  void step() override;

  static GroupOptions to_group_options(const SGDOptions& o);
  static SGDOptions from_group_options(const GroupOptions& o);

 protected:
  void validate_options(const GroupOptions& options) const override;
  std::vector<std::string> state_keys() const override { return {"momentum_buffer"}; }
  StateSpec state_spec(const std::string& key, const Tensor& param) const override;
};

}  // namespace ember::optim
