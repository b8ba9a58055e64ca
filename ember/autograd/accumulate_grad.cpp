// AccumulateGrad and the rule for adding gradients into .grad.
#include "ember/autograd/accumulate_grad.h"

#include "ember/core/grad_mode.h"
#include "ember/kernels/ops.h"

namespace ember::autograd {

AccumulateGrad::AccumulateGrad(Tensor leaf) : Node("accumulate_grad"), leaf_(std::move(leaf)) {
  input_meta().push_back(input_meta_of(leaf_));
}

void AccumulateGrad::run_pre_hooks(TensorList& grads) {
  AutogradMeta* m = meta_of(leaf_);
  if (m == nullptr || grads.empty() || !grads[0].defined()) return;
  const auto hooks = m->leaf_hooks;  // a hook may register further hooks
  for (const auto& hook : hooks) {
    if (hook->removed) continue;
    Tensor replaced = hook->fn(grads[0]);
    if (!replaced.defined()) continue;
    check_hook_result(replaced, grads[0], "leaf " + leaf_.description());
    grads[0] = std::move(replaced);
  }
}

// Note [Gradient accumulation]
// The first gradient a leaf receives becomes its .grad without a copy when it is dense and referenced by nothing
// else (the engine hands over the last reference); otherwise it is copied, because an incoming gradient may be a
// view (an expanded ones tensor from sum's backward) or be shared with another input (add passes one tensor to
// both operands). Later gradients are added IN PLACE into .grad when it is dense with the incoming gradient's shape
// and dtype (PyTorch's AccumulateGrad does the same): backward then holds one weight gradient at a time instead of
// two (the incoming one and a fresh sum), which is what a second micro-batch of gradient accumulation costs. A .grad
// the user holds therefore sees later backward passes, as in PyTorch; gradients add up across backward() calls
// until the user clears them. With grad mode on (a hook that records) the sum is made out of place. The add bumps
// .grad's version: a graph that saved .grad for backward (.grad used in a forward) and runs its backward after the
// add raises the saved-tensor version error, as in PyTorch; use a clone of .grad in a forward instead.
void accumulate_into(Tensor& slot, const Tensor& incoming, bool in_place) {
  if (!incoming.defined()) return;
  if (!slot.defined()) {
    const bool sole_owner = incoming.use_count() == 1 && incoming.storage().use_count() == 1 &&
                            incoming.is_contiguous() && incoming.storage_offset() == 0 &&
                            incoming.nbytes() == incoming.storage()->nbytes() && meta_of(incoming) == nullptr;
    slot = sole_owner ? incoming : incoming.clone();
    return;
  }
  in_place = in_place && !GradMode::is_enabled() && slot.is_contiguous() && slot.sizes() == incoming.sizes() &&
                        slot.dtype() == incoming.dtype() && slot.device() == incoming.device() &&
                        is_floating(slot.dtype()) && !requires_grad(slot);
  if (in_place)
    ops::add_(slot, incoming);
  else
    slot = ops::add(slot, incoming);
}

TensorList AccumulateGrad::apply(TensorList&& grads) {
  AutogradMeta* m = meta_of(leaf_);
  if (m == nullptr || grads.empty() || !grads[0].defined()) return {};
  Tensor g = std::move(grads[0]);
  grads.clear();
  accumulate_into(m->grad, g);
  for (size_t i = 0; i < m->post_accumulate_hooks.size(); ++i) {
    auto hook = m->post_accumulate_hooks[i];
    if (!hook->removed) hook->fn(leaf_);
  }
  return {};
}

}  // namespace ember::autograd
