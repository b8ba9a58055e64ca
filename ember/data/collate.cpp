// Stacks examples into batch tensors (plain or pinned host memory). Invariant: one allocation per field per batch;
// each example is copied once into its row.
#include "ember/data/collate.h"

#include <cstring>

#include "ember/base/error.h"
#include "ember/core/grad_mode.h"

namespace ember::data {

namespace {

Tensor stack_field(const std::vector<Example>& examples, Tensor Example::*field, const char* name, bool pinned) {
  const Tensor& first = examples.front().*field;
  EMBER_CHECK(first.defined(), ValueError, "collate: example 0 has no ", name);
  for (size_t i = 0; i < examples.size(); ++i) {
    const Tensor& t = examples[i].*field;
    EMBER_CHECK(t.defined(), ValueError, "collate: example ", i, " has no ", name);
    EMBER_CHECK(t.device().is_cpu(), DeviceError, "collate: example ", i, "'s ", name, " is ", t.description(),
                "; datasets return CPU tensors (the loader moves batches to the device)");
    EMBER_CHECK(t.dtype() == first.dtype(), DTypeError, "collate: example ", i, "'s ", name, " is ",
                t.description(), " but example 0's is ", first.description());
    EMBER_CHECK(t.sizes() == first.sizes(), ShapeError, "collate: example ", i, "'s ", name, " is ",
                t.description(), " but example 0's is ", first.description());
  }
  Shape shape = first.sizes();
  shape.insert(shape.begin(), static_cast<int64_t>(examples.size()));
  Tensor out = pinned ? empty_pinned(shape, first.dtype()) : empty(shape, TensorOptions(first.dtype(), Device::cpu()));
  const int64_t row_bytes = first.nbytes();
  char* dst = static_cast<char*>(out.raw_data());
  NoGradGuard no_grad;
  for (size_t i = 0; i < examples.size(); ++i) {
    const Tensor& t = examples[i].*field;
    if (t.is_contiguous()) {
      if (row_bytes > 0) std::memcpy(dst + static_cast<int64_t>(i) * row_bytes, t.raw_data(), row_bytes);
    } else {
      out.select(0, static_cast<int64_t>(i)).copy_(t);
    }
  }
  return out;
}

}  // namespace

Example collate(const std::vector<Example>& examples, bool pinned) {
  EMBER_CHECK(!examples.empty(), ValueError, "collate: no examples");
  Example batch;
  batch.data = stack_field(examples, &Example::data, "data", pinned);
  batch.target = stack_field(examples, &Example::target, "target", pinned);
  return batch;
}

}  // namespace ember::data
