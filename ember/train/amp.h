// Mixed-precision training recipes behind one object: the optimizer of a model under a precision mode, exposing a
// training loop's steps in order — autocast region for the forward, (scaled) backward, unscale + clip, step (skipped
// on NaN/inf), zero_grad — and the bytes held by role (weights, gradients, fp32 masters, optimizer state).
// Invariant: whatever the mode, clip_grad_norm_ and step see unscaled fp32 gradients, and optimizer() is the
// optimizer whose param groups carry the learning rate (what an LR scheduler drives).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ember/autograd/autocast.h"
#include "ember/nn/module.h"
#include "ember/optim/grad_scaler.h"
#include "ember/optim/mixed_precision.h"

namespace ember::train {

// none:           fp32 weights, no autocast.
// fp16 / bf16:    the model's weights converted to f16/bf16, fp32 masters and optimizer state in a
//                 MixedPrecisionOptimizer (dynamic loss scaling for f16), forward under autocast of that dtype.
// autocast_fp16:  fp32 weights, forward under f16 autocast, GradScaler (PyTorch's usual AMP recipe).
// autocast_bf16:  fp32 weights, forward under bf16 autocast, no scaling.
enum class AmpMode { none, fp16, bf16, autocast_fp16, autocast_bf16 };

// "none" (or "fp32"), "fp16", "bf16", "autocast-fp16", "autocast-bf16"; ConfigError naming the choices otherwise.
AmpMode parse_amp_mode(const std::string& text);
const char* amp_mode_name(AmpMode mode);  // the spelling parse_amp_mode takes
DType amp_weight_dtype(AmpMode mode);     // f16/bf16 for fp16/bf16, else f32
bool amp_uses_autocast(AmpMode mode);
DType amp_autocast_dtype(AmpMode mode);   // f16 or bf16 (f32 for none)

// Bytes held by role at one moment, each storage counted once. activations is filled by the caller that measured
// a forward (bench train: bytes the forward left allocated, i.e. saved for backward, plus its outputs).
struct MemoryBreakdown {
  int64_t weights = 0, grads = 0, master_weights = 0, master_grads = 0, optimizer_state = 0, activations = 0;
  std::string to_string() const;  // "weights 1.2 MiB, grads ..., ..."
};

class AmpTrainer {
 public:
  // Converts the model for fp16/bf16 (Module::to(dtype): the parameter tensors keep their identity, so `groups`
  // may be built before or after) and builds the optimizer from `make` over the groups (or over their fp32 masters).
  AmpTrainer(nn::Module& model, std::vector<optim::ParamGroup> groups, const optim::OptimizerFactory& make,
             AmpMode mode, optim::GradScalerOptions scaler = {});
  AmpTrainer(const AmpTrainer&) = delete;
  AmpTrainer& operator=(const AmpTrainer&) = delete;

  // The region to run the forward (and the loss) in: autocast of the mode's dtype on the model's device type, or a
  // disabled region for none. `AutocastGuard region = trainer.autocast();`
  AutocastGuard autocast() const;
  void backward(const Tensor& loss);          // (loss * scale).backward() where the mode scales
  double clip_grad_norm_(double max_norm);    // unscales (once per step), then clips the fp32 gradients
  bool step();                                // false when skipped for NaN/inf gradients
  void zero_grad(bool set_to_none = true);

  optim::Optimizer& optimizer();              // the one holding "lr"
  AmpMode mode() const { return mode_; }
  double loss_scale() const;                  // 1 where the mode does not scale
  int64_t steps_skipped() const { return steps_skipped_; }
  MemoryBreakdown memory() const;             // activations left 0
  // Everything the trainer's steps change besides the model: the optimizer's state_dict (fp16/bf16: the
  // MixedPrecisionOptimizer's — inner state, fp32 masters, loss scaler), or the plain optimizer's followed by the
  // GradScaler's entries prefixed "scaler." (autocast-fp16). load_state_dict takes one from a trainer of the same
  // mode over the same parameters and validates it before changing anything (ValueError).
  optim::StateDict state_dict() const;
  void load_state_dict(const optim::StateDict& dict);
  // The loss scaler's state alone (GradScaler::state_dict's names; empty where the mode does not scale), and loading
  // it in place — for snapshots that restore the optimizer's tensors themselves (train/batch_finder.h).
  optim::StateDict scaler_state_dict() const;
  void load_scaler_state_dict(const optim::StateDict& entries);

 private:
  nn::Module& model_;
  AmpMode mode_;
  DeviceType device_type_;
  std::unique_ptr<optim::Optimizer> plain_;               // none / autocast modes
  std::unique_ptr<optim::GradScaler> scaler_;             // autocast_fp16
  std::unique_ptr<optim::MixedPrecisionOptimizer> mixed_;  // fp16 / bf16
  bool unscaled_ = false;
  int64_t steps_skipped_ = 0;
};

}  // namespace ember::train
