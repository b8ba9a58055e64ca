// SavedTensor and the thread-local saved-tensor hook stack.
#include <vector>

#include "ember/autograd/node.h"
#include "ember/autograd/saved_hooks.h"

namespace ember::autograd {

namespace {
thread_local std::vector<SavedTensorHooks> t_hook_stack;
}  // namespace

SavedTensorHooksGuard::SavedTensorHooksGuard(PackHook pack, UnpackHook unpack) {
  EMBER_CHECK(pack && unpack, ValueError, "SavedTensorHooksGuard: both a pack and an unpack hook are required");
  t_hook_stack.push_back({std::move(pack), std::move(unpack)});
}
SavedTensorHooksGuard::~SavedTensorHooksGuard() { t_hook_stack.pop_back(); }

const SavedTensorHooks* current_saved_tensor_hooks() {
  return t_hook_stack.empty() ? nullptr : &t_hook_stack.back();
}

// Note [Saved tensor versions]
// Every in-place write bumps the version counter of the storage it writes (core: copy_, fill_). A saved tensor
// remembers the version at save time; if the storage moved on before backward, the formula would read values other
// than the forward used, so unpack() raises instead. Under pack hooks only a weak reference to the storage is kept:
// the check still runs while the storage lives (if it died, nothing could have written it).
SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  EMBER_CHECK(!t.is_inference(), ValueError, "inference tensors cannot be saved for backward: ", t.description(),
              " was made in InferenceMode; clone() it outside inference mode to use it in autograd");
  was_defined_ = true;
  saved_version_ = t.version();
  storage_ = t.storage();
  sizes_ = t.sizes();
  dtype_ = t.dtype();
  device_ = t.device();
  Tensor detached = t.detach();
  if (const SavedTensorHooks* hooks = current_saved_tensor_hooks()) {
    packed_ = hooks->pack(detached);
    unpack_hook_ = hooks->unpack;
  } else {
    data_ = std::move(detached);
  }
}

std::string SavedTensor::description() const {
  return detail::concat(dtype_name(dtype_), shape_str(sizes_), " on ", device_.str());
}

Tensor SavedTensor::unpack(const Node& node) const {
  if (!was_defined_) return Tensor();
  EMBER_CHECK(!released_, ValueError, "trying to backward through ", node.name(), " (", node.forward_description(),
              ") a second time: its saved tensors were freed after the first backward; pass retain_graph=true to the "
              "first backward() to keep them");
  if (auto storage = storage_.lock()) {
    EMBER_CHECK(storage->version() == saved_version_, ValueError,
                "a tensor needed for gradient computation was modified by an in-place operation: ", description(),
                " saved by ", node.name(), " (", node.forward_description(), ") is at version ", storage->version(),
                "; expected version ", saved_version_);
  }
  if (unpack_hook_) {
    Tensor t = unpack_hook_(packed_);
    EMBER_CHECK(t.defined(), ValueError, "saved-tensor unpack hook returned an undefined tensor for ", description(),
                " saved by ", node.name());
    return t;
  }
  return data_;
}

void SavedTensor::reset() {
  if (!was_defined_) return;
  data_ = Tensor();
  packed_.reset();
  unpack_hook_ = nullptr;
  released_ = true;
}

}  // namespace ember::autograd
