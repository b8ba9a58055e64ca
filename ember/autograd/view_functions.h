// Backward of the view methods of Tensor (transpose, slice, expand, ...): each is recorded as a node whose formula
// maps the view's gradient back onto the base's shape.
#pragma once

#include "ember/core/autograd_hooks.h"
#include "ember/core/tensor.h"

namespace ember::autograd {

// Records `view` = info(base) (base requires grad; grad mode is on).
void record_view_node(const Tensor& base, const Tensor& view, const ViewInfo& info);

}  // namespace ember::autograd
