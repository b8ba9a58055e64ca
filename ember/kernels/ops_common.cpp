// Argument checks shared by the op front ends.
// Invariant: checks only; they never allocate or touch data.
#include "ember/kernels/ops.h"

namespace ember {

Device common_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (t == nullptr || !t->defined()) continue;
    if (first == nullptr) {
      first = t;
      continue;
    }
    EMBER_CHECK(t->device() == first->device(), DeviceError, op, ": expected all tensors on one device, got ",
                first->description(), " and ", t->description());
  }
  EMBER_CHECK(first != nullptr, ValueError, op, ": no defined input tensor");
  return first->device();
}

void check_floating(const char* op, const Tensor& t) {
  EMBER_CHECK(is_floating(t.dtype()), DTypeError, op, ": expects a floating tensor (f32, f16, bf16, f64), got ",
              t.description());
}

}  // namespace ember
