// Autocast (torch.autocast): inside an AutocastGuard, the differentiable ops of a device type run in a precision
// chosen per op by a published policy table — f16/bf16 for the matrix products, f32 for the numerically delicate
// ops and every loss, the widest input type for mixed-input ops — by casting their floating inputs (the casts are
// recorded, so gradients flow back to the original dtypes). Note [Autocast policy] lists the table.
// Invariant: autocast state is per thread; a listed op casts its inputs and runs its own body with autocast off (as
// PyTorch redispatches below the Autocast key), so a composite op's inner ops are not cast again; the cast cache
// lives exactly as long as the outermost enabled region of its thread.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "ember/core/tensor.h"

namespace ember {

// Note [Autocast policy]
//   lower precision (floating inputs other than f64 cast to the autocast dtype):
//       matmul, bmm, linear, conv2d, scaled_dot_product_attention
//   fp32 (f16/bf16 inputs cast to f32; the result is f32):
//       softmax, log_softmax, layer_norm, sum, mean, var, exp, log, pow, rsqrt,
//       cross_entropy, nll_loss, mse_loss
//   promote (inputs of different floating dtypes meet at the widest; the kernels' type promotion does this, so
//   autocast adds no cast): add, sub, mul, div, maximum, minimum, where
//   every other op runs in the dtype of its inputs.
// On the CPU, f16/bf16 tensors are stored in half precision and computed in f32 (DESIGN.md §5), so CPU autocast
// changes memory and rounding exactly as on a GPU, with f32 arithmetic inside each kernel. Casts are recorded
// (differentiable), so an f32 parameter used by an f16 matmul receives an f32 gradient.
enum class AutocastCategory { lower_precision, fp32, promote };

struct AutocastPolicyEntry {
  const char* op;
  AutocastCategory category;
};

// The table above, in that order.
const std::vector<AutocastPolicyEntry>& autocast_policy();
const char* autocast_category_name(AutocastCategory category);  // "lower_precision" | "fp32" | "promote"

// RAII autocast region for ops on `device_type` (torch.autocast(device_type, dtype, enabled, cache_enabled)).
// dtype: f16 or bf16 (DTypeError otherwise); the defaults are PyTorch's: f16 for CUDA, bf16 for CPU. Regions nest:
// an inner guard may change the dtype or disable autocast (enabled = false) for its scope, and the previous state
// returns at its end. cache_enabled: within the outermost region, the lower-precision cast of an f32 leaf that
// requires grad (a parameter) is made once and reused by every op (Note [Autocast cast cache]).
class AutocastGuard {
 public:
  explicit AutocastGuard(DeviceType device_type, bool enabled = true, bool cache_enabled = true);
  AutocastGuard(DeviceType device_type, DType dtype, bool enabled = true, bool cache_enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType device_type_;
  bool prev_enabled_, prev_cache_enabled_;
  DType prev_dtype_;
};

namespace autocast {

bool is_enabled(DeviceType device_type);
DType dtype(DeviceType device_type);  // the dtype a region would use (the default when none is open)
DType default_dtype(DeviceType device_type);
// The number of cached casts on this thread (for tests and memory reports) and an explicit clear
// (torch.clear_autocast_cache); the cache is also cleared when the outermost region of the thread ends.
int64_t cache_size();
void clear_cache();

// ---- used by the listed ops' entry points ------------------------------------------------------------------------
// Whether the op must cast: autocast is enabled for the device type of the first defined input and this thread is
// not inside a listed op's body.
bool should_cast(std::initializer_list<const Tensor*> inputs);
// x cast for the category (undefined, non-floating and f64 tensors, and tensors already in the target dtype, are
// returned as they are). lower: the autocast dtype of x's device type, cached for f32 leaves that require grad.
Tensor cast_for(AutocastCategory category, const Tensor& x);

// While alive, should_cast() is false on this thread: a listed op runs its body under it after casting.
class BodyGuard {
 public:
  BodyGuard();
  ~BodyGuard();
  BodyGuard(const BodyGuard&) = delete;
  BodyGuard& operator=(const BodyGuard&) = delete;

 private:
  bool prev_;
};

// This thread's autocast settings for every device type, captured and restored as a whole (activation checkpointing
// re-runs a region during backward with the settings of its first run).
struct State {
  bool enabled[kNumDeviceTypes] = {};
  bool cache_enabled[kNumDeviceTypes] = {};
  DType dtype[kNumDeviceTypes] = {};
};
State current_state();
// RAII: puts `state` in place for its scope with an empty cast cache of its own (casts made inside — of a
// recomputation's fresh inputs — die with it), then restores the previous state and cache.
class StateGuard {
 public:
  explicit StateGuard(const State& state);
  ~StateGuard();
  StateGuard(const StateGuard&) = delete;
  StateGuard& operator=(const StateGuard&) = delete;

 private:
  State prev_;
  int prev_depth_;
  std::shared_ptr<void> prev_cache_;  // the enclosing cache, parked
};

// Shorthands: cast_for(lower_precision, x) and cast_for(fp32, x).
inline Tensor lower(const Tensor& x) { return cast_for(AutocastCategory::lower_precision, x); }
inline Tensor fp32(const Tensor& x) { return cast_for(AutocastCategory::fp32, x); }

}  // namespace autocast

// A listed op's entry (Note [Autocast policy]) reads
//   Tensor matmul(const Tensor& a, const Tensor& b) {
//     if (autocast::should_cast({&a, &b})) {
//       autocast::BodyGuard body;
//       return matmul(autocast::lower(a), autocast::lower(b));
//     }
//     ...

}  // namespace ember
