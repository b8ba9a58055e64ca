// Module: registration, traversal by dotted name, modes, in-place conversion (set_data), state_dict round trips and
// describe(). Invariant: the handles in params_/buffers_ are the ones layers keep as members; nothing here replaces
// a handle — conversions and loads change the TensorImpl behind it (set_data) or copy into it (copy_).
#include "ember/nn/module.h"

#include <algorithm>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "ember/base/error.h"
#include "ember/core/grad_mode.h"

namespace ember::nn {

namespace {

// Bumped by every registration and by a parent's destruction: cached memory paths older than it are recomputed.
std::atomic<uint64_t> g_tree_generation{1};

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// Drops every entry whose TensorImpl appeared earlier (weights shared by two modules are listed once).
NamedTensors unique_by_impl(NamedTensors all) {
  std::unordered_set<const TensorImpl*> seen;
  NamedTensors out;
  out.reserve(all.size());
  for (auto& [name, t] : all) {
    if (seen.insert(t.unsafe_impl()).second) out.emplace_back(std::move(name), std::move(t));
  }
  return out;
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  const int64_t len = static_cast<int64_t>(digits.size());
  for (int64_t i = 0; i < len; ++i) {
    if (i > 0 && (len - i) % 3 == 0 && digits[i - 1] != '-') out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

}  // namespace

Tensor Module::forward(const Tensor& x) {
  EMBER_THROW(ValueError, type_name_, " has no single-input forward");
}

// ---- registration ----------------------------------------------------------------------------------------------

void Module::check_new_name(const std::string& name) const {
  EMBER_CHECK(!name.empty(), ValueError, type_name_, ": a parameter, buffer or module name must not be empty");
  EMBER_CHECK(name.find('.') == std::string::npos, ValueError, type_name_, ": name '", name,
              "' must not contain '.' (dots separate the levels of dotted names)");
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& e) { return e.first == name; });
  };
  EMBER_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), ValueError, type_name_, ": name '", name,
              "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name);
  if (t.defined()) {
    if (!t.is_leaf()) t = t.detach();  // a parameter is a leaf: keep the values, drop the history
    t.requires_grad_(requires_grad);
  }
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t, bool persistent) {
  check_new_name(name);
  buffers_.emplace_back(name, t);
  if (!persistent) non_persistent_.push_back(name);
  // A buffer registered after construction (a packed weight, a pruning mask) is tagged at the next forward.
  g_tree_generation.fetch_add(1, std::memory_order_acq_rel);
  return t;
}

namespace {

Tensor take_named(NamedTensors& list, const std::string& name, const std::string& type_name, const char* what) {
  const auto it = std::find_if(list.begin(), list.end(), [&](const auto& e) { return e.first == name; });
  if (it == list.end()) {
    std::string known;
    for (const auto& [n, t] : list) known += (known.empty() ? "" : ", ") + n;
    EMBER_THROW(ValueError, type_name, ": no ", what, " named '", name, "' (it has: ", known.empty() ? "none" : known,
                ")");
  }
  Tensor t = it->second;
  list.erase(it);
  g_tree_generation.fetch_add(1, std::memory_order_acq_rel);  // the module's state changed: retag at the next forward
  return t;
}

}  // namespace

Tensor Module::remove_parameter(const std::string& name) { return take_named(params_, name, type_name_, "parameter"); }

Tensor Module::remove_buffer(const std::string& name) {
  Tensor t = take_named(buffers_, name, type_name_, "buffer");
  non_persistent_.erase(std::remove(non_persistent_.begin(), non_persistent_.end(), name), non_persistent_.end());
  return t;
}

void Module::register_module_impl(const std::string& name, std::shared_ptr<Module> module) {
  EMBER_CHECK(module != nullptr, ValueError, type_name_, ": register_module('", name, "') got a null module");
  check_new_name(name);
  if (module->parent_ == nullptr && module.get() != this) {  // the first parent names it (Note [Module memory paths])
    module->parent_ = this;
    module->name_in_parent_ = name;
  }
  children_.emplace_back(name, std::move(module));
  g_tree_generation.fetch_add(1, std::memory_order_acq_rel);
}

Module::~Module() {
  bool changed = false;
  for (auto& [name, child] : children_) {
    if (child && child->parent_ == this) {
      child->parent_ = nullptr;
      changed = true;
    }
  }
  if (changed) g_tree_generation.fetch_add(1, std::memory_order_acq_rel);
}

memory::ModuleHandle Module::memory_handle() const {
  const uint64_t gen = g_tree_generation.load(std::memory_order_acquire);
  if (memory_generation_.load(std::memory_order_acquire) == gen) return memory_handle_.load(std::memory_order_acquire);
  std::vector<const Module*> chain;  // this module up to its root
  for (const Module* m = this; m != nullptr && chain.size() < 4096; m = m->parent_) chain.push_back(m);
  std::string path = chain.back()->type_name_;
  for (size_t i = chain.size() - 1; i-- > 0;) path += "." + chain[i]->name_in_parent_;
  const memory::ModuleHandle handle = memory::intern_module(path);
  tag_own_state(handle);
  memory_handle_.store(handle, std::memory_order_release);
  memory_generation_.store(gen, std::memory_order_release);
  return handle;
}

// Note [Parameter ownership]: parameters and buffers are allocated in constructors, before the module knows its
// path (it learns it when registered in a parent, after its members exist), so they start untagged. Whenever the
// path is (re)computed — at the first forward, and after the tree changed or to() replaced the tensors — the module
// hands its own parameters' and buffers' bytes to "PATH/parameters" (memory::Allocator::retag). A tensor shared by
// two modules (tied weights) belongs to the last one that tagged it.
void Module::tag_own_state(memory::ModuleHandle handle) const {
  const memory::TagId tag = memory::module_tag(handle, memory::Phase::Parameters);
  for (const NamedTensors* list : {&params_, &buffers_}) {
    for (const auto& [name, t] : *list) {
      if (!t.defined()) continue;
      const StorageImpl& s = *t.storage();
      // allocation(), not data(): meta parameters of a dry run have an address in the scope's allocator too.
      if (s.allocator() != nullptr && s.allocation() != nullptr) s.allocator()->retag(s.allocation(), tag);
    }
  }
}

// ---- traversal -------------------------------------------------------------------------------------------------

void Module::collect(const std::string& prefix, bool params, bool recurse, NamedTensors& out) const {
  for (const auto& [name, t] : params ? params_ : buffers_) {
    if (t.defined()) out.emplace_back(join_name(prefix, name), t);
  }
  if (!recurse) return;
  for (const auto& [name, child] : children_) child->collect(join_name(prefix, name), params, true, out);
}

void Module::collect_state(const std::string& prefix, NamedTensors& out) const {
  for (const auto& [name, t] : params_) {
    if (t.defined()) out.emplace_back(join_name(prefix, name), t);
  }
  for (const auto& [name, t] : buffers_) {
    const bool persistent = std::find(non_persistent_.begin(), non_persistent_.end(), name) == non_persistent_.end();
    if (t.defined() && persistent) out.emplace_back(join_name(prefix, name), t);
  }
  for (const auto& [name, child] : children_) child->collect_state(join_name(prefix, name), out);
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  collect("", /*params=*/true, recurse, out);
  return unique_by_impl(std::move(out));
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect("", /*params=*/false, recurse, out);
  return unique_by_impl(std::move(out));
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const { return children_; }

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, child] : children_) out.push_back(child);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules(const std::string& prefix) {
  // A module that is not owned by a shared_ptr (e.g. on the stack) is listed through a non-owning pointer.
  std::shared_ptr<Module> self = weak_from_this().lock();
  if (!self) self = std::shared_ptr<Module>(std::shared_ptr<Module>(), this);
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out{{prefix, self}};
  for (const auto& [name, child] : children_) {
    auto sub = child->named_modules(join_name(prefix, name));
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

int64_t Module::num_parameters(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) {
    if (!trainable_only || t.requires_grad()) n += t.numel();
  }
  return n;
}

int64_t Module::parameter_bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t.nbytes();
  return n;
}

// ---- modes and conversion ----------------------------------------------------------------------------------------

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void set_data(const Tensor& dst, const Tensor& src) {
  EMBER_CHECK(dst.defined() && src.defined(), ValueError, "set_data: both tensors must be defined");
  EMBER_CHECK(!dst.requires_grad() || is_floating(src.dtype()), DTypeError, "set_data: ", dst.description(),
              " requires grad, so its new data must be floating, got ", src.description());
  TensorImpl* d = dst.unsafe_impl();
  const TensorImpl* s = src.unsafe_impl();
  if (d != s) {
    d->storage = s->storage;
    d->sizes = s->sizes;
    d->strides = s->strides;
    d->offset = s->offset;
    d->dtype = s->dtype;
  }
  dst.set_grad(Tensor());
}

namespace {
// Converts every unique parameter and buffer of m with `convert` (returns the tensor itself when nothing changes).
template <class Fn>
void convert_all(const Module& m, Fn convert) {
  NoGradGuard no_grad;
  NamedTensors all = m.named_parameters();
  NamedTensors buffers = m.named_buffers();
  all.insert(all.end(), buffers.begin(), buffers.end());
  for (const auto& [name, t] : unique_by_impl(std::move(all))) {
    Tensor converted = convert(t);
    if (!converted.is_same(t)) set_data(t, converted);
  }
}
}  // namespace

void Module::to(Device device) {
  convert_all(*this, [&](const Tensor& t) { return t.to(device); });
  g_tree_generation.fetch_add(1, std::memory_order_acq_rel);  // new tensors: tag them at the next forward
}

void Module::to(DType dtype) {
  EMBER_CHECK(is_floating(dtype), DTypeError, type_name_, ".to: expects a floating dtype, got ", dtype_name(dtype));
  convert_all(*this, [&](const Tensor& t) { return is_floating(t.dtype()) ? t.to(dtype) : t; });
  g_tree_generation.fetch_add(1, std::memory_order_acq_rel);
}

void Module::to(Device device, DType dtype) {
  EMBER_CHECK(is_floating(dtype), DTypeError, type_name_, ".to: expects a floating dtype, got ", dtype_name(dtype));
  convert_all(*this, [&](const Tensor& t) { return t.to(device, is_floating(t.dtype()) ? dtype : t.dtype()); });
  g_tree_generation.fetch_add(1, std::memory_order_acq_rel);
}

void Module::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (const auto& [name, p] : named_parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      g.zero_();
    }
  }
}

// ---- state -------------------------------------------------------------------------------------------------------

NamedTensors Module::state_dict() const {
  NamedTensors live;
  collect_state("", live);
  for (auto& [name, t] : live) t = t.detach();
  return live;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  NamedTensors own;
  collect_state("", own);
  std::unordered_map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state) {
    EMBER_CHECK(given.emplace(name, &t).second, ValueError, "load_state_dict: key '", name,
                "' appears twice in the state dict");
  }

  // Check everything before copying anything: a failed load leaves the module unchanged.
  std::vector<std::string> missing;
  std::vector<std::pair<Tensor, const Tensor*>> copies;
  std::unordered_set<std::string> used;
  for (const auto& [name, t] : own) {
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
      continue;
    }
    const Tensor& src = *it->second;
    EMBER_CHECK(src.defined(), ValueError, "load_state_dict: key '", name, "' holds an undefined tensor");
    EMBER_CHECK(src.sizes() == t.sizes(), ShapeError, "load_state_dict: size mismatch for '", name,
                "': the checkpoint has shape ", shape_str(src.sizes()), ", the module has shape ",
                shape_str(t.sizes()));
    EMBER_CHECK(!src.device().is_meta() || t.device().is_meta(), DeviceError, "load_state_dict: key '", name,
                "' holds a meta tensor (shape only, no data) and the module's is on ", t.device().str());
    copies.emplace_back(t, &src);
    used.insert(name);
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : state) {
    if (!used.count(name)) unexpected.push_back(name);
  }
  if (strict && (!missing.empty() || !unexpected.empty())) {
    std::ostringstream os;
    os << "load_state_dict: error(s) loading the state dict into " << type_name_ << ":";
    auto list = [&](const char* what, const std::vector<std::string>& keys) {
      if (keys.empty()) return;
      os << " " << what << " key(s):";
      for (size_t i = 0; i < keys.size(); ++i) os << (i ? ", " : " ") << "'" << keys[i] << "'";
      os << ".";
    };
    list("missing", missing);
    list("unexpected", unexpected);
    throw ValueError(os.str());
  }

  NoGradGuard no_grad;
  for (auto& [dst, src] : copies) dst.copy_(*src);
}

// ---- describe ----------------------------------------------------------------------------------------------------

void Module::describe_into(const std::string& name, int depth, std::string& out) const {
  std::string line(2 * static_cast<size_t>(depth), ' ');
  if (depth > 0) line += "(" + name + "): ";
  line += type_name_ + "(" + extra_repr() + ")";
  const int64_t n = num_parameters();
  if (n > 0) line += "  # " + with_commas(n) + (n == 1 ? " parameter" : " parameters");
  out += line + "\n";
  for (const auto& [child_name, child] : children_) child->describe_into(child_name, depth + 1, out);
}

std::string Module::describe() const {
  std::string out;
  describe_into("", 0, out);
  return out;
}

}  // namespace ember::nn
