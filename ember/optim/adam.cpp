// Adam / AdamW: option validation and the per-parameter step through ops::adam_step_.
// Invariant: a parameter's step count and new moment tensors join its state only after the kernel has run.
#include "ember/optim/adam.h"

#include "ember/core/grad_mode.h"
#include "ember/kernels/ops.h"
#include "ember/memory/tags.h"

namespace ember::optim {

namespace {
AdamOptions adam_options(const AdamWOptions& o) { return {o.lr, o.betas, o.eps, o.weight_decay}; }
}  // namespace

GroupOptions Adam::to_group_options(const AdamOptions& o) {
  return {{"lr", o.lr}, {"beta1", o.betas.first}, {"beta2", o.betas.second}, {"eps", o.eps},
          {"weight_decay", o.weight_decay}};
}

AdamOptions Adam::from_group_options(const GroupOptions& o) {
  return {o.get("lr"), {o.get("beta1"), o.get("beta2")}, o.get("eps"), o.get("weight_decay")};
}

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Adam(std::vector<ParamGroup>{{std::move(params)}}, options, false) {}
Adam::Adam(std::vector<ParamGroup> groups, AdamOptions defaults) : Adam(std::move(groups), defaults, false) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults, bool decoupled)
    : Optimizer(to_group_options(defaults)), decoupled_(decoupled) {
  validate_options(this->defaults());
  init_groups(std::move(groups));
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : Adam(std::vector<ParamGroup>{{std::move(params)}}, adam_options(options), true) {}
AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults)
    : Adam(std::move(groups), adam_options(defaults), true) {}

void Adam::validate_options(const GroupOptions& options) const {
  const char* name = decoupled_ ? "AdamW" : "Adam";
  const AdamOptions o = from_group_options(options);
  EMBER_CHECK(o.lr >= 0.0, ValueError, name, ": invalid learning rate: ", o.lr);
  EMBER_CHECK(o.eps >= 0.0, ValueError, name, ": invalid epsilon value: ", o.eps);
  EMBER_CHECK(o.betas.first >= 0.0 && o.betas.first < 1.0, ValueError, name, ": invalid beta parameter at index 0: ",
              o.betas.first);
  EMBER_CHECK(o.betas.second >= 0.0 && o.betas.second < 1.0, ValueError, name,
              ": invalid beta parameter at index 1: ", o.betas.second);
  EMBER_CHECK(o.weight_decay >= 0.0, ValueError, name, ": invalid weight_decay value: ", o.weight_decay);
}

Optimizer::StateSpec Adam::state_spec(const std::string& key, const Tensor& param) const {
  if (key == "step") return {DType::f64, {}, Device::cpu()};
  return {ops::optimizer_state_dtype(param.dtype()), param.sizes(), param.device()};
}

void Adam::step() {
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);
  NoGradGuard no_grad;
  for (const ParamGroup& group : param_groups()) {
    const AdamOptions o = from_group_options(group.options);
    for (const Tensor& p : group.params) {
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      const ParamState& st = state(p);
      const bool fresh = st.empty();
      Tensor step_t, exp_avg, exp_avg_sq;
      if (fresh) {
        const TensorOptions opts(ops::optimizer_state_dtype(p.dtype()), p.device());
        // The step count lives on the host (as PyTorch keeps it), except in a meta dry run, which counts it with the
        // parameters: it simulates a CPU run there, where the host is the device (a GPU run's is host memory).
        step_t = scalar_tensor(0.0, TensorOptions(DType::f64, p.device().is_meta() ? p.device() : Device::cpu()));
        exp_avg = zeros(p.sizes(), opts);
        exp_avg_sq = zeros(p.sizes(), opts);
      } else {
        step_t = st.get("step");
        exp_avg = st.get("exp_avg");
        exp_avg_sq = st.get("exp_avg_sq");
      }
      const double step = step_t.item<double>() + 1.0;
      const AdamParams ap{o.lr, o.betas.first, o.betas.second, o.eps, o.weight_decay, decoupled_,
                          static_cast<int64_t>(step)};
      update_contiguous(p, grad, [&](const Tensor& pc, const Tensor& gc) {
        ops::adam_step_(pc, gc, exp_avg, exp_avg_sq, ap);
      });
      step_t.fill_(step);
      if (fresh) {
        ParamState& s = mutable_state(p);
        s.set("step", step_t);
        s.set("exp_avg", exp_avg);
        s.set("exp_avg_sq", exp_avg_sq);
      }
    }
  }
}

}  // namespace ember::optim
