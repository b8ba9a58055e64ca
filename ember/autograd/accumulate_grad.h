// AccumulateGrad: the node at the end of every path to a leaf that requires grad. It runs the leaf's tensor hooks,
// adds the incoming gradient into leaf.grad (Note [Gradient accumulation] in accumulate_grad.cpp), then runs the
// post-accumulate hooks.
#pragma once

#include "ember/autograd/node.h"

namespace ember::autograd {

class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf);
  std::string name() const override { return "AccumulateGrad"; }
  TensorList apply(TensorList&& grads) override;
  void run_pre_hooks(TensorList& grads) override;
  const Tensor& leaf() const { return leaf_; }

 private:
  Tensor leaf_;  // shares the leaf's TensorImpl (and so its meta); the meta only points back weakly
};

// Adds `incoming` into `slot` (an undefined slot takes it): in place when `in_place` allows and the slot is dense
// with incoming's shape and dtype (Note [Gradient accumulation]), else as a new tensor. The result never aliases
// `incoming` unless incoming is a dense tensor nothing else references, so later in-place use of .grad cannot touch
// other tensors. Leaves' .grad accumulate in place; retained non-leaf gradients do not (as in PyTorch).
void accumulate_into(Tensor& slot, const Tensor& incoming, bool in_place = true);

}  // namespace ember::autograd
