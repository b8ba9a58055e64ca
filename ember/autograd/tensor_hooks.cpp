// The autograd side of core's Tensor: the AutogradHooks implementation (view and copy recording, in-place checks,
// requires_grad/grad/backward members) installed when the library loads, and the public hook registration.
#include <memory>

#include "ember/autograd/accumulate_grad.h"
#include "ember/autograd/engine.h"
#include "ember/autograd/function_node.h"
#include "ember/autograd/hooks.h"
#include "ember/autograd/view_functions.h"
#include "ember/core/autograd_hooks.h"
#include "ember/core/grad_mode.h"

namespace ember::autograd {

namespace {

// True when t spans all of its storage densely: a write into it replaces every value any other view could see.
bool covers_storage(const Tensor& t) {
  return t.is_contiguous() && t.storage_offset() == 0 && t.nbytes() == t.storage()->nbytes();
}

class Hooks final : public AutogradHooks {
 public:
  void record_view(const Tensor& base, const Tensor& view, const ViewInfo& info) const override {
    if (!should_record({&base})) return;
    record_view_node(base, view, info);
    get_or_create_meta(view).is_view = true;
  }

  void record_copy(const char* op, const Tensor& src, const Tensor& out) const override {
    if (!is_floating(out.dtype())) return;  // an integer or bool copy carries no gradient (as in PyTorch)
    auto node = make_node(op, {&src});
    if (!node) return;
    const Device dev = src.device();
    const DType dt = src.dtype();
    node->formula = [dev, dt](const BackwardContext&, const TensorList& g) -> TensorList {
      return {g[0].to(dev, dt)};
    };
    node->set_outputs({&out});
  }

  void check_inplace(const char* op, const Tensor& self, const Tensor* src) const override {
    if (!GradMode::is_enabled()) return;
    const AutogradMeta* m = meta_of(self);
    if (m != nullptr && m->grad_fn == nullptr && m->requires_grad)
      EMBER_THROW(ValueError, op, ": ", self.description(), " is a leaf that requires grad; an in-place write would "
                  "make its gradient meaningless. Update parameters inside a NoGradGuard scope");
    const bool src_grad = src != nullptr && requires_grad(*src);
    if (m != nullptr && m->is_view && (src_grad || m->grad_fn != nullptr))
      EMBER_THROW(ValueError, op, ": in-place write into a view (", self.description(), ") of a tensor that requires "
                  "grad; ember's autograd does not rebase the history of the viewed tensor. Build the result "
                  "out of place (where, mul by a mask, or arithmetic on the whole tensor)");
    if (src_grad && !covers_storage(self))
      EMBER_THROW(ValueError, op, ": copying ", src->description(), ", which requires grad, into a partial view (",
                  self.description(), " with strides ", shape_str(self.strides()), " at offset ",
                  self.storage_offset(), ") would not carry its gradient to the tensor viewed; build the result "
                  "out of place");
    // Only `self` gets the copy's history: another tensor sharing the storage (the base of a full view, or a view
    // of self) would see the new values without it, and silently give the source no gradient.
    // Likewise a write into a tensor with history whose storage is shared: its views would keep the old history.
    if ((src_grad || (m != nullptr && m->grad_fn != nullptr)) && self.storage().use_count() > 1)
      EMBER_THROW(ValueError, op, ": in-place write into ", self.description(), ", whose storage other tensors "
                  "(views, the tensor it views, or a backward node) share while autograd tracks it; they would see "
                  "the new values without their gradient history. Write into a fresh tensor or build the result out "
                  "of place");
  }

  void record_inplace(const char* op, const Tensor& self, const Tensor* src) const override {
    if (!GradMode::is_enabled()) return;
    if (src != nullptr && requires_grad(*src) && is_floating(self.dtype())) {
      auto node = make_node(op, {src});
      const Device dev = src->device();
      node->formula = [dev](const BackwardContext&, const TensorList& g) -> TensorList { return {g[0].to(dev)}; };
      node->set_outputs({&self});
      return;
    }
    // Overwritten by values that need no gradient: the tensor is now a constant.
    if (AutogradMeta* m = meta_of(self); m != nullptr && m->grad_fn != nullptr) {
      m->grad_fn = nullptr;
      m->requires_grad = false;
      if (m->retains_grad_hook) m->retains_grad_hook->removed = true;  // no gradient reaches a constant
      m->retains_grad_hook = nullptr;
      m->retains_grad = false;
    }
  }

  bool requires_grad(const Tensor& t) const override { return autograd::requires_grad(t); }

  void set_requires_grad(const Tensor& t, bool value) const override {
    AutogradMeta* m = meta_of(t);
    EMBER_CHECK(m == nullptr || m->grad_fn == nullptr, ValueError, "requires_grad_: ", t.description(),
                " is not a leaf (it has grad_fn ", m ? m->grad_fn->name() : "", "); only leaves take the flag — use "
                "detach().requires_grad_() for a new leaf");
    if (!value) {
      if (m != nullptr) m->requires_grad = false;
      return;
    }
    EMBER_CHECK(is_floating(t.dtype()), DTypeError, "requires_grad_: only floating tensors can require grad, got ",
                t.description());
    EMBER_CHECK(!t.is_inference(), ValueError, "requires_grad_: ", t.description(), " is an inference tensor (made "
                "in InferenceMode); clone() it outside inference mode first");
    get_or_create_meta(t).requires_grad = true;
  }

  Tensor grad(const Tensor& t) const override {
    const AutogradMeta* m = meta_of(t);
    return m != nullptr ? m->grad : Tensor();
  }

  void set_grad(const Tensor& t, const Tensor& g) const override {
    if (g.defined()) {
      EMBER_CHECK(g.sizes() == t.sizes(), ShapeError, "set_grad: gradient ", g.description(), " does not match ",
                  t.description());
      EMBER_CHECK(g.dtype() == t.dtype(), DTypeError, "set_grad: gradient ", g.description(), " does not match ",
                  t.description());
      EMBER_CHECK(g.device() == t.device(), DeviceError, "set_grad: gradient ", g.description(),
                  " does not match ", t.description());
    }
    if (!g.defined() && meta_of(t) == nullptr) return;
    get_or_create_meta(t).grad = g.defined() ? g.detach() : Tensor();
  }

  bool is_leaf(const Tensor& t) const override {
    const AutogradMeta* m = meta_of(t);
    return m == nullptr || m->grad_fn == nullptr;
  }

  void retain_grad(const Tensor& t) const override {
    AutogradMeta* m = meta_of(t);
    EMBER_CHECK(m != nullptr && (m->requires_grad || m->grad_fn), ValueError, "retain_grad: ", t.description(),
                " does not require grad");
    if (m->grad_fn == nullptr || m->retains_grad) return;  // leaves keep .grad anyway
    m->retains_grad = true;
    std::weak_ptr<AutogradMetaBase> weak = t.unsafe_impl()->autograd_meta;
    auto entry = std::make_shared<HookEntry>();
    entry->fn = [weak](const Tensor& g) -> Tensor {
      if (auto base = weak.lock()) accumulate_into(static_cast<AutogradMeta*>(base.get())->grad, g, /*in_place=*/false);
      return Tensor();
    };
    m->grad_fn->add_retains_grad_hook(m->output_nr, entry);
    m->retains_grad_hook = std::move(entry);
  }

  std::string grad_fn_name(const Tensor& t) const override {
    const AutogradMeta* m = meta_of(t);
    return m != nullptr && m->grad_fn ? m->grad_fn->name() : std::string();
  }

  void backward(const Tensor& t, const Tensor& gradient, bool retain_graph) const override {
    autograd::backward({t}, {gradient}, retain_graph);
  }
};

const Hooks g_hooks;
[[maybe_unused]] const bool g_installed = (set_autograd_hooks(&g_hooks), true);

}  // namespace

HookHandle register_hook(const Tensor& t, TensorHook hook) {
  AutogradMeta* m = meta_of(t);
  EMBER_CHECK(m != nullptr && (m->requires_grad || m->grad_fn), ValueError, "register_hook: ", t.description(),
              " does not require grad, so no gradient will reach the hook");
  auto entry = std::make_shared<HookEntry>();
  entry->fn = std::move(hook);
  if (m->grad_fn) {
    m->grad_fn->add_pre_hook(m->output_nr, entry);
  } else {
    std::erase_if(m->leaf_hooks, [](const auto& h) { return h->removed; });
    m->leaf_hooks.push_back(entry);
  }
  std::weak_ptr<HookEntry> weak = entry;
  return HookHandle([weak] {
    if (auto e = weak.lock()) e->removed = true;
  });
}

HookHandle register_post_accumulate_grad_hook(const Tensor& t, PostAccumulateHook hook) {
  AutogradMeta* m = meta_of(t);
  EMBER_CHECK(m != nullptr && m->grad_fn == nullptr && m->requires_grad, ValueError,
              "register_post_accumulate_grad_hook: ", t.description(), " is not a leaf that requires grad");
  auto entry = std::make_shared<PostHookEntry>();
  entry->fn = std::move(hook);
  std::erase_if(m->post_accumulate_hooks, [](const auto& h) { return h->removed; });
  m->post_accumulate_hooks.push_back(entry);
  std::weak_ptr<PostHookEntry> weak = entry;
  return HookHandle([weak] {
    if (auto e = weak.lock()) e->removed = true;
  });
}

}  // namespace ember::autograd
