// Autocast state (per thread), the published policy table and the cast cache.
// Invariant: the cache holds entries only while an enabled region is open on this thread; an entry is used only for
// the same source tensor at the same version under the same grad mode.
#include "ember/autograd/autocast.h"

#include <unordered_map>

#include "ember/autograd/functions.h"
#include "ember/base/error.h"
#include "ember/core/grad_mode.h"

namespace ember {
namespace {

struct DeviceState {
  bool enabled = false;
  bool cache_enabled = true;
  DType dtype;
};

// Note [Autocast cast cache]
// A parameter used by several ops in one forward (a tied embedding, a weight reused across time steps) would be cast
// once per use; PyTorch caches the lower-precision cast of an f32 leaf that requires grad for the duration of the
// outermost autocast region, and so does ember. The key is the source's TensorImpl; the entry keeps the source alive
// (so the address cannot be reused by another tensor while cached) and is valid only for the source's storage and
// version (an in-place update, like an optimizer step inside the region, or a storage swapped in by set_data makes a
// fresh cast) and under the grad mode it was made
// in (a cast made under no_grad has no history and must not be handed to a recorded op). Casts of non-leaves are never
// cached: they are activations, used once.
struct CacheEntry {
  Tensor source, cast;
  const void* storage = nullptr;  // set_data (Module::to) swaps a parameter's storage and version counter
  int64_t version = 0;
  bool grad_mode = false;
};

struct ThreadState {
  DeviceState devices[kNumDeviceTypes];
  int depth = 0;          // open enabled regions on this thread
  bool in_body = false;   // inside a listed op's body
  std::unordered_map<const TensorImpl*, CacheEntry> cache;
  ThreadState() {
    for (int d = 0; d < kNumDeviceTypes; ++d) devices[d].dtype = autocast::default_dtype(static_cast<DeviceType>(d));
  }
};

ThreadState& state() {
  thread_local ThreadState s;
  return s;
}

DeviceState& device_state(DeviceType t) { return state().devices[static_cast<int>(t)]; }

}  // namespace

const std::vector<AutocastPolicyEntry>& autocast_policy() {
  using C = AutocastCategory;
  static const std::vector<AutocastPolicyEntry> table = {
      {"matmul", C::lower_precision},   {"bmm", C::lower_precision},
      {"linear", C::lower_precision},   {"conv2d", C::lower_precision},
      {"scaled_dot_product_attention", C::lower_precision},
      {"bias_gelu", C::lower_precision},
      {"softmax", C::fp32},             {"log_softmax", C::fp32},
      {"layer_norm", C::fp32},          {"sum", C::fp32},
      {"mean", C::fp32},                {"var", C::fp32},
      {"exp", C::fp32},                 {"log", C::fp32},
      {"pow", C::fp32},                 {"rsqrt", C::fp32},
      {"cross_entropy", C::fp32},       {"nll_loss", C::fp32},
      {"mse_loss", C::fp32},
      {"add", C::promote},              {"sub", C::promote},
      {"mul", C::promote},              {"div", C::promote},
      {"maximum", C::promote},          {"minimum", C::promote},
      {"where", C::promote},
  };
  return table;
}

const char* autocast_category_name(AutocastCategory category) {
  switch (category) {
    case AutocastCategory::lower_precision: return "lower_precision";
    case AutocastCategory::fp32: return "fp32";
    case AutocastCategory::promote: return "promote";
  }
  return "?";
}

AutocastGuard::AutocastGuard(DeviceType device_type, bool enabled, bool cache_enabled)
    : AutocastGuard(device_type, autocast::dtype(device_type), enabled, cache_enabled) {}

AutocastGuard::AutocastGuard(DeviceType device_type, DType dtype, bool enabled, bool cache_enabled)
    : device_type_(device_type) {
  EMBER_CHECK(is_reduced_float(dtype), DTypeError, "autocast: dtype must be f16 or bf16, got ", dtype_name(dtype));
  DeviceState& s = device_state(device_type);
  prev_enabled_ = s.enabled;
  prev_cache_enabled_ = s.cache_enabled;
  prev_dtype_ = s.dtype;
  s.enabled = enabled;
  s.cache_enabled = cache_enabled;
  s.dtype = dtype;
  ++state().depth;
}

AutocastGuard::~AutocastGuard() {
  DeviceState& s = device_state(device_type_);
  s.enabled = prev_enabled_;
  s.cache_enabled = prev_cache_enabled_;
  s.dtype = prev_dtype_;
  if (--state().depth == 0) state().cache.clear();
}

namespace autocast {

bool is_enabled(DeviceType device_type) { return device_state(device_type).enabled; }
DType dtype(DeviceType device_type) { return device_state(device_type).dtype; }
DType default_dtype(DeviceType device_type) { return device_type == DeviceType::CUDA ? DType::f16 : DType::bf16; }
int64_t cache_size() { return static_cast<int64_t>(state().cache.size()); }
void clear_cache() { state().cache.clear(); }

bool should_cast(std::initializer_list<const Tensor*> inputs) {
  ThreadState& s = state();
  if (s.in_body || s.depth == 0) return false;
  for (const Tensor* t : inputs)
    if (t != nullptr && t->defined()) return s.devices[static_cast<int>(t->device().type)].enabled;
  return false;
}

Tensor cast_for(AutocastCategory category, const Tensor& x) {
  if (!x.defined() || !is_floating(x.dtype()) || x.dtype() == DType::f64) return x;
  if (category == AutocastCategory::promote) return x;
  if (category == AutocastCategory::fp32) return is_reduced_float(x.dtype()) ? cast(x, DType::f32) : x;
  const DeviceState& ds = device_state(x.device().type);
  if (x.dtype() == ds.dtype) return x;
  const bool cacheable = ds.cache_enabled && x.dtype() == DType::f32 && x.requires_grad() && x.is_leaf();
  if (!cacheable) return cast(x, ds.dtype);
  ThreadState& s = state();
  const bool grad_mode = GradMode::is_enabled();
  auto it = s.cache.find(x.unsafe_impl());
  if (it != s.cache.end() && it->second.storage == x.storage().get() && it->second.version == x.version() &&
      it->second.grad_mode == grad_mode && it->second.cast.dtype() == ds.dtype)
    return it->second.cast;
  Tensor c = cast(x, ds.dtype);
  s.cache[x.unsafe_impl()] = CacheEntry{x, c, x.storage().get(), x.version(), grad_mode};
  return c;
}

State current_state() {
  State out;
  for (int d = 0; d < kNumDeviceTypes; ++d) {
    const DeviceState& ds = state().devices[d];
    out.enabled[d] = ds.enabled;
    out.cache_enabled[d] = ds.cache_enabled;
    out.dtype[d] = ds.dtype;
  }
  return out;
}

namespace {
void apply(const State& s) {
  for (int d = 0; d < kNumDeviceTypes; ++d) {
    DeviceState& ds = state().devices[d];
    ds.enabled = s.enabled[d];
    ds.cache_enabled = s.cache_enabled[d];
    ds.dtype = s.dtype[d];
  }
}
}  // namespace

StateGuard::StateGuard(const State& s) : prev_(current_state()), prev_depth_(state().depth) {
  using Cache = std::unordered_map<const TensorImpl*, CacheEntry>;
  prev_cache_ = std::make_shared<Cache>(std::move(state().cache));
  state().cache.clear();
  apply(s);
  state().depth = 1;
}

StateGuard::~StateGuard() {
  using Cache = std::unordered_map<const TensorImpl*, CacheEntry>;
  apply(prev_);
  state().depth = prev_depth_;
  state().cache = std::move(*std::static_pointer_cast<Cache>(prev_cache_));
}

BodyGuard::BodyGuard() : prev_(state().in_body) { state().in_body = true; }
BodyGuard::~BodyGuard() { state().in_body = prev_; }

}  // namespace autocast
}  // namespace ember
