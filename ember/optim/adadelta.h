// Adadelta: torch.optim.Adadelta's update rule (the optimizer of pytorch/examples' MNIST CNN), composed from the
// elementwise ops (no fused kernel: it runs once per parameter per step, a handful of passes).
// Invariant: a parameter's state is empty or complete: "square_avg" and "acc_delta" (f32, or f64 for f64 params).
#pragma once

#include <vector>

#include "ember/optim/optimizer.h"

namespace ember::optim {

// torch.optim.Adadelta's arguments and defaults. Group option names: "lr", "rho", "eps", "weight_decay".
//   g += weight_decay * p;  square_avg = rho * square_avg + (1 - rho) * g^2;
//   delta = sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g;  acc_delta = rho * acc_delta + (1 - rho) * delta^2;
//   p -= lr * delta
struct AdadeltaOptions {
  double lr = 1.0;
  double rho = 0.9;
  double eps = 1e-6;
  double weight_decay = 0.0;
};

class Adadelta : public Optimizer {
 public:
  // ValueError for a negative lr, eps or weight_decay, or rho outside [0, 1].
  explicit Adadelta(std::vector<Tensor> params, AdadeltaOptions options = {});
  Adadelta(std::vector<ParamGroup> groups, AdadeltaOptions defaults = {});

  void step() override;

  static GroupOptions to_group_options(const AdadeltaOptions& o);
  static AdadeltaOptions from_group_options(const GroupOptions& o);

 protected:
  void validate_options(const GroupOptions& options) const override;
  std::vector<std::string> state_keys() const override { return {"square_avg", "acc_delta"}; }
  StateSpec state_spec(const std::string& key, const Tensor& param) const override;
};

}  // namespace ember::optim
