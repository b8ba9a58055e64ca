// Tensor: a strided view (sizes, strides, offset in elements, dtype) over a refcounted Storage on one device.
// Copying a Tensor shares the data (reference semantics, like libtorch). View ops (view, transpose, permute, slice,
// expand, squeeze, ...) never copy; contiguous/clone/to do, through the copy kernel of the device.
// Invariant: every element a view can address lies inside its storage (checked when views are made).
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "ember/core/autograd_hooks.h"
#include "ember/core/device.h"
#include "ember/core/dtype.h"
#include "ember/core/generator.h"
#include "ember/core/scalar.h"
#include "ember/core/shape.h"
#include "ember/core/storage.h"

namespace ember {

// Opaque per-tensor state owned by layers above core (autograd keeps grad, grad_fn, requires_grad here).
struct AutogradMetaBase {
  virtual ~AutogradMetaBase() = default;
};

struct TensorImpl {
  Storage storage;
  Shape sizes;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  std::shared_ptr<AutogradMetaBase> autograd_meta;  // null for tensors autograd never saw (no grad, no history)
  bool is_inference = false;  // allocated in inference mode (core/grad_mode.h); views inherit it
};

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = default_device();  // cpu unless a DefaultDeviceGuard says otherwise (core/device.h)
  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}
  TensorOptions(Device dev) : device(dev) {}
  TensorOptions(DType d, Device dev) : dtype(d), device(dev) {}
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- metadata -----------------------------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& sizes() const { return impl().sizes; }
  const Shape& strides() const { return impl().strides; }
  Shape shape() const { return impl().sizes; }
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(impl().sizes.size()); }
  int64_t numel() const { return numel_of(impl().sizes); }
  int64_t storage_offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  int64_t itemsize() const { return ember::itemsize(dtype()); }
  int64_t nbytes() const { return numel() * itemsize(); }
  bool is_contiguous() const;
  const Storage& storage() const { return impl().storage; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  TensorImpl* unsafe_impl() const { return impl_.get(); }
  long use_count() const { return impl_.use_count(); }  // Tensor objects sharing this TensorImpl
  std::string description() const;  // "f32[2, 3] on cpu"

  // Pointer to the first element of this view (nullptr for meta / empty storage).
  void* raw_data() const;
  template <class T>
  T* data() const {
    EMBER_CHECK(dtype_of_v<T> == dtype(), DTypeError, "Tensor::data<", dtype_name(dtype_of_v<T>),
                ">: tensor has dtype ", dtype_name(dtype()));
    return static_cast<T*>(raw_data());
  }

  // --- views (no copy) -----------------------------------------------------------------------------------------
  Tensor view(const Shape& shape) const;     // one -1 allowed; ShapeError when strides do not allow a view
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a contiguous copy
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // transpose of a 2-d tensor
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;  // Python-style clamping of bounds
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;               // bounds must be in range
  Tensor select(int64_t dim, int64_t index) const;                               // removes dim
  Tensor expand(const Shape& shape) const;  // -1 keeps a size; size-1 dims broadcast with stride 0
  Tensor broadcast_to(const Shape& shape) const { return expand(shape); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor as_strided(const Shape& sizes, const Shape& strides, int64_t offset) const;
  Tensor alias() const;  // a new Tensor object sharing this view's storage and geometry

  // --- copies ----------------------------------------------------------------------------------------------------
  Tensor contiguous() const;  // *this when already contiguous
  Tensor clone() const;
  Tensor to(Device device) const;  // *this when already there
  Tensor to(DType dtype) const;    // *this when already that dtype
  Tensor to(Device device, DType dtype) const;
  Tensor cpu() const { return to(Device::cpu()); }
  bool is_pinned() const;       // bytes from the pinned host pool (empty_pinned, pin_memory)
  Tensor pin_memory() const;    // a pinned contiguous copy of a CPU tensor (*this when already pinned)
  // Work queued on `stream` uses this tensor's bytes: the allocator will not reuse them before that work is done
  // (memory::Allocator::record_stream; nothing to do for CPU allocators).
  void record_stream(memory::StreamId stream) const;
  Tensor& copy_(const Tensor& src);  // src broadcasts to this shape; dtype cast; devices may differ
  Tensor& fill_(Scalar value);
  Tensor& zero_() { return fill_(0); }

  template <class T>
  T item() const;
  // The value of a one-element tensor as double (meta inside a dry run: 0, Note [Reading a meta tensor]).
  double item_double() const;
  template <class T>
  std::vector<T> to_vector() const;    // all elements in row-major order, converted to T

  // --- autograd (implemented by the autograd layer through core/autograd_hooks.h) --------------------------------
  bool requires_grad() const;
  const Tensor& requires_grad_(bool requires_grad = true) const;  // leaves only; floating dtypes only
  Tensor grad() const;                      // undefined until a backward pass accumulates one
  void set_grad(const Tensor& grad) const;  // replaces .grad (an undefined tensor clears it)
  bool is_leaf() const;                     // true unless the tensor was produced by a recorded op
  void retain_grad() const;                 // a non-leaf keeps its .grad after backward
  std::string grad_fn_name() const;         // "MulBackward", ...; "" for leaves
  // Computes the gradient of this tensor w.r.t. the leaves of its graph and accumulates it into their .grad.
  // `gradient` may be omitted for a one-element tensor; the graph is freed unless retain_graph.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  Tensor detach() const;  // same storage and version counter, no history, requires_grad false
  bool is_inference() const { return impl().is_inference; }

  // Marks an in-place write to this tensor's storage (autograd's version counter).
  void bump_version() const { impl().storage->bump_version(); }
  int64_t version() const { return impl().storage->version(); }
  // Autograd's checks before an in-place write into this tensor (ValueError: a leaf that requires grad, a view of a
  // tensor with history, shared storage, an inference tensor outside InferenceMode); src: the tensor copied in, if
  // any. copy_ and fill_ run them; so must an op outside core that writes in place and records its own node.
  void check_inplace_write(const char* op, const Tensor* src) const;

 private:
  const TensorImpl& impl() const {
    EMBER_CHECK(impl_ != nullptr, ValueError, "operation on an undefined tensor");
    return *impl_;
  }
  // `info` describes the view for autograd (null: not recorded, e.g. detach).
  void copy_data(const Tensor& src) const;  // copy_ without the autograd checks
  void record_inplace_write(const char* op, const Tensor* src) const;
  Tensor make_view(Shape sizes, Shape strides, int64_t offset, const char* op, const ViewInfo* info) const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::string to_string(const Tensor& t, int64_t max_elements = 64);

// --- factories ----------------------------------------------------------------------------------------------------
Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor empty_strided(const Shape& shape, const Shape& strides, TensorOptions opts = {});
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, Scalar value, TensorOptions opts = {});
Tensor empty_like(const Tensor& t);
// A contiguous CPU tensor in page-locked memory from the pinned pool (memory::pinned_pool(); ordinary host memory in
// a build or on a machine without CUDA): the staging buffer an asynchronous host-to-device copy reads from.
Tensor empty_pinned(const Shape& shape, DType dtype = DType::f32);
// A contiguous tensor whose bytes the device's allocator hands out for work on `stream` (a cudaStream_t's bits; 0 is
// the legacy default stream): a buffer a side stream fills. Use record_stream for every other stream that uses it.
Tensor empty_on_stream(const Shape& shape, TensorOptions opts, memory::StreamId stream);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor scalar_tensor(Scalar value, TensorOptions opts = {});  // 0-d
// [start, end) with step. Without options the dtype is i64 when start, end and step are all integers, else f32.
// Integer bounds are exact over the whole i64 range.
Tensor arange(Scalar end, TensorOptions opts);
Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions opts);
Tensor arange(Scalar start, Scalar end, Scalar step = 1);
Tensor arange(int64_t end);
// Uniform in [low, high) and standard normal, from the Philox generator (same numbers on every device).
Tensor rand(const Shape& shape, TensorOptions opts = {});
Tensor randn(const Shape& shape, TensorOptions opts = {});
Tensor uniform(const Shape& shape, double low, double high, TensorOptions opts = {});
Tensor normal(const Shape& shape, double mean, double stddev, TensorOptions opts = {});
// The same, drawing from `gen` instead of the default generator (PyTorch's generator= argument).
Tensor rand(const Shape& shape, Generator& gen, TensorOptions opts = {});
Tensor randn(const Shape& shape, Generator& gen, TensorOptions opts = {});
Tensor uniform(const Shape& shape, double low, double high, Generator& gen, TensorOptions opts = {});
Tensor normal(const Shape& shape, double mean, double stddev, Generator& gen, TensorOptions opts = {});
// t's shape, dtype and device (a floating dtype for the random ones: DTypeError), from the default generator.
Tensor full_like(const Tensor& t, Scalar value);
Tensor rand_like(const Tensor& t);
Tensor randn_like(const Tensor& t);
// Copies host values into a new tensor of the given shape (numel must match) and options.
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opts = {dtype_of_v<T>});
Tensor tensor(std::initializer_list<float> values, TensorOptions opts = {});  // 1-d convenience

}  // namespace ember
