// Saved-tensor hooks (pack/unpack): while a guard is alive on this thread, every tensor an op saves for backward is
// passed to `pack` and only its result is kept; backward calls `unpack` on it to get the tensor back. This is how
// activation checkpointing (pack a handle, recompute on unpack) and CPU offload (pack a host copy) are built.
#pragma once

#include <any>
#include <functional>

#include "ember/core/tensor.h"

namespace ember::autograd {

using PackHook = std::function<std::any(const Tensor&)>;
using UnpackHook = std::function<Tensor(const std::any&)>;

// RAII: installs (pack, unpack) for tensors saved in its scope on this thread; guards nest (innermost wins).
class SavedTensorHooksGuard {
 public:
  SavedTensorHooksGuard(PackHook pack, UnpackHook unpack);
  ~SavedTensorHooksGuard();
  SavedTensorHooksGuard(const SavedTensorHooksGuard&) = delete;
  SavedTensorHooksGuard& operator=(const SavedTensorHooksGuard&) = delete;
};

struct SavedTensorHooks {
  PackHook pack;
  UnpackHook unpack;
};
// The innermost hooks of this thread, or null.
const SavedTensorHooks* current_saved_tensor_hooks();

}  // namespace ember::autograd
