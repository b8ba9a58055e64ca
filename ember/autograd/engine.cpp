// The backward engine: dependency counting over the reachable graph, then nodes run in order of decreasing sequence
// number as their inputs complete (the most recent op first, which keeps few gradients alive at once).
#include "ember/autograd/engine.h"

#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "ember/autograd/accumulate_grad.h"
#include "ember/autograd/anomaly.h"
#include "ember/core/grad_mode.h"
#include "ember/kernels/ops.h"

namespace ember::autograd {

namespace {

// Sums `grad` over the dims it was broadcast along so it has shape `target`.
Tensor sum_to(const Tensor& grad, const Shape& target) {
  const int64_t lead = grad.dim() - static_cast<int64_t>(target.size());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < grad.dim(); ++d) {
    if (d < lead) dims.push_back(d);
    else if (target[d - lead] == 1 && grad.size(d) != 1) dims.push_back(d);
  }
  Tensor r = dims.empty() ? grad : ops::sum(grad, dims, /*keepdim=*/true);
  return r.sizes() == target ? r : r.reshape(target);
}

bool expandable_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  const size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] != to[lead + i] && from[i] != 1) return false;
  return true;
}

// Note [Gradient validation]
// A formula may return the gradient of an input in the broadcast shape of the op's output, or in its compute dtype.
// Before a gradient travels along an edge it is summed back to the input's shape and cast to the input's dtype;
// any other mismatch (a shape the input could not have been broadcast from, another device) is a bug in the formula
// and raises, naming the node.
Tensor validate_grad(const Node& node, size_t i, Tensor g) {
  const InputMeta& m = node.input_meta()[i];
  if (!m.defined || !g.defined()) return g;
  if (g.sizes() != m.sizes) {
    EMBER_CHECK(expandable_to(m.sizes, g.sizes()), ShapeError, node.name(), " (", node.forward_description(),
                ") returned a gradient of shape ", shape_str(g.sizes()), " for input ", i, " of shape ",
                shape_str(m.sizes));
    g = sum_to(g, m.sizes);
  }
  EMBER_CHECK(g.device() == m.device, DeviceError, node.name(), " returned a gradient on ", g.device().str(),
              " for input ", i, " on ", m.device.str());
  if (g.dtype() != m.dtype) g = g.to(m.dtype);
  return g;
}

void check_backward_anomaly(const Node& node, const TensorList& grads) {
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!has_non_finite(grads[i])) continue;
    EMBER_THROW(AnomalyError, "anomaly: ", node.name(), " returned NaN or Inf in the gradient of its input ", i, " (",
                grads[i].description(), "); the forward op that created it: ", node.forward_description());
  }
}

struct ReadyOrder {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr() < b->sequence_nr(); }
};

struct Capture {
  uint32_t input_nr;
  size_t result_index;
};

class GraphTask {
 public:
  GraphTask(bool retain_graph, bool accumulate) : retain_graph_(retain_graph), accumulate_(accumulate) {}

  // For grad(): `edge` is where the gradient of inputs[index] arrives; it is captured there, and only nodes on a
  // path to a capture run.
  void add_capture(const Edge& edge, size_t index) {
    captures_[edge.fn.get()].push_back({edge.input_nr, index});
  }

  TensorList run(const std::vector<Edge>& roots, TensorList root_grads, size_t num_results) {
    results_.assign(num_results, Tensor());
    // Roots keep the graph alive while it runs (the user may drop the outputs inside a hook).
    std::vector<std::shared_ptr<Node>> keep;
    for (const Edge& e : roots) keep.push_back(e.fn);
    compute_dependencies(roots);
    for (size_t i = 0; i < roots.size(); ++i) {
      if (!eligible(roots[i].fn.get())) continue;
      add_input(roots[i].fn.get(), roots[i].input_nr, std::move(root_grads[i]));
    }
    // Formulas, hooks and accumulation all run with grad mode off: nothing they compute is recorded.
    AutoGradMode no_grad(false);
    std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready;
    std::unordered_set<Node*> queued;
    for (const Edge& e : roots) {
      Node* n = e.fn.get();
      if (eligible(n) && dependencies_[n] == 0 && queued.insert(n).second) ready.push(n);
    }
    while (!ready.empty()) {
      Node* node = ready.top();
      ready.pop();
      execute(node, ready);
    }
    return std::move(results_);
  }

 private:
  bool filtered() const { return !accumulate_; }
  bool eligible(const Node* n) const { return !filtered() || needed_.count(n) > 0 || captures_.count(n) > 0; }

  // Counts, for every eligible node, how many eligible nodes feed it. In grad() mode a node is needed when a
  // capture is reachable through its edges (computed bottom-up after a DFS).
  void compute_dependencies(const std::vector<Edge>& roots) {
    std::vector<Node*> order;  // post-order
    std::unordered_set<Node*> seen;
    std::vector<std::pair<Node*, size_t>> stack;
    for (const Edge& r : roots) {
      if (!r.fn || !seen.insert(r.fn.get()).second) continue;
      stack.push_back({r.fn.get(), 0});
      while (!stack.empty()) {
        auto& [n, next] = stack.back();
        if (next < n->next_edges().size()) {
          Node* child = n->next_edges()[next++].fn.get();
          if (child != nullptr && seen.insert(child).second) stack.push_back({child, 0});
        } else {
          order.push_back(n);
          stack.pop_back();
        }
      }
    }
    if (filtered()) {
      for (Node* n : order) {  // children come before parents in post-order
        for (const Edge& e : n->next_edges())
          if (e.fn && (needed_.count(e.fn.get()) || captures_.count(e.fn.get()))) {
            needed_.insert(n);
            break;
          }
      }
    }
    for (Node* n : order) {
      if (!eligible(n) || (filtered() && !needed_.count(n))) continue;  // its edges are never followed
      for (const Edge& e : n->next_edges())
        if (e.fn && eligible(e.fn.get())) ++dependencies_[e.fn.get()];
    }
  }

  void add_input(Node* node, uint32_t input_nr, Tensor grad) {
    TensorList& buf = buffers_[node];
    if (buf.size() < node->num_outputs()) buf.resize(node->num_outputs());
    EMBER_CHECK(input_nr < buf.size(), IndexError, node->name(), ": gradient for output ", input_nr, " of ",
                buf.size());
    if (!grad.defined()) return;
    Tensor& slot = buf[input_nr];
    if (!slot.defined()) {
      slot = std::move(grad);
      return;
    }
    // Note [Input buffer accumulation]: a node whose output is used twice (a residual stream, a shared weight) gets
    // two gradients. The sum goes into the buffered one in place when nothing else can see it — its only reference
    // is this slot and its storage is its own, dense — as PyTorch's InputBuffer does; backward then holds two
    // gradients, not three. Otherwise (a view, a tensor some node also passed elsewhere) the sum is a new tensor.
    const bool sole_owner = slot.use_count() == 1 && slot.storage() && slot.storage().use_count() == 1 &&
                            slot.is_contiguous() && slot.storage_offset() == 0 &&
                            slot.nbytes() == slot.storage()->nbytes() && meta_of(slot) == nullptr;
    if (sole_owner && slot.sizes() == grad.sizes() && slot.dtype() == grad.dtype() && is_floating(slot.dtype()))
      ops::add_(slot, grad);
    else
      slot = ops::add(slot, grad);
  }

  void execute(Node* node, std::priority_queue<Node*, std::vector<Node*>, ReadyOrder>& ready) {
    // What this node allocates (its gradients, temporaries, a checkpoint's recomputation, sums into the next
    // nodes' buffers) belongs to its module's backward (DESIGN.md §6).
    memory::ModuleScope module_scope(node->module());
    memory::PhaseScope phase_scope(memory::Phase::Backward);
    TensorList grads;
    if (auto it = buffers_.find(node); it != buffers_.end()) {
      grads = std::move(it->second);
      buffers_.erase(it);
    }
    grads.resize(node->num_outputs());
    node->run_pre_hooks(grads);
    if (auto it = captures_.find(node); it != captures_.end())
      for (const Capture& c : it->second) results_[c.result_index] = grads[c.input_nr];
    if (filtered() && !needed_.count(node)) return;

    bool any = false;
    for (const Tensor& g : grads) any = any || g.defined();
    TensorList outputs;
    if (any) {
      outputs = node->apply(std::move(grads));
      if (!retain_graph_) node->release_saved();
      if (AnomalyMode::is_enabled()) check_backward_anomaly(*node, outputs);
    }
    grads.clear();
    outputs.resize(node->next_edges().size());
    for (size_t i = 0; i < node->next_edges().size(); ++i) {
      const Edge& e = node->next_edges()[i];
      if (!e.fn || !eligible(e.fn.get())) continue;
      Tensor g;
      if (outputs[i].defined()) g = validate_grad(*node, i, std::move(outputs[i]));
      add_input(e.fn.get(), e.input_nr, std::move(g));
      if (--dependencies_[e.fn.get()] == 0) ready.push(e.fn.get());
    }
  }

  bool retain_graph_, accumulate_;
  std::unordered_map<Node*, int64_t> dependencies_;
  std::unordered_map<Node*, TensorList> buffers_;
  std::unordered_map<const Node*, std::vector<Capture>> captures_;
  std::unordered_set<const Node*> needed_;
  TensorList results_;
};

// The root edges and seed gradients for `outputs`.
void prepare_roots(const char* api, const TensorList& outputs, const TensorList& grad_outputs,
                   std::vector<Edge>& roots, TensorList& seeds) {
  EMBER_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), ValueError, api, ": ", outputs.size(),
              " outputs but ", grad_outputs.size(), " gradients");
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    EMBER_CHECK(out.defined(), ValueError, api, ": output ", i, " is an undefined tensor");
    EMBER_CHECK(requires_grad(out), ValueError, api, ": output ", i, " (", out.description(),
                ") does not require grad and has no grad_fn; did an input call requires_grad_(), and was grad mode on?");
    Tensor g = grad_outputs.empty() ? Tensor() : grad_outputs[i];
    if (!g.defined()) {
      EMBER_CHECK(out.numel() == 1, ValueError, api, ": a gradient can be implied only for one-element outputs; ",
                  "output ", i, " is ", out.description(), ": pass its gradient");
      g = ones(out.sizes(), {out.dtype(), out.device()});
    } else {
      EMBER_CHECK(g.sizes() == out.sizes(), ShapeError, api, ": gradient ", g.description(), " for output ",
                  out.description(), " has another shape");
      EMBER_CHECK(g.device() == out.device(), DeviceError, api, ": gradient ", g.description(), " for output ",
                  out.description(), " is on another device");
      NoGradGuard no_grad;
      g = g.detach();
      if (g.dtype() != out.dtype()) g = g.to(out.dtype());
    }
    roots.push_back(gradient_edge(out));
    seeds.push_back(std::move(g));
  }
}

}  // namespace

void backward(const TensorList& outputs, const TensorList& grad_outputs, bool retain_graph) {
  memory::PhaseScope phase(memory::Phase::Backward);  // the seed gradients too
  std::vector<Edge> roots;
  TensorList seeds;
  prepare_roots("backward", outputs, grad_outputs, roots, seeds);
  GraphTask task(retain_graph, /*accumulate=*/true);
  task.run(roots, std::move(seeds), 0);
}

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                bool retain_graph, bool allow_unused) {
  memory::PhaseScope phase(memory::Phase::Backward);
  std::vector<Edge> roots;
  TensorList seeds;
  prepare_roots("grad", outputs, grad_outputs, roots, seeds);
  GraphTask task(retain_graph, /*accumulate=*/false);
  std::vector<std::shared_ptr<Node>> keep;  // accumulators made here live until the task ends
  for (size_t i = 0; i < inputs.size(); ++i) {
    EMBER_CHECK(inputs[i].defined() && requires_grad(inputs[i]), ValueError, "grad: input ", i, " (",
                inputs[i].description(), ") does not require grad");
    Edge e = gradient_edge(inputs[i]);
    keep.push_back(e.fn);
    task.add_capture(e, i);
  }
  TensorList results = task.run(roots, std::move(seeds), inputs.size());
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].defined()) continue;  // validated against the input's geometry on the edge it came along
    EMBER_CHECK(allow_unused, ValueError, "grad: input ", i, " (", inputs[i].description(),
                ") was not used to compute the outputs; pass allow_unused=true to get an undefined gradient for it");
  }
  return results;
}

}  // namespace ember::autograd
