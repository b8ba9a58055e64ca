// Anomaly mode: while on, every recorded forward op and every backward node checks its floating outputs, and the
// first NaN/Inf raises AnomalyError naming the op (the backward node and the forward op that created it) and the
// shapes (Note [Forward anomalies] in anomaly.cpp says which forward Infs are legitimate). Costs a reduction and a
// device sync per op: a debugging tool, off by default.
#pragma once

#include <string>
#include <vector>

#include "ember/base/error.h"
#include "ember/core/tensor.h"

namespace ember::autograd {

class AnomalyError : public Error {
  using Error::Error;
};

struct AnomalyMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// RAII: anomaly mode on (or `enabled`) in its scope; process-wide, like torch.autograd.detect_anomaly.
class DetectAnomalyGuard {
 public:
  explicit DetectAnomalyGuard(bool enabled = true);
  ~DetectAnomalyGuard();
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;

 private:
  bool prev_;
};

// True when a floating tensor holds a NaN or an Inf (integer and bool tensors: false).
bool has_non_finite(const Tensor& t);
bool has_nan(const Tensor& t);

// Raises AnomalyError when a forward output of `op` holds a NaN, or an Inf its finite inputs did not hold.
void check_forward_anomaly(const char* op, std::initializer_list<const Tensor*> inputs, const Tensor& out);

}  // namespace ember::autograd
