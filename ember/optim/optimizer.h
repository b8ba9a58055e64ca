// Optimizer: the base of ember's optimizers (torch.optim.Optimizer) — parameter groups with named hyper-parameters,
// per-parameter state, zero_grad, and a flat state_dict of named tensors that safetensors can store.
// Invariant: every group holds every option of the optimizer's defaults (validated), a parameter appears in one group
// only, and each parameter's state is either empty or complete (every key state_keys() names).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ember/core/tensor.h"

namespace ember::optim {

// An ordered name -> tensor list, as state_dict() returns and load_state_dict() takes (nn::NamedTensors' type).
using StateDict = std::vector<std::pair<std::string, Tensor>>;

// The hyper-parameters of one parameter group by name, in a fixed order: PyTorch's group dict without 'params'.
// Values are doubles; flags (nesterov) are 0 or 1, and Adam's betas are two entries "beta1" and "beta2".
class GroupOptions {
 public:
  GroupOptions() = default;
  GroupOptions(std::initializer_list<std::pair<std::string, double>> entries);
  bool has(const std::string& name) const;
  double get(const std::string& name) const;                 // ValueError when the group has no such option
  GroupOptions& set(const std::string& name, double value);  // replaces the value, or appends a new name
  const std::vector<std::pair<std::string, double>>& entries() const { return entries_; }
  bool operator==(const GroupOptions& other) const = default;

 private:
  std::vector<std::pair<std::string, double>> entries_;
};

// A parameter group. Passed to a constructor or add_param_group, `options` holds overrides of the optimizer's
// defaults (e.g. {{"weight_decay", 0.0}}); inside the optimizer it holds every option, and may be changed between
// steps (schedulers set "lr").
struct ParamGroup {
  std::vector<Tensor> params;
  GroupOptions options = {};

  double lr() const { return options.get("lr"); }
  void set_lr(double lr) { options.set("lr", lr); }
};

// The named state tensors of one parameter ("step", "exp_avg", ...), in the order they were added.
class ParamState {
 public:
  bool empty() const { return entries_.empty(); }
  bool has(const std::string& key) const;
  const Tensor& get(const std::string& key) const;  // ValueError when absent
  void set(const std::string& key, Tensor value);
  const std::vector<std::pair<std::string, Tensor>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::string, Tensor>> entries_;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a .grad (parameters without one are skipped), under NoGradGuard.
  virtual void step() = 0;
  // Clears every parameter's .grad (set_to_none, the default: frees the memory) or fills it with zeros.
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Adds a group: options missing from it take the defaults; ValueError for an unknown option name, a bad value,
  // an empty group, or a parameter that is undefined, not floating, does not require grad, is not a leaf, or is
  // already in a group.
  void add_param_group(ParamGroup group);
  const GroupOptions& defaults() const { return defaults_; }
  std::vector<Tensor> parameters() const;  // every group's parameters, in order
  int64_t num_parameters() const;

  // The state of a parameter of this optimizer (empty before its first step).
  const ParamState& state(const Tensor& param) const;

  // Note [Optimizer state_dict]
  // Names, in this order (i = the parameter's index counting through the groups in order, g = the group's index):
  //   "state.<i>.<key>"          per parameter with state: its tensors (Adam: step (0-d f64), exp_avg, exp_avg_sq;
  //                              SGD: momentum_buffer), aliasing the live state (clone to snapshot);
  //   "param_groups.<g>.params"  i64 [n]: the indices i of the group's parameters;
  //   "param_groups.<g>.<name>"  0-d f64 per option ("lr", "weight_decay", ...).
  // load_state_dict takes such a list from an optimizer of the same kind over parameters of the same shapes in the
  // same groups: it validates every name, group size and shape first (ValueError, nothing changed), then copies the
  // state (cast to the state dtype, moved to the parameter's device; never aliasing the list) and the options.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& dict);

 protected:
  explicit Optimizer(GroupOptions defaults) : defaults_(std::move(defaults)) {}
  // For a derived constructor: adds the groups (ValueError when there is no parameter at all).
  void init_groups(std::vector<ParamGroup> groups);

  // ValueError when an option value is invalid (a negative lr, betas outside [0, 1), ...).
  virtual void validate_options(const GroupOptions& options) const = 0;
  // The keys of a complete per-parameter state, and the dtype, shape and device each takes for `param`.
  virtual std::vector<std::string> state_keys() const = 0;
  struct StateSpec {
    DType dtype;
    Shape shape;
    Device device;
  };
  virtual StateSpec state_spec(const std::string& key, const Tensor& param) const = 0;

  ParamState& mutable_state(const Tensor& param);  // created empty on first use

  // Runs update(p, g) with p and g contiguous, g in p's dtype: p itself when contiguous, else a contiguous copy
  // written back into param afterwards.
  template <class Update>
  static void update_contiguous(const Tensor& param, const Tensor& grad, Update&& update) {
    const Tensor g = grad.to(param.dtype()).contiguous();
    if (param.is_contiguous()) {
      update(param, g);
      return;
    }
    Tensor p = param.contiguous(), dst = param;
    update(p, g);
    dst.copy_(p);
  }

 private:
  GroupOptions defaults_;
  std::vector<ParamGroup> groups_;
  std::unordered_map<const TensorImpl*, ParamState> state_;
};

}  // namespace ember::optim
