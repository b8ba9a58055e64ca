// Adadelta: option validation and the per-parameter step (adadelta.h), computed in the state dtype.
// Invariant: the state tensors are written in place (copy_), so state_dict() entries keep aliasing the live state.
#include "ember/optim/adadelta.h"

#include "ember/core/grad_mode.h"
#include "ember/kernels/ops.h"
#include "ember/memory/tags.h"

namespace ember::optim {

GroupOptions Adadelta::to_group_options(const AdadeltaOptions& o) {
  return {{"lr", o.lr}, {"rho", o.rho}, {"eps", o.eps}, {"weight_decay", o.weight_decay}};
}

AdadeltaOptions Adadelta::from_group_options(const GroupOptions& o) {
  return {o.get("lr"), o.get("rho"), o.get("eps"), o.get("weight_decay")};
}

Adadelta::Adadelta(std::vector<Tensor> params, AdadeltaOptions options)
    : Adadelta(std::vector<ParamGroup>{{std::move(params)}}, options) {}

Adadelta::Adadelta(std::vector<ParamGroup> groups, AdadeltaOptions defaults) : Optimizer(to_group_options(defaults)) {
  validate_options(this->defaults());
  init_groups(std::move(groups));
}

void Adadelta::validate_options(const GroupOptions& options) const {
  const AdadeltaOptions o = from_group_options(options);
  EMBER_CHECK(o.lr >= 0.0, ValueError, "Adadelta: invalid learning rate: ", o.lr);
  EMBER_CHECK(o.rho >= 0.0 && o.rho <= 1.0, ValueError, "Adadelta: invalid rho value: ", o.rho);
  EMBER_CHECK(o.eps >= 0.0, ValueError, "Adadelta: invalid epsilon value: ", o.eps);
  EMBER_CHECK(o.weight_decay >= 0.0, ValueError, "Adadelta: invalid weight_decay value: ", o.weight_decay);
}

Optimizer::StateSpec Adadelta::state_spec(const std::string&, const Tensor& param) const {
  return {ops::optimizer_state_dtype(param.dtype()), param.sizes(), param.device()};
}

void Adadelta::step() {
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);
  NoGradGuard no_grad;
  for (const ParamGroup& group : param_groups()) {
    const AdadeltaOptions o = from_group_options(group.options);
    for (const Tensor& p : group.params) {
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      const DType sd = ops::optimizer_state_dtype(p.dtype());
      ParamState& st = mutable_state(p);
      if (st.empty()) {
        st.set("square_avg", zeros(p.sizes(), TensorOptions(sd, p.device())));
        st.set("acc_delta", zeros(p.sizes(), TensorOptions(sd, p.device())));
      }
      Tensor square_avg = st.get("square_avg"), acc_delta = st.get("acc_delta");
      Tensor g = grad.to(sd);
      const Tensor p_state = p.to(sd);
      if (o.weight_decay != 0.0) g = ops::add(g, ops::mul(p_state, o.weight_decay));
      square_avg.copy_(ops::add(ops::mul(square_avg, o.rho), ops::mul(ops::mul(g, g), 1.0 - o.rho)));
      const Tensor delta = ops::mul(ops::div(ops::sqrt(ops::add(acc_delta, o.eps)), ops::sqrt(ops::add(square_avg, o.eps))), g);
      acc_delta.copy_(ops::add(ops::mul(acc_delta, o.rho), ops::mul(ops::mul(delta, delta), 1.0 - o.rho)));
      Tensor dst = p;
      dst.copy_(ops::sub(p_state, ops::mul(delta, o.lr)));
    }
  }
}

}  // namespace ember::optim
