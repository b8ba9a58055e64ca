// Anomaly mode flag and the non-finite check.
#include "ember/autograd/anomaly.h"

#include <atomic>
#include <cmath>

#include "ember/core/grad_mode.h"
#include "ember/kernels/ops.h"

namespace ember::autograd {

namespace {
std::atomic<bool> g_anomaly{false};
}  // namespace

bool AnomalyMode::is_enabled() { return g_anomaly.load(std::memory_order_relaxed); }
void AnomalyMode::set_enabled(bool enabled) { g_anomaly.store(enabled, std::memory_order_relaxed); }

DetectAnomalyGuard::DetectAnomalyGuard(bool enabled) : prev_(AnomalyMode::is_enabled()) {
  AnomalyMode::set_enabled(enabled);
}
DetectAnomalyGuard::~DetectAnomalyGuard() { AnomalyMode::set_enabled(prev_); }

bool has_non_finite(const Tensor& t) {
  if (!t.defined() || !is_floating(t.dtype()) || t.numel() == 0 || t.device().is_meta()) return false;
  NoGradGuard no_grad;
  // x * 0 is 0 for finite x and NaN for NaN and +-Inf, so one sum (in f64 for exactness) answers for all elements.
  const double s = ops::sum(ops::mul(t.to(DType::f64), 0.0)).item_double();
  return !std::isfinite(s);
}

bool has_nan(const Tensor& t) {
  if (!t.defined() || !is_floating(t.dtype()) || t.numel() == 0 || t.device().is_meta()) return false;
  NoGradGuard no_grad;
  return ops::sum(ops::ne(t, t).to(DType::f64)).item_double() > 0.0;  // NaN is the only value unequal to itself
}

// Note [Forward anomalies]
// A forward output is an anomaly when it holds a NaN (also one that came in through an input: reported, with a
// remark, since it is about to poison the gradients), or an Inf the op produced from finite inputs (log(0),
// exp overflow). An Inf that was already in an input is legitimate: attention masks fill scores with -inf.
void check_forward_anomaly(const char* op, std::initializer_list<const Tensor*> inputs, const Tensor& out) {
  if (!has_non_finite(out)) return;
  std::string shapes;
  bool input_bad = false;
  for (const Tensor* t : inputs) {
    if (t == nullptr || !t->defined()) continue;
    if (!shapes.empty()) shapes += ", ";
    shapes += t->description();
    input_bad = input_bad || has_non_finite(*t);
  }
  if (input_bad && !has_nan(out)) return;
  EMBER_THROW(AnomalyError, "anomaly: forward op '", op, "' produced NaN or Inf in its output ", out.description(),
              " from inputs (", shapes, ")",
              input_bad ? "; an input was already non-finite (it came from outside the recorded ops)" : "");
}

}  // namespace ember::autograd
