// CheckpointWrapper and checkpoint_sequential over modules: thin adapters from modules to autograd::checkpoint.
// Invariant: the regions capture the modules by shared_ptr, so a recomputation during backward finds them alive.
#include "ember/nn/checkpoint_wrapper.h"

#include "ember/autograd/checkpoint.h"

namespace ember::nn {

CheckpointWrapper::CheckpointWrapper(std::shared_ptr<Module> m) : Module("CheckpointWrapper") {
  EMBER_CHECK(m != nullptr, ValueError, "CheckpointWrapper: the wrapped module is null");
  module = register_module("module", std::move(m));
}

Tensor CheckpointWrapper::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  return autograd::checkpoint([m = module](const Tensor& h) { return m->forward(h); }, x);
}

Tensor checkpoint_sequential(const std::vector<std::shared_ptr<Module>>& modules, int64_t segments, const Tensor& x) {
  std::vector<autograd::TensorFn> fns;
  fns.reserve(modules.size());
  for (size_t i = 0; i < modules.size(); ++i) {
    EMBER_CHECK(modules[i] != nullptr, ValueError, "checkpoint_sequential: module ", i, " is null");
    fns.push_back([m = modules[i]](const Tensor& h) { return m->forward(h); });
  }
  return autograd::checkpoint_sequential(fns, segments, x);
}

Tensor checkpoint_sequential(const Sequential& sequential, int64_t segments, const Tensor& x) {
  return checkpoint_sequential(std::vector<std::shared_ptr<Module>>(sequential.begin(), sequential.end()), segments,
                               x);
}

}  // namespace ember::nn
