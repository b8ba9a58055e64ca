// Tensor metadata and view operations (no data movement), plus copy_/fill_/contiguous/to, which move data through
// the device's copy and fill kernels (core_stubs.h).
#include "ember/core/tensor.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "ember/core/core_stubs.h"
#include "ember/core/grad_mode.h"
#include "ember/core/meta_scope.h"
#include "ember/memory/cuda_device.h"

namespace ember {

int64_t Tensor::size(int64_t d) const {
  EMBER_CHECK(dim() > 0, IndexError, "Tensor::size: a 0-d tensor has no dim ", d);
  return sizes()[wrap_dim(d, dim(), "Tensor::size")];
}
int64_t Tensor::stride(int64_t d) const {
  EMBER_CHECK(dim() > 0, IndexError, "Tensor::stride: a 0-d tensor has no dim ", d);
  return strides()[wrap_dim(d, dim(), "Tensor::stride")];
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    const int64_t s = sizes()[i];
    if (s == 0) return true;
    if (s != 1 && strides()[i] != expected) return false;
    expected *= s;
  }
  return true;
}

std::string Tensor::description() const {
  if (!defined()) return "undefined tensor";
  return detail::concat(dtype_name(dtype()), shape_str(sizes()), " on ", device().str());
}

void* Tensor::raw_data() const {
  void* base = impl().storage->data();
  if (base == nullptr) return nullptr;
  return static_cast<char*>(base) + impl().offset * itemsize();
}

Tensor Tensor::make_view(Shape sizes, Shape strides, int64_t offset, const char* op, const ViewInfo* info) const {
  EMBER_CHECK(sizes.size() == strides.size(), ShapeError, op, ": ", sizes.size(), " sizes but ", strides.size(),
              " strides");
  check_sizes(sizes, op);
  const int64_t n = numel_of(sizes);
  if (n > 0) {
    int64_t max_off = offset;
    for (size_t i = 0; i < sizes.size(); ++i) {
      EMBER_CHECK(strides[i] >= 0, ShapeError, op, ": negative strides are not supported");
      int64_t span = 0;
      const bool overflow = __builtin_mul_overflow(sizes[i] - 1, strides[i], &span) ||
                            __builtin_add_overflow(max_off, span, &max_off);
      EMBER_CHECK(!overflow, ShapeError, op, ": view ", shape_str(sizes), " with strides ", shape_str(strides),
                  " addresses beyond int64");
    }
    const int64_t capacity = impl().storage->nbytes() / itemsize();
    EMBER_CHECK(offset >= 0 && max_off < capacity, ShapeError, op, ": view ", shape_str(sizes), " with strides ",
                shape_str(strides), " at offset ", offset, " exceeds the storage of ", capacity, " elements");
  }
  auto v = std::make_shared<TensorImpl>();
  v->storage = impl().storage;
  v->sizes = std::move(sizes);
  v->strides = std::move(strides);
  v->offset = offset;
  v->dtype = dtype();
  v->is_inference = impl().is_inference;
  Tensor out(std::move(v));
  if (info != nullptr && impl().autograd_meta != nullptr) autograd_hooks().record_view(*this, out, *info);
  return out;
}

namespace {
ViewInfo view_info(ViewKind kind, int64_t dim = 0, int64_t start = 0, int64_t step = 1, std::vector<int64_t> dims = {}) {
  ViewInfo i;
  i.kind = kind;
  i.dim = dim;
  i.start = start;
  i.step = step;
  i.dims = std::move(dims);
  return i;
}
const ViewInfo kReshapeInfo = view_info(ViewKind::Reshape);
const ViewInfo kAliasInfo = view_info(ViewKind::Alias);
const ViewInfo kExpandInfo = view_info(ViewKind::Expand);
const ViewInfo kAsStridedInfo = view_info(ViewKind::AsStrided);
}  // namespace

Tensor Tensor::alias() const { return make_view(sizes(), strides(), storage_offset(), "alias", &kAliasInfo); }

Tensor Tensor::as_strided(const Shape& sz, const Shape& st, int64_t offset) const {
  return make_view(sz, st, offset, "as_strided", &kAsStridedInfo);
}

namespace {

Shape infer_size(const Shape& shape, int64_t numel, const char* op, const Shape& from) {
  Shape out = shape;
  int64_t known = 1;
  int64_t infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      EMBER_CHECK(infer < 0, ShapeError, op, ": only one dimension can be -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      EMBER_CHECK(out[i] >= 0, ShapeError, op, ": invalid size ", out[i], " in ", shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    EMBER_CHECK(known != 0 && numel % known == 0, ShapeError, op, ": shape ", shape_str(shape),
                " is invalid for a tensor of shape ", shape_str(from), " (", numel, " elements)");
    out[infer] = numel / known;
  }
  EMBER_CHECK(numel_of(out) == numel, ShapeError, op, ": shape ", shape_str(shape), " is invalid for a tensor of shape ",
              shape_str(from), " (", numel, " elements)");
  return out;
}

// Strides for viewing (sizes, strides) as new_sizes without a copy, if possible (the chunk-matching rule:
// each run of dims that is contiguous within itself can be re-split freely).
std::optional<Shape> view_strides(const Shape& old_sizes, const Shape& old_strides, const Shape& new_sizes) {
  Shape new_strides(new_sizes.size());
  if (numel_of(old_sizes) == 0) return contiguous_strides(new_sizes);
  Shape os = old_sizes.empty() ? Shape{1} : old_sizes;
  Shape ost = old_strides.empty() ? Shape{1} : old_strides;
  int64_t view_d = static_cast<int64_t>(new_sizes.size()) - 1;
  int64_t chunk_base_stride = ost.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t td = static_cast<int64_t>(os.size()) - 1; td >= 0; --td) {
    tensor_numel *= os[td];
    if (td == 0 || (os[td - 1] != 1 && ost[td - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_sizes[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (td > 0) {
        chunk_base_stride = ost[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  Shape sz = infer_size(shape, numel(), "view", sizes());
  auto st = view_strides(sizes(), strides(), sz);
  EMBER_CHECK(st.has_value(), ShapeError, "view: cannot view ", description(), " with strides ", shape_str(strides()),
              " as ", shape_str(sz), " without a copy; use reshape() or contiguous() first");
  return make_view(std::move(sz), std::move(*st), storage_offset(), "view", &kReshapeInfo);
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape sz = infer_size(shape, numel(), "reshape", sizes());
  if (auto st = view_strides(sizes(), strides(), sz)) return make_view(std::move(sz), std::move(*st), storage_offset(), "reshape", &kReshapeInfo);
  return contiguous().view(sz);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  const int64_t s = wrap_dim(start_dim, dim(), "flatten"), e = wrap_dim(end_dim, dim(), "flatten");
  if (dim() == 0) return reshape({1});
  EMBER_CHECK(s <= e, IndexError, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape out(sizes().begin(), sizes().begin() + s);
  int64_t m = 1;
  for (int64_t i = s; i <= e; ++i) m *= sizes()[i];
  out.push_back(m);
  out.insert(out.end(), sizes().begin() + e + 1, sizes().end());
  return reshape(out);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  const int64_t a = wrap_dim(d0, dim(), "transpose"), b = wrap_dim(d1, dim(), "transpose");
  if (dim() == 0) return alias();
  Shape sz = sizes(), st = strides();
  std::swap(sz[a], sz[b]);
  std::swap(st[a], st[b]);
  const ViewInfo info = view_info(ViewKind::Transpose, 0, 0, 1, {a, b});
  return make_view(std::move(sz), std::move(st), storage_offset(), "transpose", &info);
}

Tensor Tensor::t() const {
  EMBER_CHECK(dim() <= 2, ShapeError, "t: expects a tensor with <= 2 dims, got ", description());
  return dim() < 2 ? alias() : transpose(0, 1);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  EMBER_CHECK(static_cast<int64_t>(dims.size()) == dim(), ShapeError, "permute: got ", dims.size(),
              " dims for ", description());
  Shape sz(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    EMBER_CHECK(!seen[d], IndexError, "permute: dim ", d, " repeated in ", shape_str(dims));
    seen[d] = true;
    sz[i] = sizes()[d];
    st[i] = strides()[d];
  }
  std::vector<int64_t> wrapped(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) wrapped[i] = wrap_dim(dims[i], dim(), "permute");
  const ViewInfo info = view_info(ViewKind::Permute, 0, 0, 1, std::move(wrapped));
  return make_view(std::move(sz), std::move(st), storage_offset(), "permute", &info);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  const int64_t w = wrap_dim(d, dim(), "slice");
  EMBER_CHECK(dim() > 0, IndexError, "slice: cannot slice a 0-d tensor");
  EMBER_CHECK(step > 0, ValueError, "slice: step must be positive, got ", step);
  const int64_t n = sizes()[w];
  auto clampi = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  const int64_t s = clampi(start), e = std::max(clampi(end), s);
  Shape sz = sizes(), st = strides();
  sz[w] = e == s ? 0 : (e - s - 1) / step + 1;
  st[w] = strides()[w] * step;
  const ViewInfo info = view_info(ViewKind::Slice, w, s, step);
  return make_view(std::move(sz), std::move(st), storage_offset() + s * strides()[w], "slice", &info);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  const int64_t w = wrap_dim(d, dim(), "narrow");
  EMBER_CHECK(dim() > 0, IndexError, "narrow: cannot narrow a 0-d tensor");
  const int64_t n = sizes()[w];
  const int64_t s = start < 0 ? start + n : start;
  EMBER_CHECK(s >= 0 && s <= n && length >= 0 && length <= n - s, IndexError, "narrow: start ", start, " length ", length,
              " is out of range for dim ", w, " of size ", n, " of ", description());
  return slice(w, s, s + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  EMBER_CHECK(dim() > 0, IndexError, "select: cannot select on a 0-d tensor");
  const int64_t w = wrap_dim(d, dim(), "select");
  const int64_t n = sizes()[w];
  const int64_t i = index < 0 ? index + n : index;
  EMBER_CHECK(i >= 0 && i < n, IndexError, "select: index ", index, " is out of range for dim ", w, " of size ", n);
  Shape sz = sizes(), st = strides();
  const int64_t off = storage_offset() + i * st[w];
  sz.erase(sz.begin() + w);
  st.erase(st.begin() + w);
  const ViewInfo info = view_info(ViewKind::Select, w, i);
  return make_view(std::move(sz), std::move(st), off, "select", &info);
}

Tensor Tensor::expand(const Shape& shape) const {
  EMBER_CHECK(shape.size() >= sizes().size(), ShapeError, "expand: cannot expand ", description(), " to ",
              shape_str(shape), " (fewer dims)");
  const size_t lead = shape.size() - sizes().size();
  Shape sz(shape.size()), st(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      EMBER_CHECK(shape[i] >= 0, ShapeError, "expand: size -1 is not allowed for a new leading dim in ",
                  shape_str(shape));
      sz[i] = shape[i];
      st[i] = 0;
      continue;
    }
    const int64_t old = sizes()[i - lead];
    const int64_t want = shape[i] == -1 ? old : shape[i];
    if (want == old) {
      sz[i] = old;
      st[i] = strides()[i - lead];
    } else {
      EMBER_CHECK(old == 1, ShapeError, "expand: cannot expand ", description(), " to ", shape_str(shape), " (dim ", i,
                  ": ", old, " -> ", want, ")");
      sz[i] = want;
      st[i] = 0;
    }
  }
  return make_view(std::move(sz), std::move(st), storage_offset(), "expand", &kExpandInfo);
}

Tensor Tensor::squeeze() const {
  Shape sz, st;
  for (int64_t i = 0; i < dim(); ++i)
    if (sizes()[i] != 1) {
      sz.push_back(sizes()[i]);
      st.push_back(strides()[i]);
    }
  return make_view(std::move(sz), std::move(st), storage_offset(), "squeeze", &kReshapeInfo);
}

Tensor Tensor::squeeze(int64_t d) const {
  const int64_t w = wrap_dim(d, dim(), "squeeze");
  if (dim() == 0 || sizes()[w] != 1) return alias();
  Shape sz = sizes(), st = strides();
  sz.erase(sz.begin() + w);
  st.erase(st.begin() + w);
  return make_view(std::move(sz), std::move(st), storage_offset(), "squeeze", &kReshapeInfo);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  const int64_t w = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape sz = sizes(), st = strides();
  const int64_t new_stride = w < dim() ? sizes()[w] * strides()[w] : 1;
  sz.insert(sz.begin() + w, 1);
  st.insert(st.begin() + w, new_stride);
  return make_view(std::move(sz), std::move(st), storage_offset(), "unsqueeze", &kReshapeInfo);
}

// ---- data movement ---------------------------------------------------------------------------------------------

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

bool Tensor::is_pinned() const { return impl().storage->pinned(); }

Tensor Tensor::pin_memory() const {
  EMBER_CHECK(device().is_cpu(), DeviceError, "pin_memory: only CPU tensors can be pinned, got ", description());
  if (is_pinned()) return *this;
  Tensor out = empty_pinned(sizes(), dtype());
  NoGradGuard no_grad;
  out.copy_(*this);
  return out;
}

void Tensor::record_stream(memory::StreamId stream) const {
  const StorageImpl& storage = *impl().storage;
  // Ordinary CPU bytes and byte-free meta storage are never touched by a device stream.
  if (storage.allocator() == nullptr || storage.data() == nullptr) return;
  if (storage.device().is_cpu() && !storage.pinned()) return;
  storage.allocator()->record_stream(storage.data(), stream);
}

Tensor Tensor::clone() const {
  Tensor out = empty(sizes(), {dtype(), device()});
  {
    NoGradGuard no_grad;  // the copy is recorded once, below, not as an in-place write into `out`
    out.copy_(*this);
  }
  if (impl().autograd_meta != nullptr) autograd_hooks().record_copy("clone", *this, out);
  return out;
}

Tensor Tensor::to(Device dev) const { return to(dev, dtype()); }
Tensor Tensor::to(DType dt) const { return to(device(), dt); }

Tensor Tensor::to(Device dev, DType dt) const {
  if (dev == device() && dt == dtype()) return *this;
  Tensor out = empty(sizes(), {dt, dev});
  {
    NoGradGuard no_grad;
    out.copy_(*this);
  }
  if (impl().autograd_meta != nullptr) autograd_hooks().record_copy("to", *this, out);
  return out;
}

namespace {

// [first, last] element offsets a view can touch (numel > 0).
std::pair<int64_t, int64_t> element_range(const Tensor& t) {
  int64_t last = t.storage_offset();
  for (int64_t i = 0; i < t.dim(); ++i) last += (t.sizes()[i] - 1) * t.strides()[i];
  return {t.storage_offset(), last};
}

bool has_internal_overlap(const Tensor& t) {
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.sizes()[i] > 1 && t.strides()[i] == 0) return true;
  return false;
}

// Note [Overlapping copies]: copy kernels read and write element by element, so a source that shares bytes with
// the destination under a different layout (a.copy_(a.t()), shifted slices) would read values already overwritten.
// Such a source is first cloned; an identical view is a no-op.
bool needs_staging(const Tensor& src, const Tensor& dst) {
  if (src.storage() != dst.storage()) return false;
  const auto [s0, s1] = element_range(src);
  const auto [d0, d1] = element_range(dst);
  const int64_t sb0 = s0 * src.itemsize(), sb1 = (s1 + 1) * src.itemsize();
  const int64_t db0 = d0 * dst.itemsize(), db1 = (d1 + 1) * dst.itemsize();
  return sb0 < db1 && db0 < sb1;
}

}  // namespace

// Autograd sees in-place writes twice: before (may refuse: a leaf that requires grad, a view of one) and after
// (rewires the destination's history). The copy itself runs without recording anything.
void Tensor::check_inplace_write(const char* op, const Tensor* src) const {
  EMBER_CHECK(!impl().is_inference || InferenceMode::is_enabled(), ValueError, op, ": in-place update of the inference "
              "tensor ", description(), " outside InferenceMode; clone() it inside inference mode or use a normal tensor");
  if (impl().autograd_meta != nullptr || (src != nullptr && src->impl().autograd_meta != nullptr))
    autograd_hooks().check_inplace(op, *this, src);
}

void Tensor::record_inplace_write(const char* op, const Tensor* src) const {
  if (impl().autograd_meta != nullptr || (src != nullptr && src->impl().autograd_meta != nullptr))
    autograd_hooks().record_inplace(op, *this, src);
}

Tensor& Tensor::copy_(const Tensor& src) {
  EMBER_CHECK(src.defined(), ValueError, "copy_: source is an undefined tensor");
  check_inplace_write("copy_", &src);
  {
    NoGradGuard no_grad;
    copy_data(src);
  }
  record_inplace_write("copy_", &src);
  return *this;
}

void Tensor::copy_data(const Tensor& src) const {
  Tensor s = src.expand(sizes());  // ShapeError when src does not broadcast to this shape
  const Device dd = device(), sd = src.device();
  if (numel() == 0 || dd.is_meta()) {
    bump_version();
    return;
  }
  EMBER_CHECK(!has_internal_overlap(*this), ValueError, "copy_: the destination ", description(), " with strides ",
              shape_str(strides()), " has elements that share memory (an expanded view); copy into a clone()");
  EMBER_CHECK(!sd.is_meta(), DeviceError, "copy_: cannot copy data from a meta tensor into ", description());
  bump_version();
  if (dd == sd) {
    if (needs_staging(s, *this)) {  // Note [Overlapping copies]
      if (s.sizes() == sizes() && s.strides() == strides() && s.storage_offset() == storage_offset() &&
          s.dtype() == dtype())
        return;
      s = s.clone();
    }
    copy_stub.get(dd.type)(s, *this);
    return;
  }
  // Across devices. A host source is first made dense in the destination dtype on the host (casting is cheap there
  // and keeps device memory at one copy); bytes then move straight into the destination when it is contiguous, or
  // into one staging buffer that the destination's copy kernel scatters from.
  using memory::cuda::CopyKind;
  EMBER_CHECK((sd.is_cpu() || sd.is_cuda()) && (dd.is_cpu() || dd.is_cuda()), DeviceError,
              "copy_: unsupported copy from ", sd.str(), " to ", dd.str());
  const Tensor dense = sd.is_cpu() ? s.to(dtype()).contiguous() : s.contiguous();
  const CopyKind kind = sd.is_cpu() ? CopyKind::HostToDevice
                        : dd.is_cpu() ? CopyKind::DeviceToHost
                                      : CopyKind::DeviceToDevice;
  const int cuda_index = dd.is_cuda() ? dd.index : sd.index;
  if (dense.dtype() == dtype() && is_contiguous()) {
    memory::cuda::copy_bytes(raw_data(), dense.raw_data(), dense.nbytes(), kind, cuda_index);
    return;
  }
  Tensor staged = empty(sizes(), {dense.dtype(), dd});
  memory::cuda::copy_bytes(staged.raw_data(), dense.raw_data(), dense.nbytes(), kind, cuda_index);
  copy_stub.get(dd.type)(staged, *this);
  return;
}

Tensor& Tensor::fill_(Scalar value) {
  check_inplace_write("fill_", nullptr);
  bump_version();
  if (numel() > 0 && !device().is_meta()) fill_stub.get(device().type)(*this, value);
  record_inplace_write("fill_", nullptr);
  return *this;
}

// ---- autograd members: trivial answers for tensors autograd never saw, else the autograd layer's --------------

bool Tensor::requires_grad() const {
  return impl().autograd_meta != nullptr && autograd_hooks().requires_grad(*this);
}
const Tensor& Tensor::requires_grad_(bool requires_grad) const {
  if (requires_grad || impl().autograd_meta != nullptr) autograd_hooks().set_requires_grad(*this, requires_grad);
  return *this;
}
Tensor Tensor::grad() const { return impl().autograd_meta != nullptr ? autograd_hooks().grad(*this) : Tensor(); }
void Tensor::set_grad(const Tensor& grad) const { autograd_hooks().set_grad(*this, grad); }
bool Tensor::is_leaf() const { return impl().autograd_meta == nullptr || autograd_hooks().is_leaf(*this); }
void Tensor::retain_grad() const { autograd_hooks().retain_grad(*this); }
std::string Tensor::grad_fn_name() const {
  return impl().autograd_meta != nullptr ? autograd_hooks().grad_fn_name(*this) : std::string();
}
void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd_hooks().backward(*this, gradient, retain_graph);
}
Tensor Tensor::detach() const { return make_view(sizes(), strides(), storage_offset(), "detach", nullptr); }

namespace {
const AutogradHooks* g_autograd_hooks = nullptr;
}  // namespace

const AutogradHooks& autograd_hooks() {
  EMBER_CHECK(g_autograd_hooks != nullptr, ValueError, "autograd is not available (its hooks are not installed)");
  return *g_autograd_hooks;
}
bool has_autograd_hooks() { return g_autograd_hooks != nullptr; }
void set_autograd_hooks(const AutogradHooks* hooks) { g_autograd_hooks = hooks; }

template <class T>
std::vector<T> Tensor::to_vector() const {
  EMBER_CHECK(!device().is_meta(), DeviceError, "to_vector: ", description(), " holds no data");
  const Tensor host = to(Device::cpu(), dtype_of_v<T>).contiguous();
  const size_t n = static_cast<size_t>(host.numel());
  if constexpr (std::is_same_v<T, bool>) {  // std::vector<bool> is bit-packed: convert element by element
    const bool* p = static_cast<const bool*>(host.raw_data());
    return std::vector<bool>(p, p + n);
  } else {
    std::vector<T> out(n);
    if (n > 0) std::memcpy(static_cast<void*>(out.data()), host.raw_data(), n * sizeof(T));
    return out;
  }
}

// Note [Reading a meta tensor]: a meta tensor has no values; inside a MetaAllocationScope (a dry run) item() reads
// it as 0, so the control flow of the run (a loss printed, GradScaler's found-inf check, a gradient norm) takes the
// path of finite, unremarkable values instead of throwing — a dry run therefore never clips and never skips a step.
// Outside a scope it refuses (DeviceError), so a state dict or a learning rate read from meta tensors by mistake is
// not silently 0. to_vector always refuses: a whole tensor of made-up values would be mistaken for data.
template <class T>
T Tensor::item() const {
  EMBER_CHECK(numel() == 1, ShapeError, "item: expects a tensor with one element, got ", description());
  if (device().is_meta() && current_meta_allocator() != nullptr) return T(0);
  return to_vector<T>()[0];
}

double Tensor::item_double() const { return item<double>(); }

#define EMBER_INSTANTIATE_TENSOR_ACCESS(T)                 \
  template std::vector<T> Tensor::to_vector<T>() const;    \
  template T Tensor::item<T>() const;
EMBER_INSTANTIATE_TENSOR_ACCESS(float)
EMBER_INSTANTIATE_TENSOR_ACCESS(double)
EMBER_INSTANTIATE_TENSOR_ACCESS(Half)
EMBER_INSTANTIATE_TENSOR_ACCESS(BFloat16)
EMBER_INSTANTIATE_TENSOR_ACCESS(int32_t)
EMBER_INSTANTIATE_TENSOR_ACCESS(int64_t)
EMBER_INSTANTIATE_TENSOR_ACCESS(uint8_t)
EMBER_INSTANTIATE_TENSOR_ACCESS(int8_t)
EMBER_INSTANTIATE_TENSOR_ACCESS(int16_t)
EMBER_INSTANTIATE_TENSOR_ACCESS(bool)
#undef EMBER_INSTANTIATE_TENSOR_ACCESS

}  // namespace ember
