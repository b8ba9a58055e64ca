// Front ends of the fused in-place optimizer updates (sgd_step_, adam_step_) and their dispatch stubs.
// Invariant: a kernel is reached only with tensors laid out as kernels/stubs.h promises (one device, param's shape,
// contiguous, state dtype = optimizer_state_dtype(param dtype), no overlap), and every tensor it writes has its
// version counter bumped, since kernels write raw memory.
#include "ember/core/grad_mode.h"
#include "ember/kernels/ops.h"

namespace ember {

EMBER_DEFINE_STUB(sgd_step, SgdStepFn);
EMBER_DEFINE_STUB(adam_step, AdamStepFn);
EMBER_DEFINE_STUB(adam_step_multi, AdamStepMultiFn);

namespace ops {

DType optimizer_state_dtype(DType param_dtype) { return param_dtype == DType::f64 ? DType::f64 : DType::f32; }

namespace {

// Whether two contiguous tensors share bytes of one storage.
bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.storage().get() != b.storage().get() || a.numel() == 0 || b.numel() == 0) return false;
  const int64_t a0 = a.storage_offset() * a.itemsize(), a1 = a0 + a.nbytes();
  const int64_t b0 = b.storage_offset() * b.itemsize(), b1 = b0 + b.nbytes();
  return a0 < b1 && b0 < a1;
}

void check_param(const char* op, const Tensor& param, const Tensor& grad) {
  EMBER_CHECK(param.defined(), ValueError, op, ": param is an undefined tensor");
  EMBER_CHECK(grad.defined(), ValueError, op, ": grad is an undefined tensor (parameters without a grad are skipped "
              "by the optimizer, not passed here)");
  check_floating(op, param);
  EMBER_CHECK(grad.dtype() == param.dtype(), DTypeError, op, ": grad dtype must match the parameter, got param ",
              param.description(), " and grad ", grad.description());
  EMBER_CHECK(grad.sizes() == param.sizes(), ShapeError, op, ": grad shape must match the parameter, got param ",
              param.description(), " and grad ", grad.description());
  EMBER_CHECK(!(GradMode::is_enabled() && param.requires_grad()), ValueError, op, ": in-place update of ",
              param.description(), ", which requires grad, while grad mode is on; run optimizer steps under "
              "NoGradGuard");
  EMBER_CHECK(!param.is_inference() || InferenceMode::is_enabled(), ValueError, op, ": in-place update of the "
              "inference tensor ", param.description(), " outside InferenceMode");
}

void check_state(const char* op, const char* name, const Tensor& state, const Tensor& param) {
  EMBER_CHECK(state.defined(), ValueError, op, ": ", name, " is an undefined tensor");
  const DType want = optimizer_state_dtype(param.dtype());
  EMBER_CHECK(state.dtype() == want, DTypeError, op, ": ", name, " must be ", dtype_name(want), " for a ",
              dtype_name(param.dtype()), " parameter, got ", state.description());
  EMBER_CHECK(state.sizes() == param.sizes(), ShapeError, op, ": ", name, " shape must match the parameter, got param ",
              param.description(), " and ", name, " ", state.description());
}

void check_contiguous(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
  for (const auto& [name, t] : ts) {
    if (!t->defined()) continue;
    EMBER_CHECK(t->is_contiguous(), ValueError, op, ": ", name, " must be contiguous, got ", t->description(),
                " with strides ", shape_str(t->strides()), "; the optimizer passes contiguous copies");
  }
  for (auto i = ts.begin(); i != ts.end(); ++i)
    for (auto j = i + 1; j != ts.end(); ++j) {
      if (!i->second->defined() || !j->second->defined()) continue;
      EMBER_CHECK(!overlaps(*i->second, *j->second), ValueError, op, ": ", i->first, " and ", j->first,
                  " share memory");
    }
}

}  // namespace

void sgd_step_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p) {
  const char* op = "sgd_step_";
  check_param(op, param, grad);
  const bool use_momentum = p.momentum != 0.0;
  EMBER_CHECK(!p.nesterov || (p.momentum > 0.0 && p.dampening == 0.0), ValueError, op,
              ": nesterov momentum requires a momentum > 0 and zero dampening");
  const Tensor buf = use_momentum ? momentum_buf : Tensor();
  if (use_momentum) check_state(op, "momentum_buf", buf, param);
  const Device device = common_device(op, {&param, &grad, &buf});
  check_contiguous(op, {{"param", &param}, {"grad", &grad}, {"momentum_buf", &buf}});
  const bool run = param.numel() > 0 && !device.is_meta();
  const SgdStepFn fn = run ? sgd_step_stub.get(device.type) : nullptr;
  param.bump_version();
  if (use_momentum) buf.bump_version();
  if (run) fn(param, grad, buf, p);
}

namespace {

// adam_step_'s checks; returns the operands' device.
Device check_adam(const char* op, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                  const Tensor& exp_avg_sq, const AdamParams& p) {
  check_param(op, param, grad);
  EMBER_CHECK(p.step >= 1, ValueError, op, ": step counts from 1, got ", p.step);
  check_state(op, "exp_avg", exp_avg, param);
  check_state(op, "exp_avg_sq", exp_avg_sq, param);
  const Device device = common_device(op, {&param, &grad, &exp_avg, &exp_avg_sq});
  check_contiguous(op, {{"param", &param}, {"grad", &grad}, {"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}});
  return device;
}

void bump_adam_versions(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  param.bump_version();
  exp_avg.bump_version();
  exp_avg_sq.bump_version();
}

}  // namespace

void adam_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamParams& p) {
  const Device device = check_adam("adam_step_", param, grad, exp_avg, exp_avg_sq, p);
  const bool run = param.numel() > 0 && !device.is_meta();
  const AdamStepFn fn = run ? adam_step_stub.get(device.type) : nullptr;
  bump_adam_versions(param, exp_avg, exp_avg_sq);
  if (run) fn(param, grad, exp_avg, exp_avg_sq, p);
}

// Note [Multi-tensor Adam]
// A model's step updates every parameter with the same elementwise formula; one launch per parameter costs a few
// microseconds of launch latency each (148 launches for GPT-2 124M) and leaves the GPU idle between small tensors. The
// multi-tensor kernel takes a table of entries (pointers, sizes and each entry's coefficients: learning rates and step
// counts may differ per parameter group) and updates a few dozen tensors per launch, each element with the same
// optim_math.h formula as the single-tensor kernels, so results are identical to one adam_step_ per entry. A tensor
// too large for a table entry's fixed share of blocks (above 256 Ki elements on CUDA) gets a launch of its own on the
// single-tensor kernel's full grid. Every entry is checked before any is updated, so a bad entry leaves all
// parameters untouched.
void adam_step_multi_(const std::vector<AdamStepEntry>& entries) {
  const char* op = "adam_step_multi_";
  std::vector<Device> devices;
  devices.reserve(entries.size());
  for (const AdamStepEntry& e : entries)
    devices.push_back(check_adam(op, e.param, e.grad, e.exp_avg, e.exp_avg_sq, e.p));
  // Group the runnable entries by (device, dtype), in first-appearance order; each group goes to the device's
  // multi-tensor kernel when it has one, else entry by entry to adam_step's.
  std::vector<std::vector<AdamStepEntry>> groups;
  std::vector<std::pair<Device, DType>> keys;
  for (size_t i = 0; i < entries.size(); ++i) {
    const AdamStepEntry& e = entries[i];
    bump_adam_versions(e.param, e.exp_avg, e.exp_avg_sq);
    if (e.param.numel() == 0 || devices[i].is_meta()) continue;
    const std::pair<Device, DType> key{devices[i], e.param.dtype()};
    size_t g = 0;
    while (g < keys.size() && keys[g] != key) ++g;
    if (g == keys.size()) {
      keys.push_back(key);
      groups.emplace_back();
    }
    groups[g].push_back(e);
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const DeviceType type = keys[g].first.type;
    if (adam_step_multi_stub.has(type)) {
      adam_step_multi_stub.get(type)(groups[g]);
      continue;
    }
    const AdamStepFn fn = adam_step_stub.get(type);
    for (const AdamStepEntry& e : groups[g]) fn(e.param, e.grad, e.exp_avg, e.exp_avg_sq, e.p);
  }
}

}  // namespace ops
}  // namespace ember
