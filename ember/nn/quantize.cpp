// Int8 quantization of layers (quantize.h): packing / unpacking Linear and Conv2d weights into "weight_int8" and
// "weight_scale" buffers, the Int8PackedWeight forward paths, and calibration of static activation scales.
// Invariant: packing checks and computes everything before it touches the layer, so a failed call leaves it as it was.
#include "ember/nn/quantize.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "ember/kernels/ops.h"
#include "ember/kernels/ops_quant.h"

namespace ember::nn {

const char* activation_quant_name(ActivationQuant mode) {
  switch (mode) {
    case ActivationQuant::None: return "none";
    case ActivationQuant::Dynamic: return "dynamic";
    case ActivationQuant::Static: return "static";
  }
  return "?";
}

// ---- Int8PackedWeight ---------------------------------------------------------------------------------------------

Int8PackedWeight::Int8PackedWeight(Tensor q, Tensor scale, Tensor input_scale, ActivationQuant mode)
    : q_(std::move(q)), scale_(std::move(scale)), input_scale_(std::move(input_scale)), mode_(mode) {
  EMBER_CHECK(mode_ != ActivationQuant::Static || input_scale_.defined(), ValueError,
              "Int8PackedWeight: static activation quantization needs an input_scale tensor");
}

bool Int8PackedWeight::calibrated() const {
  return input_scale_.defined() && input_scale_.numel() == 1 && input_scale_.item_double() > 0.0;
}

Tensor Int8PackedWeight::linear(const Tensor& x, const Tensor& bias) const {
  EMBER_CHECK(q_.dim() == 2, ValueError, "int8 packed weight ", shape_str(q_.sizes()),
              " belongs to a Conv2d: it has no linear");
  switch (mode_) {
    case ActivationQuant::None: return ops::int8_weight_linear(x, q_, scale_, bias);
    case ActivationQuant::Dynamic: return ops::int8_dynamic_linear(x, q_, scale_, bias);
    case ActivationQuant::Static: break;
  }
  if (observing_) {  // Note [Calibration]
    if (x.numel() > 0) {
      const double m = ops::amax(ops::abs(x.detach())).item_double();
      EMBER_CHECK(std::isfinite(m), ValueError, "calibration: a Linear input ", x.description(),
                  " holds a non-finite value");
      observed_max_ = std::max(observed_max_, m);
    }
    return ops::int8_weight_linear(x, q_, scale_, bias);
  }
  EMBER_CHECK(calibrated(), ValueError, "Linear(in_features=", q_.size(1), ", out_features=", q_.size(0),
              ") has static int8 activation quantization but no calibrated input scale: run nn::calibrate(model, "
              "batches) (or an nn::Calibration) over a few batches first");
  return ops::int8_dynamic_linear(x, q_, scale_, bias, static_cast<float>(input_scale_.item_double()));
}

Tensor Int8PackedWeight::conv2d(const Tensor& x, const Tensor& bias, const Conv2dOptions& options) const {
  EMBER_CHECK(q_.dim() == 4, ValueError, "int8 packed weight ", shape_str(q_.sizes()),
              " belongs to a Linear: it has no conv2d");
  const Conv2dParams p = options.params();
  if (x.dim() == 3) return ops::int8_weight_conv2d(x.unsqueeze(0), q_, scale_, bias, p).squeeze(0);  // [C, H, W]
  return ops::int8_weight_conv2d(x, q_, scale_, bias, p);
}

Tensor Int8PackedWeight::dense() const { return ops::dequantize_per_channel(q_, scale_, DType::f32); }

int64_t Int8PackedWeight::nbytes() const {
  return q_.nbytes() + scale_.nbytes() + (input_scale_.defined() ? input_scale_.nbytes() : 0);
}

// ---- packing and unpacking ----------------------------------------------------------------------------------------
namespace {

void check_packable(const char* layer, const Tensor& weight, const std::shared_ptr<PackedWeight>& packed) {
  EMBER_CHECK(!packed, ValueError, "quantize_int8: the ", layer, " already holds a packed '", packed->format(),
              "' weight (dequantize / unpack it first)");
  EMBER_CHECK(weight.defined(), ValueError, "quantize_int8: the ", layer, " has no weight");
}

QuantizedPerChannel quantize_weight(const Tensor& weight) {
  NoGradGuard no_grad;
  return ops::quantize_per_channel_symmetric(weight.detach());
}

// Swaps `weight` for the buffers of its quantized form qw in `m` (nothing here can fail).
std::shared_ptr<Int8PackedWeight> install(Module& m, Tensor& weight, const QuantizedPerChannel& qw,
                                          ActivationQuant mode) {
  const Device device = weight.device();
  m.remove_parameter("weight");
  weight = Tensor();
  Tensor q = m.register_buffer("weight_int8", qw.q);
  Tensor scale = m.register_buffer("weight_scale", qw.scale);
  Tensor input_scale;
  if (mode == ActivationQuant::Static) {
    input_scale = m.register_buffer("input_scale", zeros({}, TensorOptions(DType::f32, device)));  // uncalibrated
  }
  return std::make_shared<Int8PackedWeight>(q, scale, input_scale, mode);
}

std::shared_ptr<Int8PackedWeight> int8_of(const char* layer, const std::shared_ptr<PackedWeight>& packed) {
  auto p = std::dynamic_pointer_cast<Int8PackedWeight>(packed);
  EMBER_CHECK(p != nullptr, ValueError, "dequantize: the ", layer, " holds ",
              packed ? "a packed '" + packed->format() + "' weight" : std::string("a dense weight"),
              ", not an int8 one");
  return p;
}

Tensor unpack(Module& m, const Int8PackedWeight& p) {
  // In the scale's dtype: a layer moved to f64 (or f16) by Module::to gets its weight back in that dtype.
  Tensor w = ops::dequantize_per_channel(p.q(), p.scale(), p.scale().dtype());
  m.remove_buffer("weight_int8");
  m.remove_buffer("weight_scale");
  if (p.mode() == ActivationQuant::Static) m.remove_buffer("input_scale");
  return m.register_parameter("weight", w);
}

}  // namespace

void quantize_int8(Linear& layer, ActivationQuant mode) {
  check_packable("Linear", layer.weight, layer.packed_weight);
  layer.packed_weight = install(layer, layer.weight, quantize_weight(layer.weight), mode);
}

void quantize_int8(Conv2d& layer) {
  check_packable("Conv2d", layer.weight, layer.packed_weight);
  layer.packed_weight = install(layer, layer.weight, quantize_weight(layer.weight), ActivationQuant::None);
}

void dequantize(Linear& layer) {
  const auto p = int8_of("Linear", layer.packed_weight);
  layer.weight = unpack(layer, *p);
  layer.packed_weight.reset();
}

void dequantize(Conv2d& layer) {
  const auto p = int8_of("Conv2d", layer.packed_weight);
  layer.weight = unpack(layer, *p);
  layer.packed_weight.reset();
}

std::vector<std::string> quantize_model(Module& root, ActivationQuant linear_mode, bool convs) {
  // All or nothing: every weight is quantized (the step that can fail: a non-finite weight) before any layer changes.
  struct Target {
    std::string name;
    Module* module;
    Tensor* weight;
    std::shared_ptr<PackedWeight>* packed;
    ActivationQuant mode;
    QuantizedPerChannel qw;
  };
  std::vector<Target> targets;
  std::unordered_set<const Module*> seen;  // a layer shared in the tree is listed once per path: quantize it once
  for (const auto& [name, m] : root.named_modules()) {
    if (!seen.insert(m.get()).second) continue;
    if (auto* lin = dynamic_cast<Linear*>(m.get())) {
      if (lin->packed_weight || !lin->weight.defined()) continue;
      targets.push_back({name, lin, &lin->weight, &lin->packed_weight, linear_mode, quantize_weight(lin->weight)});
    } else if (auto* conv = dynamic_cast<Conv2d*>(m.get()); conv && convs) {
      if (conv->packed_weight || !conv->weight.defined()) continue;
      targets.push_back(
          {name, conv, &conv->weight, &conv->packed_weight, ActivationQuant::None, quantize_weight(conv->weight)});
    }
  }
  std::vector<std::string> names;
  for (Target& t : targets) {
    *t.packed = install(*t.module, *t.weight, t.qw, t.mode);
    names.push_back(t.name);
  }
  return names;
}

// ---- calibration ---------------------------------------------------------------------------------------------------

Calibration::Calibration(Module& root) {
  for (const auto& [name, m] : root.named_modules()) {
    auto* lin = dynamic_cast<Linear*>(m.get());
    if (lin == nullptr) continue;
    auto p = std::dynamic_pointer_cast<Int8PackedWeight>(lin->packed_weight);
    if (!p || p->mode() != ActivationQuant::Static) continue;
    if (std::find(layers_.begin(), layers_.end(), p) != layers_.end()) continue;  // a layer shared in the tree
    layers_.push_back(p);
  }
  EMBER_CHECK(!layers_.empty(), ValueError, "Calibration: ", root.type_name(),
              " has no Linear with static int8 activation quantization (quantize_int8(layer, "
              "ActivationQuant::Static) first)");
  for (const auto& p : layers_) {
    p->observing_ = true;
    p->observed_max_ = -1.0;
  }
}

Calibration::~Calibration() {
  try {
    finish();
  } catch (...) {  // a destructor must not throw; finish() only fails on a broken scale tensor
  }
}

int64_t Calibration::finish() {
  if (finished_) return 0;
  finished_ = true;
  int64_t n = 0;
  for (const auto& p : layers_) {
    p->observing_ = false;
    if (p->observed_max_ < 0.0) continue;  // saw no batch: keeps its previous scale
    float s = static_cast<float>(p->observed_max_) / 127.0f;
    if (!(s > 0.0f)) s = 1.0f;  // every input was 0 (Note [Symmetric per-channel int8])
    p->input_scale_.fill_(s);
    ++n;
  }
  return n;
}

int64_t calibrate(Module& root, const std::function<void()>& run_batches) {
  Calibration c(root);
  run_batches();
  return c.finish();
}

}  // namespace ember::nn
