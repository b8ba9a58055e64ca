// Stacks examples into batch tensors (plain or pinned host memory). Invariant: one allocation per field per batch;
// each example is copied once into its row.
#include "ember/data/collate.h"

#include <cstring>
#include <string>

#include "ember/base/error.h"
#include "ember/core/grad_mode.h"

namespace ember::data {

namespace {

// "example i" or "example i (dataset index n)".
std::string example_name(size_t i, std::span<const int64_t> indices) {
  std::string s = "example " + std::to_string(i);
  if (i < indices.size()) s += " (dataset index " + std::to_string(indices[i]) + ")";
  return s;
}

Tensor stack_field(const std::vector<Example>& examples, Tensor Example::*field, const char* name, bool pinned,
                   std::span<const int64_t> indices) {
  const Tensor& first = examples.front().*field;
  EMBER_CHECK(first.defined(), ValueError, "collate: ", example_name(0, indices), " has no ", name);
  for (size_t i = 0; i < examples.size(); ++i) {
    const Tensor& t = examples[i].*field;
    if (t.defined() && t.device().is_cpu() && t.dtype() == first.dtype() && t.sizes() == first.sizes()) continue;
    const std::string ex = example_name(i, indices);
    EMBER_CHECK(t.defined(), ValueError, "collate: ", ex, " has no ", name);
    EMBER_CHECK(t.device().is_cpu(), DeviceError, "collate: ", ex, "'s ", name, " is ", t.description(),
                "; datasets return CPU tensors (the loader moves batches to the device)");
    EMBER_CHECK(t.dtype() == first.dtype(), DTypeError, "collate: ", ex, "'s ", name, " is ", t.description(),
                " but ", example_name(0, indices), "'s is ", first.description());
    EMBER_THROW(ShapeError, "collate: ", ex, "'s ", name, " is ", t.description(), " but ", example_name(0, indices),
                "'s is ", first.description());
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

Example collate(const std::vector<Example>& examples, bool pinned, std::span<const int64_t> indices) {
  EMBER_CHECK(!examples.empty(), ValueError, "collate: no examples");
  EMBER_CHECK(indices.empty() || indices.size() == examples.size(), ValueError, "collate: ", indices.size(),
              " dataset indices for ", examples.size(), " examples");
  Example batch;
  batch.data = stack_field(examples, &Example::data, "data", pinned, indices);
  batch.target = stack_field(examples, &Example::target, "target", pinned, indices);
  return batch;
}

}  // namespace ember::data
