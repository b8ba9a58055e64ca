// Int8 quantization of Linear and Conv2d layers: the "int8" PackedWeight (symmetric per-output-channel int8 weights
// with f32 scales), weight-only or with int8 activations (dynamic per batch, or static from a calibration), and the
// calibration that sets static activation scales. Invariant: a quantized layer holds no f32 weight; its buffers
// "weight_int8" (i8, the weight's shape) and "weight_scale" (f32 [O]) (+ "input_scale", f32 0-d, for Static) are the
// tensors its Int8PackedWeight reads, so to(), state_dict and load_state_dict act on the packed form.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ember/core/grad_mode.h"
#include "ember/nn/layers.h"
#include "ember/nn/packed_weight.h"

namespace ember::nn {

// How a quantized Linear treats its input.
enum class ActivationQuant {
  None,     // f32 (f16/bf16/f64) activations, int8 weights dequantized inside the kernel (ops::int8_weight_linear)
  Dynamic,  // f32 input quantized per batch to int8 (scale max|x| / 127), int8 x int8 -> int32 (int8_dynamic_linear)
  Static,   // as Dynamic with a fixed input scale from calibration (inputs beyond it clamp to +-127)
};
const char* activation_quant_name(ActivationQuant mode);  // "none", "dynamic", "static"

// The "int8" packed weight (Note [Symmetric per-channel int8] in kernels/ops_quant.h). nbytes() = numel (int8) +
// 4 * O (scales) (+ 4 for a static input scale): an f32 [O, K] weight of 4*O*K bytes becomes O*K + 4*O.
class Int8PackedWeight : public PackedWeight {
 public:
  // q, scale (and input_scale for Static, else undefined): the layer's registered buffer handles.
  Int8PackedWeight(Tensor q, Tensor scale, Tensor input_scale, ActivationQuant mode);
  std::string format() const override { return "int8"; }
  Tensor linear(const Tensor& x, const Tensor& bias) const override;
  Tensor conv2d(const Tensor& x, const Tensor& bias, const Conv2dOptions& options) const override;
  Tensor dense() const override;
  int64_t nbytes() const override;

  const Tensor& q() const { return q_; }
  const Tensor& scale() const { return scale_; }
  const Tensor& input_scale() const { return input_scale_; }  // undefined unless Static
  ActivationQuant mode() const { return mode_; }
  // Static: whether input_scale holds a calibrated value (> 0).
  bool calibrated() const;

 private:
  friend class Calibration;
  Tensor q_, scale_, input_scale_;
  ActivationQuant mode_;
  // Note [Calibration]: while a Calibration is open, linear() runs weight-only and records max|x| here.
  mutable bool observing_ = false;
  mutable double observed_max_ = -1.0;  // < 0: no batch seen yet
};

// Replaces the layer's f32 weight by int8 weights + per-output-channel scales (the dense "weight" parameter is
// removed and the member set undefined; the bias stays an f32 parameter). The layer then runs forward in inference
// only (Note [Packed weights are for inference]). ValueError when the layer is already packed (any format) or has
// no weight; the layer is unchanged when an error is raised. Static layers need a calibration before use.
void quantize_int8(Linear& layer, ActivationQuant mode = ActivationQuant::None);
void quantize_int8(Conv2d& layer);  // weight-only
// Back to a dense "weight" parameter (= q * scale, in the scales' dtype: f32 unless Module::to moved the layer to
// another floating dtype; registered after the bias, so it comes second in state_dict); the int8 buffers are removed.
// ValueError unless the layer holds an "int8" packed weight.
void dequantize(Linear& layer);
void dequantize(Conv2d& layer);

// Quantizes every Linear (with linear_mode) and, when convs, every Conv2d in root's tree (root included). Layers
// already packed (a CSR weight, or int8 from an earlier call) are left as they are. Returns the dotted names of the
// layers quantized, in tree order ("" for root itself).
std::vector<std::string> quantize_model(Module& root, ActivationQuant linear_mode = ActivationQuant::None,
                                        bool convs = true);

// Note [Calibration]
// A Static int8 Linear needs the scale of its inputs. While a Calibration over root is open, every Static int8
// Linear in root's tree computes weight-only (f32 activations) and records the running max|x| of its inputs; finish()
// (or the destructor) sets input_scale = max / 127 (1 when every input seen was 0) in each layer that saw at least
// one batch — the others keep their previous input_scale. A Static layer with input_scale 0 (never calibrated, the
// value quantize_int8 registers) raises ValueError when used. Calibrating again starts from a fresh maximum.
// Forward passes need inference mode like any packed layer: the Calibration opens a NoGradGuard for its lifetime.
class Calibration {
 public:
  explicit Calibration(Module& root);  // ValueError when root has no Static int8 Linear
  ~Calibration();
  Calibration(const Calibration&) = delete;
  Calibration& operator=(const Calibration&) = delete;
  // Writes the scales and stops observing; later calls do nothing. Returns the number of layers calibrated.
  int64_t finish();

 private:
  NoGradGuard no_grad_;
  std::vector<std::shared_ptr<Int8PackedWeight>> layers_;
  bool finished_ = false;
};

// Calibration(root), run_batches() (the caller's forward passes over a few batches), finish(). Returns the number of
// layers calibrated.
int64_t calibrate(Module& root, const std::function<void()>& run_batches);

}  // namespace ember::nn
