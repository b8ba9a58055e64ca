// Optimizer base: group bookkeeping, zero_grad, and the state_dict format of Note [Optimizer state_dict].
// Invariant: load_state_dict changes nothing unless the whole list validates.
#include "ember/optim/optimizer.h"

#include <algorithm>
#include <map>
#include <set>

#include "ember/core/grad_mode.h"
#include "ember/memory/tags.h"

namespace ember::optim {

// ---- GroupOptions, ParamState -------------------------------------------------------------------------------------

GroupOptions::GroupOptions(std::initializer_list<std::pair<std::string, double>> entries) {
  for (const auto& [name, value] : entries) set(name, value);
}

bool GroupOptions::has(const std::string& name) const {
  return std::any_of(entries_.begin(), entries_.end(), [&](const auto& e) { return e.first == name; });
}

double GroupOptions::get(const std::string& name) const {
  for (const auto& [n, v] : entries_)
    if (n == name) return v;
  EMBER_THROW(ValueError, "optimizer: the parameter group has no option '", name, "'");
}

GroupOptions& GroupOptions::set(const std::string& name, double value) {
  for (auto& [n, v] : entries_)
    if (n == name) {
      v = value;
      return *this;
    }
  entries_.emplace_back(name, value);
  return *this;
}

bool ParamState::has(const std::string& key) const {
  return std::any_of(entries_.begin(), entries_.end(), [&](const auto& e) { return e.first == key; });
}

const Tensor& ParamState::get(const std::string& key) const {
  for (const auto& [k, t] : entries_)
    if (k == key) return t;
  EMBER_THROW(ValueError, "optimizer: the parameter state has no '", key, "'");
}

void ParamState::set(const std::string& key, Tensor value) {
  for (auto& [k, t] : entries_)
    if (k == key) {
      t = std::move(value);
      return;
    }
  entries_.emplace_back(key, std::move(value));
}

// ---- groups -------------------------------------------------------------------------------------------------------

void Optimizer::init_groups(std::vector<ParamGroup> groups) {
  int64_t n = 0;
  for (const ParamGroup& g : groups) n += static_cast<int64_t>(g.params.size());
  EMBER_CHECK(n > 0, ValueError, "optimizer got an empty parameter list");
  for (ParamGroup& g : groups) add_param_group(std::move(g));
}

void Optimizer::add_param_group(ParamGroup group) {
  EMBER_CHECK(!group.params.empty(), ValueError, "optimizer: a parameter group has no parameters");
  std::set<const TensorImpl*> seen;
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) seen.insert(p.unsafe_impl());
  for (size_t k = 0; k < group.params.size(); ++k) {
    const Tensor& p = group.params[k];
    EMBER_CHECK(p.defined(), ValueError, "optimizer: parameter ", k, " of the group is an undefined tensor");
    EMBER_CHECK(is_floating(p.dtype()), ValueError, "optimizer: can only optimize floating tensors, got ",
                p.description());
    EMBER_CHECK(p.requires_grad(), ValueError, "optimizer: parameter ", k, " (", p.description(),
                ") does not require grad");
    EMBER_CHECK(p.is_leaf(), ValueError, "optimizer: can't optimize a non-leaf tensor (", p.description(), ")");
    EMBER_CHECK(seen.insert(p.unsafe_impl()).second, ValueError, "optimizer: parameter ", k, " (", p.description(),
                ") appears more than once in the parameter groups");
  }
  GroupOptions merged = defaults_;
  for (const auto& [name, value] : group.options.entries()) {
    EMBER_CHECK(defaults_.has(name), ValueError, "optimizer: unknown option '", name, "' in a parameter group");
    merged.set(name, value);
  }
  validate_options(merged);
  group.options = std::move(merged);
  groups_.push_back(std::move(group));
}

std::vector<Tensor> Optimizer::parameters() const {
  std::vector<Tensor> out;
  for (const ParamGroup& g : groups_) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

int64_t Optimizer::num_parameters() const {
  int64_t n = 0;
  for (const ParamGroup& g : groups_) n += static_cast<int64_t>(g.params.size());
  return n;
}

void Optimizer::zero_grad(bool set_to_none) {
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);
  NoGradGuard no_grad;
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) {
      if (set_to_none) {
        if (p.grad().defined()) p.set_grad(Tensor());
        continue;
      }
      Tensor grad = p.grad();
      if (grad.defined()) grad.zero_();
    }
}

const ParamState& Optimizer::state(const Tensor& param) const {
  static const ParamState kEmpty;
  auto it = state_.find(param.unsafe_impl());
  return it == state_.end() ? kEmpty : it->second;
}

ParamState& Optimizer::mutable_state(const Tensor& param) { return state_[param.unsafe_impl()]; }

// ---- state_dict ---------------------------------------------------------------------------------------------------

StateDict Optimizer::state_dict() const {
  StateDict out;
  int64_t i = 0;
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) {
      auto it = state_.find(p.unsafe_impl());
      if (it != state_.end())
        for (const auto& [key, t] : it->second.entries())
          out.emplace_back("state." + std::to_string(i) + "." + key, t);
      ++i;
    }
  i = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string prefix = "param_groups." + std::to_string(g) + ".";
    std::vector<int64_t> indices;
    for (size_t k = 0; k < groups_[g].params.size(); ++k) indices.push_back(i++);
    const int64_t n = static_cast<int64_t>(indices.size());
    out.emplace_back(prefix + "params", from_vector<int64_t>(indices, {n}));
    for (const auto& [name, value] : groups_[g].options.entries())
      out.emplace_back(prefix + name, scalar_tensor(value, TensorOptions(DType::f64, Device::cpu())));
  }
  return out;
}

namespace {

// "<digits>.<rest>" -> (index, rest); false when `s` does not have that form.
bool split_index(const std::string& s, int64_t& index, std::string& rest) {
  const size_t dot = s.find('.');
  if (dot == std::string::npos || dot == 0 || dot > 18 || dot + 1 >= s.size()) return false;
  index = 0;
  for (size_t k = 0; k < dot; ++k) {
    if (s[k] < '0' || s[k] > '9') return false;
    index = index * 10 + (s[k] - '0');
  }
  rest = s.substr(dot + 1);
  return true;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

}  // namespace

void Optimizer::load_state_dict(const StateDict& dict) {
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);
  const char* op = "load_state_dict";
  const std::vector<Tensor> flat = parameters();
  const int64_t n_params = static_cast<int64_t>(flat.size()), n_groups = static_cast<int64_t>(groups_.size());
  const std::vector<std::string> keys = state_keys();
  std::vector<GroupOptions> loaded_options(groups_.size());
  std::vector<bool> has_params(groups_.size(), false);
  std::map<int64_t, ParamState> loaded_state;
  std::set<std::string> names;
  NoGradGuard no_grad;

  for (const auto& [name, t] : dict) {
    EMBER_CHECK(names.insert(name).second, ValueError, op, ": the name '", name, "' appears twice");
    EMBER_CHECK(t.defined(), ValueError, op, ": '", name, "' is an undefined tensor");
    int64_t index = 0;
    std::string rest;
    if (starts_with(name, "param_groups.") && split_index(name.substr(13), index, rest)) {
      EMBER_CHECK(index < n_groups, ValueError, op, ": '", name, "' names parameter group ", index,
                  " but the optimizer has ", n_groups, " groups");
      const ParamGroup& g = groups_[static_cast<size_t>(index)];
      if (rest == "params") {
        const int64_t n = static_cast<int64_t>(g.params.size());
        EMBER_CHECK(t.dtype() == DType::i64 && t.dim() == 1 && t.size(0) == n, ValueError, op, ": '", name,
                    "' must be an i64 [", n, "] list of parameter indices (the group's size), got ", t.description());
        int64_t first = 0;
        for (int64_t k = 0; k < index; ++k)
          first += static_cast<int64_t>(groups_[static_cast<size_t>(k)].params.size());
        const std::vector<int64_t> v = t.to_vector<int64_t>();
        for (int64_t k = 0; k < n; ++k)
          EMBER_CHECK(v[static_cast<size_t>(k)] == first + k, ValueError, op, ": '", name,
                      "' lists parameter index ", v[static_cast<size_t>(k)], " at position ", k, ", expected ",
                      first + k);
        has_params[static_cast<size_t>(index)] = true;
      } else {
        EMBER_CHECK(g.options.has(rest), ValueError, op, ": '", name, "' is not an option of this optimizer");
        EMBER_CHECK(t.numel() == 1, ValueError, op, ": option '", name, "' must hold one value, got ",
                    t.description());
        loaded_options[static_cast<size_t>(index)].set(rest, t.item_double());
      }
    } else if (starts_with(name, "state.") && split_index(name.substr(6), index, rest)) {
      EMBER_CHECK(index < n_params, ValueError, op, ": '", name, "' names parameter ", index,
                  " but the optimizer has ", n_params, " parameters");
      EMBER_CHECK(std::find(keys.begin(), keys.end(), rest) != keys.end(), ValueError, op, ": '", name,
                  "' is not a state this optimizer keeps");
      const Tensor& p = flat[static_cast<size_t>(index)];
      const StateSpec spec = state_spec(rest, p);
      EMBER_CHECK(t.sizes() == spec.shape, ValueError, op, ": '", name, "' must have shape ", shape_str(spec.shape),
                  " (parameter ", p.description(), "), got ", t.description());
      Tensor copy = empty(spec.shape, TensorOptions(spec.dtype, spec.device));
      copy.copy_(t);
      loaded_state[index].set(rest, copy);
    } else {
      EMBER_THROW(ValueError, op, ": unexpected name '", name,
                  "' (expected state.<i>.<key> or param_groups.<g>.<name>)");
    }
  }

  std::vector<GroupOptions> options(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    EMBER_CHECK(has_params[g], ValueError, op, ": 'param_groups.", g, ".params' is missing");
    for (const auto& [name, value] : groups_[g].options.entries()) {
      EMBER_CHECK(loaded_options[g].has(name), ValueError, op, ": 'param_groups.", g, ".", name, "' is missing");
      options[g].set(name, loaded_options[g].get(name));
    }
    validate_options(options[g]);
  }
  for (const auto& [index, st] : loaded_state)
    for (const std::string& key : keys)
      EMBER_CHECK(st.has(key), ValueError, op, ": the state of parameter ", index, " has no '", key,
                  "' ('state.", index, ".", key, "' is missing)");

  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = std::move(options[g]);
  state_.clear();
  for (auto& [index, st] : loaded_state) state_[flat[static_cast<size_t>(index)].unsafe_impl()] = std::move(st);
}

}  // namespace ember::optim
