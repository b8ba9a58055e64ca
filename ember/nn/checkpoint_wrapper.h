// Module-level activation checkpointing: CheckpointWrapper runs a wrapped module's forward as one checkpointed region
// (autograd::checkpoint), and checkpoint_sequential splits a list of modules into checkpointed segments.
// Invariant: wrapping changes memory and time only — parameters, state_dict names ("module.<name>"), outputs and
// gradients are those of the wrapped module (bit-identical, dropout included).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ember/nn/layers.h"
#include "ember/nn/module.h"

namespace ember::nn {

// Wraps `module` (registered as the child "module"); forward(x) is autograd::checkpoint(module->forward, x): the
// activations inside the module are recomputed during backward instead of kept. train()/eval(), to() and
// state_dict reach the wrapped module as a child. ValueError for a null module.
class CheckpointWrapper : public Module {
 public:
  explicit CheckpointWrapper(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Module> module;
};

// torch.utils.checkpoint.checkpoint_sequential over modules: `segments` contiguous runs (n / segments modules each,
// the last run takes the rest and is not checkpointed). segments in [1, modules.size()] (ValueError otherwise).
Tensor checkpoint_sequential(const std::vector<std::shared_ptr<Module>>& modules, int64_t segments, const Tensor& x);
Tensor checkpoint_sequential(const Sequential& sequential, int64_t segments, const Tensor& x);

}  // namespace ember::nn
