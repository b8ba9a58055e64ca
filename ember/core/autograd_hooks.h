// The interface through which core's Tensor methods reach the autograd layer above it (like c10's
// VariableHooksInterface): view and copy methods report what they made so it can be recorded, in-place methods ask
// before writing, and the autograd members of Tensor (requires_grad, grad, backward, ...) forward here. The autograd
// layer installs the one implementation when the library loads; core never includes autograd headers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ember/core/shape.h"

namespace ember {

class Tensor;

// What a view method did, so the autograd layer can build its backward (a view of the gradient, or a scatter).
enum class ViewKind : int8_t {
  Reshape,    // view / reshape / squeeze / unsqueeze / flatten: grad.reshape(base sizes)
  Transpose,  // dims = {d0, d1}
  Permute,    // dims = permutation
  Slice,      // dim, start, step (the view's size in dim gives the end)
  Select,     // dim, start = index
  Expand,     // grad summed back to base sizes
  AsStrided,  // sizes/strides/offset of the view over the storage
  Alias       // same geometry
};
struct ViewInfo {
  ViewKind kind = ViewKind::Alias;
  int64_t dim = 0, start = 0, step = 1;
  std::vector<int64_t> dims;
};

class AutogradHooks {
 public:
  virtual ~AutogradHooks() = default;
  // `view` was made from `base` (which has autograd state) by a view method.
  virtual void record_view(const Tensor& base, const Tensor& view, const ViewInfo& info) const = 0;
  // `out` is new storage holding src's values (clone, contiguous, to(device/dtype)).
  virtual void record_copy(const char* op, const Tensor& src, const Tensor& out) const = 0;
  // Called before an in-place write into `self` (copy_ from `src`, or fill_ when src is null): raises for writes
  // autograd cannot allow (a leaf that requires grad while grad mode is on, an inference tensor outside inference
  // mode, a view of a tensor that requires grad). After the write, record_inplace updates self's history.
  virtual void check_inplace(const char* op, const Tensor& self, const Tensor* src) const = 0;
  virtual void record_inplace(const char* op, const Tensor& self, const Tensor* src) const = 0;

  virtual bool requires_grad(const Tensor& t) const = 0;
  virtual void set_requires_grad(const Tensor& t, bool requires_grad) const = 0;
  virtual Tensor grad(const Tensor& t) const = 0;
  virtual void set_grad(const Tensor& t, const Tensor& grad) const = 0;
  virtual bool is_leaf(const Tensor& t) const = 0;
  virtual void retain_grad(const Tensor& t) const = 0;
  virtual std::string grad_fn_name(const Tensor& t) const = 0;
  virtual void backward(const Tensor& t, const Tensor& gradient, bool retain_graph) const = 0;
};

// The installed implementation; throws ValueError when the autograd layer is not linked.
const AutogradHooks& autograd_hooks();
bool has_autograd_hooks();
void set_autograd_hooks(const AutogradHooks* hooks);

}  // namespace ember
