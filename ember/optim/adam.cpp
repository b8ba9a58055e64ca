// Adam / AdamW: option validation and the step through ops::adam_step_multi_ (one launch for many parameters on CUDA).
// Invariant: a parameter's step count and new moment tensors join its state only after the kernel has run, and every
// new state tensor exists before any parameter is updated (Note [All-or-nothing step]).
#include "ember/optim/adam.h"

#include <vector>

#include "ember/core/grad_mode.h"
#include "ember/core/meta_scope.h"
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

// Note [All-or-nothing step]
// A step that runs out of memory must not leave some parameters updated and others not (an OOM-resilient caller
// retries or gives up on the whole step). The only allocations of a step are the state tensors it creates for
// parameters that have none yet (the first step), so the step creates all of them first — into locals, joining the
// state only after their parameter's update — and only then updates any parameter. An OutOfMemoryError while
// creating them leaves parameters and state exactly as they were (the new tensors are freed). The update pass
// allocates only for a parameter that is not contiguous or a gradient of another dtype or layout
// (update_contiguous), which the optimizers' own callers do not produce.
void Adam::step() {
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);
  NoGradGuard no_grad;
  struct Pending {
    Tensor param, grad, step_t, exp_avg, exp_avg_sq;
    AdamParams ap;
    bool fresh = false;
  };
  std::vector<Pending> pending;
  for (const ParamGroup& group : param_groups()) {  // Note [All-or-nothing step]: every allocation first
    const AdamOptions o = from_group_options(group.options);
    for (const Tensor& p : group.params) {
      Pending w;
      w.grad = p.grad();
      if (!w.grad.defined()) continue;
      w.param = p;
      const ParamState& st = state(p);
      w.fresh = st.empty();
      if (w.fresh) {
        const TensorOptions opts(ops::optimizer_state_dtype(p.dtype()), p.device());
        // The step count lives on the host (as PyTorch keeps it); a meta dry run keeps it where the run it stands in
        // for does (host_state_device: with the parameters for a CPU run, on the host for a CUDA run).
        w.step_t = scalar_tensor(0.0, TensorOptions(DType::f64, host_state_device(p.device())));
        w.exp_avg = zeros(p.sizes(), opts);
        w.exp_avg_sq = zeros(p.sizes(), opts);
      } else {
        w.step_t = st.get("step");
        w.exp_avg = st.get("exp_avg");
        w.exp_avg_sq = st.get("exp_avg_sq");
      }
      const double step = w.step_t.item<double>() + 1.0;
      w.ap = AdamParams{o.lr, o.betas.first, o.betas.second, o.eps, o.weight_decay, decoupled_,
                        static_cast<int64_t>(step)};
      pending.push_back(std::move(w));
    }
  }
  // Contiguous parameters with gradients of their own dtype and layout (what backward produces) are updated together
  // (Note [Multi-tensor Adam] in kernels/ops_optim.cpp); any other goes through a contiguous copy, one at a time.
  std::vector<AdamStepEntry> together;
  for (const Pending& w : pending) {
    if (w.param.is_contiguous() && w.grad.is_contiguous() && w.grad.dtype() == w.param.dtype())
      together.push_back({w.param, w.grad, w.exp_avg, w.exp_avg_sq, w.ap});
    else
      update_contiguous(w.param, w.grad, [&](const Tensor& pc, const Tensor& gc) {
        ops::adam_step_(pc, gc, w.exp_avg, w.exp_avg_sq, w.ap);
      });
  }
  ops::adam_step_multi_(together);
  for (Pending& w : pending) {
    w.step_t.fill_(static_cast<double>(w.ap.step));
    if (w.fresh) {
      ParamState& s = mutable_state(w.param);
      s.set("step", w.step_t);
      s.set("exp_avg", w.exp_avg);
      s.set("exp_avg_sq", w.exp_avg_sq);
    }
  }
}

}  // namespace ember::optim
