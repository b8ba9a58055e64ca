// Node bookkeeping, per-tensor autograd meta, gradient edges and history.
#include "ember/autograd/node.h"

#include <atomic>
#include <cctype>

#include "ember/autograd/accumulate_grad.h"

namespace ember::autograd {

namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};
}  // namespace

Node::Node(std::string op)
    : op_(std::move(op)), sequence_nr_(g_next_sequence_nr.fetch_add(1)), module_(memory::current_module()) {}

// Note [Iterative graph destruction]
// A node owns the nodes below it through its edges, so destroying the last reference to a long chain (an unrolled
// recurrence, a loss accumulated over many steps) would run one nested destructor per node and overflow the stack.
// Instead, a dying node takes over the edges of every child it holds the last reference to, and lets the children
// die one at a time from a flat list.
Node::~Node() {
  std::vector<std::shared_ptr<Node>> pending;
  for (Edge& e : next_edges_)
    if (e.fn) pending.push_back(std::move(e.fn));
  while (!pending.empty()) {
    std::shared_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    if (n.use_count() == 1) {  // n dies at the end of this iteration: adopt its children first
      for (Edge& e : n->next_edges_)
        if (e.fn) pending.push_back(std::move(e.fn));
    }
  }
}

std::string Node::name() const {
  std::string n;
  bool up = true;
  for (char c : op_) {
    if (c == '_') {
      up = true;
      continue;
    }
    n += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    up = false;
  }
  return n + "Backward";
}

std::string Node::forward_description() const {
  std::string s = op_ + "(";
  for (size_t i = 0; i < input_meta_.size(); ++i) {
    if (i > 0) s += ", ";
    const InputMeta& m = input_meta_[i];
    s += m.defined ? detail::concat(dtype_name(m.dtype), shape_str(m.sizes)) : std::string("undefined");
  }
  return s + ")";
}

void Node::add_pre_hook(uint32_t output_nr, std::shared_ptr<HookEntry> hook) {
  prune_removed_hooks();
  pre_hooks_.emplace_back(output_nr, std::move(hook));
}

void Node::add_retains_grad_hook(uint32_t output_nr, std::shared_ptr<HookEntry> hook) {
  retains_grad_hooks_.emplace_back(output_nr, std::move(hook));
}

void check_hook_result(const Tensor& replaced, const Tensor& grad, const std::string& what) {
  EMBER_CHECK(replaced.sizes() == grad.sizes(), ShapeError, "a tensor hook on ", what, " returned ",
              replaced.description(), " for the gradient ", grad.description(), ": a replacement must keep the shape");
  EMBER_CHECK(replaced.dtype() == grad.dtype(), DTypeError, "a tensor hook on ", what, " returned ",
              replaced.description(), " for the gradient ", grad.description(), ": a replacement must keep the dtype");
  EMBER_CHECK(replaced.device() == grad.device(), DeviceError, "a tensor hook on ", what, " returned ",
              replaced.description(), " for the gradient ", grad.description(),
              ": a replacement must stay on the device");
}

void Node::run_pre_hooks(TensorList& grads) {
  // Copies: a hook may register further hooks on this node (they run from the next pass on).
  for (const auto& list : {pre_hooks_, retains_grad_hooks_}) {
    for (const auto& [nr, hook] : list) {
      if (hook->removed || nr >= grads.size() || !grads[nr].defined()) continue;
      Tensor replaced = hook->fn(grads[nr]);
      if (!replaced.defined()) continue;
      check_hook_result(replaced, grads[nr], detail::concat("output ", nr, " of ", name()));
      grads[nr] = std::move(replaced);
    }
  }
}

void Node::prune_removed_hooks() {
  auto removed = [](const auto& entry) { return entry.second->removed; };
  std::erase_if(pre_hooks_, removed);
  std::erase_if(retains_grad_hooks_, removed);
}

AutogradMeta* meta_of(const Tensor& t) {
  if (!t.defined()) return nullptr;
  return static_cast<AutogradMeta*>(t.unsafe_impl()->autograd_meta.get());
}

AutogradMeta& get_or_create_meta(const Tensor& t) {
  TensorImpl* impl = t.unsafe_impl();
  if (impl->autograd_meta == nullptr) impl->autograd_meta = std::make_shared<AutogradMeta>();
  return *static_cast<AutogradMeta*>(impl->autograd_meta.get());
}

bool requires_grad(const Tensor& t) {
  const AutogradMeta* m = meta_of(t);
  return m != nullptr && (m->requires_grad || m->grad_fn != nullptr);
}

Edge gradient_edge(const Tensor& t) {
  AutogradMeta* m = meta_of(t);
  if (m == nullptr) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  if (!m->requires_grad) return {};
  std::shared_ptr<Node> acc = m->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    m->grad_accumulator = acc;
  }
  return {acc, 0};
}

InputMeta input_meta_of(const Tensor& t) {
  if (!t.defined()) return {};
  return InputMeta{true, t.sizes(), t.dtype(), t.device()};
}

// Note [retain_grad across in-place writes]
// .grad of a tensor that retains its gradient is the gradient with respect to the tensor's latest value, as in
// PyTorch: when an in-place op (copy_ from a tensor with history, relu_) gives the tensor a new grad_fn, the retain
// hook leaves the old node and goes to the new one. Hooks registered with register_hook stay where they were: they
// see the gradient of the value the tensor had when they were registered.
void set_history(const Tensor& t, const std::shared_ptr<Node>& node, uint32_t output_nr) {
  AutogradMeta& m = get_or_create_meta(t);
  if (m.retains_grad && m.retains_grad_hook && m.grad_fn && (m.grad_fn != node || m.output_nr != output_nr)) {
    auto moved = std::make_shared<HookEntry>();
    moved->fn = m.retains_grad_hook->fn;
    m.retains_grad_hook->removed = true;
    node->add_retains_grad_hook(output_nr, moved);
    m.retains_grad_hook = std::move(moved);
  }
  m.grad_fn = node;
  m.output_nr = output_nr;
  m.requires_grad = true;
}

}  // namespace ember::autograd
