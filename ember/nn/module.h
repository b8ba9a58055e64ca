// Module: the building block of models (libtorch's nn::Module). A module owns named parameters (leaves that require
// grad), named buffers (state that is not trained, e.g. BatchNorm's running statistics) and named child modules, in
// registration order. Invariant: the Tensor handles a layer keeps in its members are the registered ones — to() and
// load_state_dict() change their contents in place, so a layer's `weight` member always is its parameter.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ember/core/tensor.h"
#include "ember/memory/tags.h"

namespace ember::nn {

// An ordered name → tensor list ("layer1.weight", ...), as state_dict() returns and safetensors stores.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }

  // The single-input forward that containers (Sequential) call; layers with other signatures leave it throwing.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  // --- registration (in a layer's constructor) --------------------------------------------------------------------
  // Registers t as a parameter (requires_grad_ set unless requires_grad is false) and returns the registered handle.
  Tensor register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  // A non-persistent buffer (persistent = false) is moved by to() but left out of state_dict (PyTorch's flag).
  Tensor register_buffer(const std::string& name, Tensor t, bool persistent = true);
  // Unregister a parameter / buffer of this module (not of a child) and return it (ValueError naming the module and
  // the known names when absent). The layer's own member handle is left to the caller (pruning and packing set it).
  Tensor remove_parameter(const std::string& name);
  Tensor remove_buffer(const std::string& name);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    register_module_impl(name, module);
    return module;
  }

  // --- traversal (names are dotted paths: "blocks.0.attn.qkv.weight") ----------------------------------------------
  // named_parameters/parameters/named_buffers list a tensor shared by several modules once (PyTorch's
  // remove_duplicate); undefined tensors (e.g. a Linear without bias) are never listed.
  NamedTensors named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  std::vector<std::shared_ptr<Module>> children() const;
  // This module ("" ) and every descendant, depth first, in registration order.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules(const std::string& prefix = "");
  int64_t num_parameters(bool trainable_only = false) const;
  int64_t parameter_bytes() const;

  // --- modes and conversion ------------------------------------------------------------------------------------
  virtual void train(bool on = true);  // recursive
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves/casts every parameter and buffer in place (floating ones only for the dtype form, which needs a floating
  // dtype: DTypeError); a converted tensor's gradient is dropped (one already on that device/dtype keeps it).
  void to(Device device);
  void to(DType dtype);
  void to(Device device, DType dtype);
  // Clears (set_to_none, the default — frees the memory) or zeroes every parameter's .grad.
  void zero_grad(bool set_to_none = true);

  // --- state -------------------------------------------------------------------------------------------------------
  // Per module (depth first, in registration order): its parameters then its persistent buffers, by dotted name —
  // PyTorch's key order (detached: they share storage with the module's tensors).
  NamedTensors state_dict() const;
  // Copies values into the module's tensors (dtype cast and device move allowed; shapes must match: ShapeError).
  // strict: every key must exist on both sides (ValueError naming the missing / unexpected keys).
  void load_state_dict(const NamedTensors& state, bool strict = true);

  // A one-line-per-module description with parameter counts.
  std::string describe() const;

  // --- memory attribution (DESIGN.md §6) -----------------------------------------------------------------------
  // The owner name of this module's allocations: the root's type_name, then the dotted child names
  // ("MnistNet.conv1", "GPT.transformer.h.0.attn"). A module registered in several parents keeps its first one.
  // Computing it also hands the module's own parameters and buffers to "PATH/parameters".
  const std::string& memory_path() const { return memory::module_path(memory_handle()); }
  // The interned memory_path(), recomputed only after a registration anywhere changed the module tree.
  memory::ModuleHandle memory_handle() const;

 protected:
  // Extra text for describe(), e.g. "in=784, out=128".
  virtual std::string extra_repr() const { return ""; }

 private:
  void register_module_impl(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, bool params, bool recurse, NamedTensors& out) const;
  void collect_state(const std::string& prefix, NamedTensors& out) const;  // state_dict order, live handles
  void describe_into(const std::string& name, int depth, std::string& out) const;
  void tag_own_state(memory::ModuleHandle handle) const;  // Note [Parameter ownership] in module.cpp

  std::string type_name_;
  bool training_ = true;
  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::string> non_persistent_;  // names of buffers_ entries left out of state_dict
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  // Note [Module memory paths]: parent_ is a raw back-pointer set when this module is first registered as a child
  // (a parent's destructor clears it in its children). memory_handle() caches the interned path together with the
  // registration generation it was computed at; any registration (or a parent going away) bumps the generation.
  Module* parent_ = nullptr;
  std::string name_in_parent_;
  mutable std::atomic<memory::ModuleHandle> memory_handle_{nullptr};
  mutable std::atomic<uint64_t> memory_generation_{0};  // 0: never computed
};

// Opens a memory::ModuleScope for the enclosing module (`this`) for the rest of the block: put it first in every
// forward, so the allocations inside are owned by "PATH/forward" (or by "PATH/backward" during recomputation).
#define EMBER_MODULE_SCOPE() ::ember::memory::ModuleScope ember_module_scope_(this->memory_handle())

// Replaces the contents of `dst`'s TensorImpl with `src`'s geometry and storage, keeping dst's identity and its
// requires_grad flag (libtorch's set_data); .grad is cleared. Used by Module::to. An optimizer built before to()
// keeps its state where it was (as in PyTorch): build it after moving the model.
void set_data(const Tensor& dst, const Tensor& src);

}  // namespace ember::nn
