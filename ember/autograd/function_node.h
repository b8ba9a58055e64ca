// How a differentiable op records itself (used by the formulas_*.cpp files):
//
//   Tensor mul(const Tensor& a, const Tensor& b) {
//     Tensor out = forward_op("mul", {&a, &b}, [&] { return ops::mul(a, b); });
//     if (auto node = make_node("mul", {&a, &b})) {
//       node->save(node->needs_grad(1) ? a : Tensor());  // saved slot 0: only what the formula will read
//       node->save(node->needs_grad(0) ? b : Tensor());  // saved slot 1
//       node->formula = [](const BackwardContext& c, const TensorList& g) -> TensorList {
//         return {c.needs_grad(0) ? mul(g[0], c.saved(1)) : Tensor(), c.needs_grad(1) ? mul(g[0], c.saved(0)) : Tensor()};
//       };
//       node->set_outputs({&out});
//     }
//     return out;
//   }
//
// Formulas may return gradients in a broadcast shape or another dtype: the engine sums and casts them back to the
// input's geometry (Note [Gradient validation] in engine.cpp). A formula must not capture tensors (they would
// outlive release_saved()); it reads them through the context.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>

#include "ember/autograd/anomaly.h"
#include "ember/autograd/node.h"
#include "ember/core/grad_mode.h"

namespace ember::autograd {

class FunctionNode;

class BackwardContext {
 public:
  explicit BackwardContext(const FunctionNode& node) : node_(node) {}
  Tensor saved(size_t i) const;                // unpacks saved slot i (version-checked)
  bool needs_grad(size_t input) const;         // does input `input` want a gradient?
  const InputMeta& input(size_t input) const;  // geometry of forward input `input`

 private:
  const FunctionNode& node_;
};

using Formula = std::function<TensorList(const BackwardContext& ctx, const TensorList& grads)>;

class FunctionNode : public Node {
 public:
  using Node::Node;
  Formula formula;

  bool needs_grad(size_t input) const { return input < next_edges().size() && next_edges()[input].valid(); }
  size_t save(const Tensor& t);  // returns the slot
  // Makes each output's history this node (output i = forward output i) and counts the outputs.
  void set_outputs(std::initializer_list<const Tensor*> outputs);

  TensorList apply(TensorList&& grads) override;
  void release_saved() override;
  const SavedTensor& saved_slot(size_t i) const;

 private:
  std::vector<SavedTensor> saved_;
};

// True when an op on these inputs must be recorded: grad mode is on and one of them requires grad.
bool should_record(std::initializer_list<const Tensor*> inputs);
// A node for `op` with edges to the inputs (undefined inputs allowed), or null when nothing needs recording.
std::shared_ptr<FunctionNode> make_node(const char* op, std::initializer_list<const Tensor*> inputs);

// Runs the kernel front end of a differentiable op with grad mode off (its internal views and copies are not
// recorded) and, in anomaly mode, checks the output when the op is being recorded.
template <class Fn>
auto forward_op(const char* op, std::initializer_list<const Tensor*> inputs, Fn&& fn) {
  auto result = [&] {
    NoGradGuard no_grad;
    return fn();
  }();
  if (AnomalyMode::is_enabled() && should_record(inputs)) {
    if constexpr (std::is_same_v<decltype(result), Tensor>) check_forward_anomaly(op, inputs, result);
    else check_forward_anomaly(op, inputs, result.out);
  }
  return result;
}

}  // namespace ember::autograd
