// Tensor factories: empty/zeros/ones/full/arange/rand/randn/from_vector. Data-filling ones go through the device's
// fill, arange and random kernels (core_stubs.h), so they work on every device that registers them.
#include <cmath>
#include <cstring>

#include "ember/core/core_stubs.h"
#include "ember/core/generator.h"
#include "ember/core/grad_mode.h"
#include "ember/core/meta_scope.h"
#include "ember/core/philox.h"
#include "ember/core/tensor.h"
#include "ember/memory/pinned_pool.h"

namespace ember {

EMBER_DEFINE_STUB(copy, CopyFn);
EMBER_DEFINE_STUB(fill, FillFn);
EMBER_DEFINE_STUB(arange, ArangeFn);
EMBER_DEFINE_STUB(random, RandomFn);

Tensor empty(const Shape& shape, TensorOptions opts) {
  return empty_strided(shape, contiguous_strides(shape), opts);
}

namespace {

// Note [Storage source]: every factory funnels through make_dense, which checks the geometry once and takes its
// storage from `make_storage(nbytes)` — the device's allocator (the default), the pinned host pool, or the device's
// allocator for a given stream.
template <class MakeStorage>
Tensor make_dense(const Shape& shape, const Shape& strides, DType dtype, const char* op, MakeStorage&& make_storage) {
  check_sizes(shape, op);
  EMBER_CHECK(shape.size() == strides.size(), ShapeError, op, ": ", shape.size(), " sizes but ", strides.size(),
              " strides");
  int64_t extent = numel_of(shape) == 0 ? 0 : 1;
  for (size_t i = 0; i < shape.size() && extent > 0; ++i) {
    EMBER_CHECK(strides[i] >= 0, ShapeError, op, ": negative stride in ", shape_str(strides));
    int64_t span = 0;
    const bool overflow = __builtin_mul_overflow(shape[i] - 1, strides[i], &span) ||
                          __builtin_add_overflow(extent, span, &extent);
    EMBER_CHECK(!overflow, ShapeError, op, ": shape ", shape_str(shape), " with strides ", shape_str(strides),
                " spans more elements than int64 can count");
  }
  int64_t nbytes = 0;
  EMBER_CHECK(!__builtin_mul_overflow(extent, itemsize(dtype), &nbytes), ShapeError, op, ": ", dtype_name(dtype),
              shape_str(shape), " needs more bytes than int64 can count");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = make_storage(nbytes);
  impl->sizes = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  impl->is_inference = InferenceMode::is_enabled();
  return Tensor(std::move(impl));
}

}  // namespace

Tensor empty_strided(const Shape& shape, const Shape& strides, TensorOptions opts) {
  return make_dense(shape, strides, opts.dtype, "empty",
                    [&](int64_t nbytes) { return std::make_shared<StorageImpl>(nbytes, opts.device); });
}

Tensor empty_pinned(const Shape& shape, DType dtype) {
  return make_dense(shape, contiguous_strides(shape), dtype, "empty_pinned", [&](int64_t nbytes) {
    return std::make_shared<StorageImpl>(nbytes, Device::cpu(), memory::pinned_pool(), memory::StreamId{0}, true);
  });
}

Tensor empty_on_stream(const Shape& shape, TensorOptions opts, memory::StreamId stream) {
  EMBER_CHECK(!opts.device.is_meta(), DeviceError, "empty_on_stream: meta tensors have no stream");
  return make_dense(shape, contiguous_strides(shape), opts.dtype, "empty_on_stream", [&](int64_t nbytes) {
    return std::make_shared<StorageImpl>(nbytes, opts.device, allocator_for(opts.device), stream, false);
  });
}

Tensor meta_placeholder(const Shape& shape, DType dtype) {
  MetaAllocationPause byte_free;
  return empty(shape, {dtype, Device::meta()});
}

Tensor full(const Shape& shape, Scalar value, TensorOptions opts) {
  Tensor t = empty(shape, opts);
  t.fill_(value);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1, opts); }
Tensor empty_like(const Tensor& t) { return empty(t.sizes(), {t.dtype(), t.device()}); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), {t.dtype(), t.device()}); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), {t.dtype(), t.device()}); }
Tensor scalar_tensor(Scalar value, TensorOptions opts) { return full({}, value, opts); }

Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions opts) {
  const double s = start.to_double(), e = end.to_double(), st = step.to_double();
  EMBER_CHECK(st != 0.0, ValueError, "arange: step must be nonzero");
  EMBER_CHECK(std::isfinite(s) && std::isfinite(e) && std::isfinite(st), ValueError, "arange: bounds must be finite");
  EMBER_CHECK((e - s) / st >= 0.0, ValueError, "arange: step ", st, " does not lead from ", s, " to ", e);
  int64_t n;
  if (start.is_integral() && end.is_integral() && step.is_integral()) {
    // Exact length for integer bounds: ceil((end - start) / step) in 128-bit arithmetic.
    const __int128 span = static_cast<__int128>(end.to_int()) - start.to_int(), stp = step.to_int();
    n = static_cast<int64_t>(span / stp + ((span % stp) != 0 ? 1 : 0));
  } else {
    n = static_cast<int64_t>(std::ceil((e - s) / st));
  }
  Tensor t = empty({n}, opts);
  if (n > 0 && !t.device().is_meta()) arange_stub.get(t.device().type)(t, start, step);
  return t;
}

Tensor arange(Scalar end, TensorOptions opts) { return arange(0, end, 1, opts); }
Tensor arange(Scalar start, Scalar end, Scalar step) {
  const bool integral = start.is_integral() && end.is_integral() && step.is_integral();
  return arange(start, end, step, TensorOptions(integral ? DType::i64 : DType::f32));
}
Tensor arange(int64_t end) { return arange(0, end, 1, TensorOptions(DType::i64)); }

namespace {
Tensor random_tensor(const Shape& shape, RandomKind kind, double a, double b, TensorOptions opts, Generator& gen,
                     const char* op) {
  EMBER_CHECK(is_floating(opts.dtype), DTypeError, op, ": needs a floating dtype, got ", dtype_name(opts.dtype));
  Tensor t = empty(shape, opts);
  // A meta tensor draws nothing, so a shape-only planning pass leaves the real run's random stream untouched.
  if (t.numel() == 0 || t.device().is_meta()) return t;
  const uint64_t n = static_cast<uint64_t>(t.numel());
  const uint64_t counters = kind == RandomKind::Uniform ? philox_uniform_counters(n) : philox_normal_counters(n);
  const PhiloxState st = gen.reserve(counters);
  random_stub.get(t.device().type)(t, kind, a, b, st.seed, st.offset);
  return t;
}
}  // namespace

Tensor uniform(const Shape& shape, double low, double high, Generator& gen, TensorOptions opts) {
  EMBER_CHECK(low <= high, ValueError, "uniform: low ", low, " > high ", high);
  return random_tensor(shape, RandomKind::Uniform, low, high, opts, gen, "uniform");
}
Tensor normal(const Shape& shape, double mean, double stddev, Generator& gen, TensorOptions opts) {
  EMBER_CHECK(stddev >= 0.0, ValueError, "normal: stddev must be >= 0, got ", stddev);
  return random_tensor(shape, RandomKind::Normal, mean, stddev, opts, gen, "normal");
}
Tensor rand(const Shape& shape, Generator& gen, TensorOptions opts) { return uniform(shape, 0.0, 1.0, gen, opts); }
Tensor randn(const Shape& shape, Generator& gen, TensorOptions opts) { return normal(shape, 0.0, 1.0, gen, opts); }
Tensor uniform(const Shape& shape, double low, double high, TensorOptions opts) {
  return uniform(shape, low, high, default_generator(), opts);
}
Tensor normal(const Shape& shape, double mean, double stddev, TensorOptions opts) {
  return normal(shape, mean, stddev, default_generator(), opts);
}
Tensor rand(const Shape& shape, TensorOptions opts) { return uniform(shape, 0.0, 1.0, opts); }
Tensor randn(const Shape& shape, TensorOptions opts) { return normal(shape, 0.0, 1.0, opts); }
Tensor full_like(const Tensor& t, Scalar value) { return full(t.sizes(), value, {t.dtype(), t.device()}); }
Tensor rand_like(const Tensor& t) { return rand(t.sizes(), {t.dtype(), t.device()}); }
Tensor randn_like(const Tensor& t) { return randn(t.sizes(), {t.dtype(), t.device()}); }

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opts) {
  check_sizes(shape, "from_vector");
  EMBER_CHECK(numel_of(shape) == static_cast<int64_t>(values.size()), ShapeError, "from_vector: ", values.size(),
              " values do not fill shape ", shape_str(shape));
  Tensor host = empty(shape, {dtype_of_v<T>, Device::cpu()});
  if constexpr (std::is_same_v<T, bool>) {
    bool* p = host.data<bool>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  } else if (!values.empty()) {
    std::memcpy(host.raw_data(), values.data(), values.size() * sizeof(T));
  }
  return host.to(opts.device, opts.dtype);
}

template Tensor from_vector<float>(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor from_vector<Half>(const std::vector<Half>&, const Shape&, TensorOptions);
template Tensor from_vector<BFloat16>(const std::vector<BFloat16>&, const Shape&, TensorOptions);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, TensorOptions);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor from_vector<uint8_t>(const std::vector<uint8_t>&, const Shape&, TensorOptions);
template Tensor from_vector<int8_t>(const std::vector<int8_t>&, const Shape&, TensorOptions);
template Tensor from_vector<int16_t>(const std::vector<int16_t>&, const Shape&, TensorOptions);
template Tensor from_vector<bool>(const std::vector<bool>&, const Shape&, TensorOptions);

Tensor tensor(std::initializer_list<float> values, TensorOptions opts) {
  std::vector<float> v(values);
  const int64_t n = static_cast<int64_t>(v.size());
  return from_vector(v, {n}, opts);
}

}  // namespace ember
