// Unstructured magnitude pruning (prune.h): mask selection on the host, the bit-packed "NAME_mask" buffers, the
// gradient hooks that keep pruned elements at zero, and remove(). Invariant: every live gradient hook belongs to
// exactly one registry entry (keyed by the parameter's TensorImpl) whose state holds the module's mask buffer handle;
// remove() deactivates the hook through that entry, and a module destroyed without remove() leaves a state that is
// owned only by its parameter's hook (so nothing dangles: the entry's weak pointer expires with the parameter).
#include "ember/nn/prune.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <unordered_map>

#include "ember/autograd/hooks.h"
#include "ember/core/grad_mode.h"
#include "ember/kernels/ops_sparse.h"

namespace ember::nn {

namespace {

std::string mask_name(const std::string& name) { return name + "_mask"; }

Tensor find_own(const NamedTensors& list, const std::string& name) {
  for (const auto& [n, t] : list)
    if (n == name) return t;
  return Tensor();
}

// The module's own parameter `name`, floating; ValueError naming the module type and the name otherwise.
Tensor own_param(const Module& module, const std::string& name, const char* op) {
  const Tensor p = find_own(module.named_parameters(/*recurse=*/false), name);
  EMBER_CHECK(p.defined(), ValueError, op, ": ", module.type_name(), " has no parameter '", name,
              "' of its own (give the child module and the local name, e.g. (fc1, \"weight\"))");
  EMBER_CHECK(is_floating(p.dtype()), ValueError, op, ": ", module.type_name(), ".", name, " is ", p.description(),
              "; only floating parameters can be pruned");
  return p;
}

// The module's mask buffer of `name` (undefined when `name` is not pruned).
Tensor own_mask(const Module& module, const std::string& name) {
  const Tensor m = find_own(module.named_buffers(/*recurse=*/false), mask_name(name));
  return m.defined() && m.dtype() == DType::u8 ? m : Tensor();
}

// ---- the gradient hooks -------------------------------------------------------------------------------------------

// Note [Pruning hook registry]
// The gradient hook of a pruned parameter captures a shared MaskState holding the module's mask buffer handle (so a
// later to(device) or load_state_dict, which change the buffer's contents in place, and a further pruning, which
// copies the AND into it, are seen by the hook). The registry maps the parameter's TensorImpl to a weak pointer to
// that state; the hook (stored in the parameter's autograd meta) is its only owner. remove() finds the state there,
// checks that it holds this module's mask, and switches the hook off. Entries whose state died with its parameter
// are swept at the next registration; a TensorImpl address reused by a later tensor finds an expired entry.
struct MaskState {
  Tensor mask;
  std::atomic<bool> active{true};
  autograd::HookHandle handle;
};

std::mutex g_registry_mutex;
std::unordered_map<const TensorImpl*, std::weak_ptr<MaskState>> g_registry;

std::shared_ptr<MaskState> find_state(const Tensor& param) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  const auto it = g_registry.find(param.unsafe_impl());
  return it == g_registry.end() ? nullptr : it->second.lock();
}

// Installs the gradient hook of a pruned parameter unless a live one already holds this mask.
void ensure_hook(const Tensor& param, const Tensor& mask) {
  if (!param.requires_grad()) return;  // a frozen parameter gets no gradient to mask
  if (auto s = find_state(param); s && s->active.load() && s->mask.is_same(mask)) return;
  auto state = std::make_shared<MaskState>();
  state->mask = mask;
  // The hook owns the state; a raw pointer back would dangle, a shared one in the state would be a cycle.
  state->handle = autograd::register_hook(param, [state](const Tensor& grad) -> Tensor {
    if (!state->active.load(std::memory_order_acquire)) return Tensor();
    NoGradGuard no_grad;
    Tensor g = grad.detach().clone();
    ops::masked_zero_(g, state->mask);
    return g;
  });
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  std::erase_if(g_registry, [](const auto& e) { return e.second.expired(); });
  if (auto it = g_registry.find(param.unsafe_impl()); it != g_registry.end())
    if (auto old = it->second.lock()) {  // a stale hook of an earlier mask: switch it off
      old->active.store(false);
      old->handle.remove();
    }
  g_registry[param.unsafe_impl()] = state;
}

void drop_hook(const Tensor& param, const Tensor& mask) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  const auto it = g_registry.find(param.unsafe_impl());
  if (it == g_registry.end()) return;
  if (auto s = it->second.lock(); s && s->mask.is_same(mask)) {
    s->active.store(false, std::memory_order_release);
    s->handle.remove();
  }
  g_registry.erase(it);
}

// ---- mask selection -----------------------------------------------------------------------------------------------

// One parameter being pruned: its magnitudes and current keep flags on the host.
struct Target {
  Module* module = nullptr;
  std::string name;
  Tensor param, mask;           // mask: the existing buffer, or undefined
  std::vector<double> magnitude;
  std::vector<uint8_t> keep;    // 1 = kept
};

Target load_target(Module& module, const std::string& name, const char* op) {
  Target t;
  t.module = &module;
  t.name = name;
  t.param = own_param(module, name, op);
  t.mask = own_mask(module, name);
  const int64_t n = t.param.numel();
  t.magnitude = t.param.to_vector<double>();
  for (double& v : t.magnitude) v = std::fabs(v);
  t.keep.assign(static_cast<size_t>(n), 1);
  if (t.mask.defined()) {
    const Tensor kept = ops::unpack_mask(t.mask, {n}).cpu();
    const bool* k = static_cast<const bool*>(kept.raw_data());
    for (int64_t i = 0; i < n; ++i) t.keep[static_cast<size_t>(i)] = k[i] ? 1 : 0;
  }
  return t;
}

// Clears the keep flag of the `amount` smallest kept elements over all targets (Note [Pruning order]).
void select(std::vector<Target>& targets, const PruneAmount& amount) {
  struct Candidate {
    double magnitude;
    bool nan;
    int32_t target;
    int64_t index;
  };
  std::vector<Candidate> candidates;
  for (size_t t = 0; t < targets.size(); ++t)
    for (size_t i = 0; i < targets[t].keep.size(); ++i)
      if (targets[t].keep[i]) {
        const double m = targets[t].magnitude[i];
        candidates.push_back({m, std::isnan(m), static_cast<int32_t>(t), static_cast<int64_t>(i)});
      }
  const int64_t k = amount.resolve(static_cast<int64_t>(candidates.size()));
  if (k == 0) return;
  auto before = [](const Candidate& a, const Candidate& b) {
    if (a.nan != b.nan) return b.nan;  // numbers before NaN
    if (!a.nan && a.magnitude != b.magnitude) return a.magnitude < b.magnitude;
    if (a.target != b.target) return a.target < b.target;
    return a.index < b.index;
  };
  std::nth_element(candidates.begin(), candidates.begin() + (k - 1), candidates.end(), before);
  for (int64_t j = 0; j < k; ++j) {
    const Candidate& c = candidates[static_cast<size_t>(j)];
    targets[static_cast<size_t>(c.target)].keep[static_cast<size_t>(c.index)] = 0;
  }
}

// Writes the new mask (registering the buffer and the hook on first pruning) and zeroes the pruned elements.
void apply(Target& t) {
  const int64_t n = t.param.numel();
  Tensor keep = empty({n}, {DType::b8, Device::cpu()});
  bool* k = static_cast<bool*>(keep.raw_data());
  for (int64_t i = 0; i < n; ++i) k[i] = t.keep[static_cast<size_t>(i)] != 0;
  const Tensor packed = ops::pack_mask(keep).to(t.param.device());
  NoGradGuard no_grad;
  if (t.mask.defined()) {
    t.mask.copy_(packed);  // in place: the hook holds this handle
  } else {
    t.mask = t.module->register_buffer(mask_name(t.name), packed, /*persistent=*/true);
  }
  ensure_hook(t.param, t.mask);
  ops::masked_zero_(t.param, t.mask);
}

// Calls fn(module, param, mask) for every pruned parameter of every module in the tree.
template <class Fn>
void for_each_pruned(Module& root, Fn&& fn) {
  for (const auto& [path, module] : root.named_modules())
    for (const auto& [name, param] : module->named_parameters(/*recurse=*/false)) {
      const Tensor mask = own_mask(*module, name);
      if (mask.defined() && mask.numel() == (param.numel() + 7) / 8) fn(*module, param, mask);
    }
}

}  // namespace

// ---- public API -----------------------------------------------------------------------------------------------------

void l1_unstructured(Module& module, const std::string& name, PruneAmount amount) {
  std::vector<Target> targets;
  targets.push_back(load_target(module, name, "l1_unstructured"));
  select(targets, amount);
  apply(targets[0]);
}

void global_unstructured(const std::vector<std::pair<std::shared_ptr<Module>, std::string>>& params,
                         PruneAmount amount) {
  const char* op = "global_unstructured";
  EMBER_CHECK(!params.empty(), ValueError, op, ": no parameters to prune");
  std::vector<Target> targets;
  for (const auto& [module, name] : params) {
    EMBER_CHECK(module != nullptr, ValueError, op, ": a null module in the list (with name '", name, "')");
    targets.push_back(load_target(*module, name, op));
    for (size_t j = 0; j + 1 < targets.size(); ++j)
      EMBER_CHECK(!targets[j].param.is_same(targets.back().param), ValueError, op, ": ", module->type_name(), ".",
                  name, " is listed twice");
  }
  select(targets, amount);
  for (Target& t : targets) apply(t);
}

void remove(Module& module, const std::string& name) {
  const Tensor param = own_param(module, name, "prune::remove");
  const Tensor mask = own_mask(module, name);
  EMBER_CHECK(mask.defined(), ValueError, "prune::remove: ", module.type_name(), ".", name,
              " is not pruned (no '", mask_name(name), "' buffer)");
  drop_hook(param, mask);
  module.remove_buffer(mask_name(name));
}

bool is_pruned(const Module& module, const std::string& name) {
  return find_own(module.named_parameters(false), name).defined() && own_mask(module, name).defined();
}

Tensor prune_mask(const Module& module, const std::string& name) {
  const Tensor param = own_param(module, name, "prune_mask");
  const Tensor mask = own_mask(module, name);
  EMBER_CHECK(mask.defined(), ValueError, "prune_mask: ", module.type_name(), ".", name, " is not pruned");
  return ops::unpack_mask(mask, param.sizes());
}

double sparsity(const Tensor& t) {
  EMBER_CHECK(t.defined(), ValueError, "sparsity: undefined tensor");
  const int64_t n = t.numel();
  if (n == 0) return 0.0;
  const std::vector<double> v = t.to_vector<double>();
  int64_t zeros = 0;
  for (double x : v) zeros += x == 0.0;
  return static_cast<double>(zeros) / static_cast<double>(n);
}

void reapply_masks(Module& root) {
  NoGradGuard no_grad;
  for_each_pruned(root, [](Module&, const Tensor& param, const Tensor& mask) { ops::masked_zero_(param, mask); });
}

void mask_param_state(Module& root, const std::function<std::vector<Tensor>(const Tensor& param)>& tensors_of) {
  NoGradGuard no_grad;
  for_each_pruned(root, [&](Module&, const Tensor& param, const Tensor& mask) {
    for (const Tensor& s : tensors_of(param)) {
      if (!s.defined() || s.sizes() != param.sizes() || !is_floating(s.dtype())) continue;
      if (s.is_contiguous()) {
        ops::masked_zero_(s, mask.to(s.device()));
      } else {
        Tensor c = s.contiguous();
        ops::masked_zero_(c, mask.to(s.device()));
        Tensor(s).copy_(c);
      }
    }
  });
}

}  // namespace ember::nn
