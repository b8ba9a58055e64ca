// Public hook API: tensor gradient hooks (see or replace the gradient of any tensor that requires grad) and
// post-accumulate hooks on leaves (run after .grad was updated; DDP launches a bucket's all-reduce from them).
#pragma once

#include "ember/autograd/node.h"

namespace ember::autograd {

// `hook(grad)` runs when the gradient of t is computed, before it is used; return an undefined tensor to keep the
// gradient or a replacement (same shape) to change it. On a leaf it runs before accumulation into .grad.
HookHandle register_hook(const Tensor& t, TensorHook hook);
// `hook(leaf)` runs after leaf.grad was accumulated in a backward pass. t must be a leaf that requires grad.
HookHandle register_post_accumulate_grad_hook(const Tensor& t, PostAccumulateHook hook);

}  // namespace ember::autograd
