// FunctionNode: a recorded op whose backward is a formula over its saved tensors.
#include "ember/autograd/function_node.h"

namespace ember::autograd {

Tensor BackwardContext::saved(size_t i) const { return node_.saved_slot(i).unpack(node_); }
bool BackwardContext::needs_grad(size_t input) const { return node_.needs_grad(input); }
const InputMeta& BackwardContext::input(size_t input) const {
  EMBER_CHECK(input < node_.input_meta().size(), IndexError, node_.name(), ": no input ", input);
  return node_.input_meta()[input];
}

size_t FunctionNode::save(const Tensor& t) {
  saved_.emplace_back(t);
  return saved_.size() - 1;
}

const SavedTensor& FunctionNode::saved_slot(size_t i) const {
  EMBER_CHECK(i < saved_.size(), IndexError, name(), ": no saved tensor ", i);
  return saved_[i];
}

void FunctionNode::set_outputs(std::initializer_list<const Tensor*> outputs) {
  set_num_outputs(static_cast<uint32_t>(outputs.size()));
  uint32_t nr = 0;
  auto self = std::static_pointer_cast<Node>(shared_from_this());
  for (const Tensor* t : outputs) {
    if (t != nullptr && t->defined()) set_history(*t, self, nr);
    ++nr;
  }
}

// A released node still runs when its formula reads no saved tensor (as in PyTorch); one that does raises from
// SavedTensor::unpack.
TensorList FunctionNode::apply(TensorList&& grads) {
  EMBER_CHECK(formula != nullptr, ValueError, name(), " has no backward formula");
  TensorList out = formula(BackwardContext(*this), grads);
  out.resize(next_edges().size());
  return out;
}

void FunctionNode::release_saved() {
  for (SavedTensor& s : saved_) s.reset();
}

bool should_record(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t != nullptr && t->defined() && requires_grad(*t)) return true;
  return false;
}

std::shared_ptr<FunctionNode> make_node(const char* op, std::initializer_list<const Tensor*> inputs) {
  if (!should_record(inputs)) return nullptr;
  auto node = std::make_shared<FunctionNode>(op);
  node->next_edges().reserve(inputs.size());
  node->input_meta().reserve(inputs.size());
  for (const Tensor* t : inputs) {
    const bool used = t != nullptr && t->defined();
    node->next_edges().push_back(used ? gradient_edge(*t) : Edge{});
    node->input_meta().push_back(used ? input_meta_of(*t) : InputMeta{});
  }
  return node;
}

}  // namespace ember::autograd
