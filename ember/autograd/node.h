// The graph: a Node per recorded op (its backward), Edges to the nodes of the op's inputs, the per-tensor
// AutogradMeta (requires_grad, .grad, grad_fn, hooks), and SavedTensor (a tensor kept for backward with its version).
// Invariant: a node holds only what its backward needs — saved tensors are detached aliases (no history, so no
// cycles through the graph) and are released right after the node runs unless the graph is retained.
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ember/core/tensor.h"
#include "ember/memory/tags.h"

namespace ember::autograd {

class Node;
using TensorList = std::vector<Tensor>;

// Where a gradient goes: input `input_nr` of node `fn` (fn null: nowhere — the input needs no gradient).
struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

// Geometry of a forward input, used to validate the gradient flowing back into it: a gradient of a broadcast shape
// is summed back to `sizes`, one of another dtype is cast (Note [Gradient validation] in engine.cpp).
struct InputMeta {
  bool defined = false;
  Shape sizes;
  DType dtype = DType::f32;
  Device device = Device::cpu();
};

// A tensor hook: sees the gradient of a tensor before it is used; returns a replacement, or an undefined tensor to
// keep the gradient as it is.
using TensorHook = std::function<Tensor(const Tensor& grad)>;
// Runs after a leaf's .grad was accumulated (DDP launches its bucket all-reduce from here).
using PostAccumulateHook = std::function<void(const Tensor& leaf)>;

struct HookEntry {
  TensorHook fn;
  bool removed = false;
};
struct PostHookEntry {
  PostAccumulateHook fn;
  bool removed = false;
};

// Raises unless a tensor hook's replacement has the gradient's shape, dtype and device; `what` names the tensor.
void check_hook_result(const Tensor& replaced, const Tensor& grad, const std::string& what);

// Returned by register_hook: remove() unregisters the hook (idempotent; harmless after the tensor is gone).
class HookHandle {
 public:
  HookHandle() = default;
  explicit HookHandle(std::function<void()> remover) : remover_(std::move(remover)) {}
  void remove() {
    if (remover_) remover_();
    remover_ = nullptr;
  }

 private:
  std::function<void()> remover_;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  explicit Node(std::string op);
  // Releases the graph below iteratively (Note [Iterative graph destruction] in node.cpp).
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // "MulBackward" for forward op "mul".
  virtual std::string name() const;
  const std::string& op() const { return op_; }
  // grads: one per output of the forward op (undefined = zero). Returns one gradient per next edge (undefined =
  // zero). Runs with grad mode off.
  virtual TensorList apply(TensorList&& grads) = 0;
  // Frees saved tensors; a later apply() raises (backward through a freed graph).
  virtual void release_saved() {}
  // Tensor hooks for this node's outputs run on the incoming gradients before apply (and before grad() captures).
  virtual void run_pre_hooks(TensorList& grads);

  uint64_t sequence_nr() const { return sequence_nr_; }
  // The module whose forward created this node (DESIGN.md §6): its backward's allocations belong to
  // "MODULE/backward". For an AccumulateGrad, the module that first used the leaf in this graph.
  memory::ModuleHandle module() const { return module_; }
  uint32_t num_outputs() const { return num_outputs_; }
  void set_num_outputs(uint32_t n) { num_outputs_ = n; }
  std::vector<Edge>& next_edges() { return next_edges_; }
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  std::vector<InputMeta>& input_meta() { return input_meta_; }
  const std::vector<InputMeta>& input_meta() const { return input_meta_; }
  // "mul(f32[2, 3], f32[3])": the forward op and its input shapes, for error and anomaly messages.
  std::string forward_description() const;

  // Hooks on output `output_nr` (a non-leaf tensor's register_hook), run in registration order.
  void add_pre_hook(uint32_t output_nr, std::shared_ptr<HookEntry> hook);
  // retain_grad()'s hook on output `output_nr`: runs after all the other hooks, so the retained .grad is the
  // gradient the node goes on to use (as in PyTorch), whatever the registration order.
  void add_retains_grad_hook(uint32_t output_nr, std::shared_ptr<HookEntry> hook);
  // Drops hooks whose handles were removed (registration calls it, so lists do not grow step after step).
  void prune_removed_hooks();

 private:
  std::string op_;
  uint64_t sequence_nr_;
  memory::ModuleHandle module_;
  uint32_t num_outputs_ = 1;
  std::vector<Edge> next_edges_;
  std::vector<InputMeta> input_meta_;
  std::vector<std::pair<uint32_t, std::shared_ptr<HookEntry>>> pre_hooks_;
  std::vector<std::pair<uint32_t, std::shared_ptr<HookEntry>>> retains_grad_hooks_;
};

// Per-tensor autograd state, created lazily (a tensor without it needs no gradient and has no history).
struct AutogradMeta : AutogradMetaBase {
  bool requires_grad = false;  // leaves: set by requires_grad_(); non-leaves: always true (they have a grad_fn)
  Tensor grad;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  std::weak_ptr<Node> grad_accumulator;  // leaves: the AccumulateGrad node, while some graph uses it
  std::vector<std::shared_ptr<HookEntry>> leaf_hooks;
  std::vector<std::shared_ptr<PostHookEntry>> post_accumulate_hooks;
  bool retains_grad = false;
  // retain_grad()'s entry on grad_fn: set_history moves it to a new grad_fn (Note [retain_grad across in-place
  // writes] in node.cpp).
  std::shared_ptr<HookEntry> retains_grad_hook;
  bool is_view = false;  // made by a recorded view op: in-place writes into it are refused (no history rebase)
};

// The meta of t, or null. get_or_create_meta attaches a fresh one.
AutogradMeta* meta_of(const Tensor& t);
AutogradMeta& get_or_create_meta(const Tensor& t);

// True when t takes part in autograd: a leaf with requires_grad, or a tensor with a grad_fn.
bool requires_grad(const Tensor& t);
// The edge a gradient for t flows into: t's grad_fn output, or its leaf accumulator (created on demand).
Edge gradient_edge(const Tensor& t);
InputMeta input_meta_of(const Tensor& t);
// Makes `node` output `output_nr` the history of t (t becomes a non-leaf that requires grad).
void set_history(const Tensor& t, const std::shared_ptr<Node>& node, uint32_t output_nr = 0);

// A tensor saved for backward. Keeps a detached alias of the tensor (same storage) and its version; unpack()
// refuses if the storage was written in place since (Note [Saved tensor versions] in saved_tensor.cpp). Under
// saved-tensor hooks (saved_hooks.h) it keeps only what the pack hook returned.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  // `node` names the backward in error messages.
  Tensor unpack(const Node& node) const;
  void reset();
  bool defined() const { return was_defined_; }

 private:
  bool was_defined_ = false;
  bool released_ = false;
  Tensor data_;
  int64_t saved_version_ = 0;
  std::weak_ptr<StorageImpl> storage_;  // the version source, without keeping the bytes alive
  Shape sizes_;  // for error messages (formatted only when raising)
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu();
  std::string description() const;
  std::any packed_;
  std::function<Tensor(const std::any&)> unpack_hook_;
};

}  // namespace ember::autograd
