// Collation: a list of Examples stacked into one batch along a new first dimension, optionally into pinned host
// memory. Invariant: the batch's row i holds example i's bytes unchanged; examples that disagree in shape or dtype
// are refused (ShapeError/DTypeError naming the first one that differs), never padded or cast.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ember/core/tensor.h"
#include "ember/data/dataset.h"

namespace ember::data {

// data: [B, *data shape], target: [B, *target shape] (0-d targets give [B]); CPU tensors, from the pinned pool when
// `pinned`. ValueError for an empty list. `indices` (the examples' dataset indices, as many as examples; may be empty)
// are named in the errors beside each example's position in the batch.
Example collate(const std::vector<Example>& examples, bool pinned = false, std::span<const int64_t> indices = {});

}  // namespace ember::data
