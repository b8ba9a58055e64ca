// SGD: option validation and the per-parameter step through ops::sgd_step_.
// Invariant: a step never reads a momentum buffer it has not written (first_step initialises it).
#include "ember/optim/sgd.h"

#include <vector>

#include "ember/core/grad_mode.h"
#include "ember/kernels/ops.h"
#include "ember/memory/tags.h"

namespace ember::optim {

GroupOptions SGD::to_group_options(const SGDOptions& o) {
  return {{"lr", o.lr},
          {"momentum", o.momentum},
          {"dampening", o.dampening},
          {"weight_decay", o.weight_decay},
          {"nesterov", o.nesterov ? 1.0 : 0.0}};
}

SGDOptions SGD::from_group_options(const GroupOptions& o) {
  return {o.get("lr"), o.get("momentum"), o.get("dampening"), o.get("weight_decay"), o.get("nesterov") != 0.0};
}

SGD::SGD(std::vector<Tensor> params, SGDOptions options) : SGD(std::vector<ParamGroup>{{std::move(params)}}, options) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions defaults) : Optimizer(to_group_options(defaults)) {
  validate_options(this->defaults());
  init_groups(std::move(groups));
}

void SGD::validate_options(const GroupOptions& options) const {
  const SGDOptions o = from_group_options(options);
  EMBER_CHECK(o.lr >= 0.0, ValueError, "SGD: invalid learning rate: ", o.lr);
  EMBER_CHECK(o.momentum >= 0.0, ValueError, "SGD: invalid momentum value: ", o.momentum);
  EMBER_CHECK(o.weight_decay >= 0.0, ValueError, "SGD: invalid weight_decay value: ", o.weight_decay);
  EMBER_CHECK(o.dampening == o.dampening, ValueError, "SGD: invalid dampening value: ", o.dampening);
  EMBER_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0), ValueError,
              "SGD: nesterov momentum requires a momentum > 0 and zero dampening (momentum ", o.momentum,
              ", dampening ", o.dampening, ")");
}

Optimizer::StateSpec SGD::state_spec(const std::string& key, const Tensor& param) const {
  return {ops::optimizer_state_dtype(param.dtype()), param.sizes(), param.device()};
}

// New momentum buffers are all created before any parameter is updated, so an OutOfMemoryError in the first step
// leaves every parameter as it was (Note [All-or-nothing step] in adam.cpp).
void SGD::step() {
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);
  NoGradGuard no_grad;
  struct Pending {
    Tensor param, grad, buf;
    SgdParams sp;
  };
  std::vector<Pending> pending;
  for (const ParamGroup& group : param_groups()) {
    const SGDOptions o = from_group_options(group.options);
    for (const Tensor& p : group.params) {
      Pending w;
      w.grad = p.grad();
      if (!w.grad.defined()) continue;
      w.param = p;
      w.sp = SgdParams{o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov, false};
      if (o.momentum != 0.0) {
        const ParamState& st = state(p);
        w.sp.first_step = !st.has("momentum_buffer");
        // A new buffer joins the state only once the step has written it.
        w.buf = w.sp.first_step ? empty(p.sizes(), TensorOptions(ops::optimizer_state_dtype(p.dtype()), p.device()))
                                : st.get("momentum_buffer");
      }
      pending.push_back(std::move(w));
    }
  }
  for (Pending& w : pending) {
    update_contiguous(w.param, w.grad,
                      [&](const Tensor& pc, const Tensor& gc) { ops::sgd_step_(pc, gc, w.buf, w.sp); });
    if (w.sp.first_step) mutable_state(w.param).set("momentum_buffer", w.buf);
  }
}

}  // namespace ember::optim
