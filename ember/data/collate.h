// Collation: a list of Examples stacked into one batch along a new first dimension, optionally into pinned host
// memory. Invariant: the batch's row i holds example i's bytes unchanged; examples that disagree in shape or dtype
// are refused (ShapeError/DTypeError naming the first one that differs), never padded or cast.
#pragma once

#include <vector>

#include "ember/core/tensor.h"
#include "ember/data/dataset.h"

namespace ember::data {

// data: [B, *data shape], target: [B, *target shape] (0-d targets give [B]); CPU tensors, from the pinned pool when
// `pinned`. ValueError for an empty list.
Example collate(const std::vector<Example>& examples, bool pinned = false);

}  // namespace ember::data
