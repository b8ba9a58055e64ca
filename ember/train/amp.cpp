// Mixed-precision training recipes (amp.h).
// Invariant: per step, gradients are unscaled at most once (unscaled_ is reset by step()), before clipping and the
// update.
#include "ember/train/amp.h"

#include <sstream>
#include <unordered_set>

#include "ember/base/error.h"
#include "ember/memory/allocator.h"
#include "ember/optim/clip_grad.h"

namespace ember::train {

AmpMode parse_amp_mode(const std::string& text) {
  if (text == "none" || text == "fp32") return AmpMode::none;
  if (text == "fp16") return AmpMode::fp16;
  if (text == "bf16") return AmpMode::bf16;
  if (text == "autocast-fp16") return AmpMode::autocast_fp16;
  if (text == "autocast-bf16") return AmpMode::autocast_bf16;
  EMBER_THROW(ConfigError, "unknown mixed-precision mode '", text,
              "' (choose none (also spelled fp32), fp16, bf16, autocast-fp16 or autocast-bf16)");
}

const char* amp_mode_name(AmpMode mode) {
  switch (mode) {
    case AmpMode::none: return "none";
    case AmpMode::fp16: return "fp16";
    case AmpMode::bf16: return "bf16";
    case AmpMode::autocast_fp16: return "autocast-fp16";
    case AmpMode::autocast_bf16: return "autocast-bf16";
  }
  return "?";
}

DType amp_weight_dtype(AmpMode mode) {
  return mode == AmpMode::fp16 ? DType::f16 : mode == AmpMode::bf16 ? DType::bf16 : DType::f32;
}
bool amp_uses_autocast(AmpMode mode) { return mode != AmpMode::none; }
DType amp_autocast_dtype(AmpMode mode) {
  switch (mode) {
    case AmpMode::fp16:
    case AmpMode::autocast_fp16: return DType::f16;
    case AmpMode::bf16:
    case AmpMode::autocast_bf16: return DType::bf16;
    case AmpMode::none: break;
  }
  return DType::f32;
}

std::string MemoryBreakdown::to_string() const {
  std::ostringstream os;
  os << "weights " << memory::format_bytes(weights) << ", grads " << memory::format_bytes(grads);
  if (master_weights) os << ", fp32 masters " << memory::format_bytes(master_weights);
  if (master_grads) os << ", master grads " << memory::format_bytes(master_grads);
  os << ", optimizer state " << memory::format_bytes(optimizer_state);
  if (activations) os << ", activations " << memory::format_bytes(activations);
  return os.str();
}

namespace {

// Sums the bytes of the tensors' storages, each storage once.
class StorageCounter {
 public:
  void add(const Tensor& t) {
    if (t.defined() && seen_.insert(t.storage().get()).second) bytes_ += t.storage()->nbytes();
  }
  int64_t take() {
    const int64_t b = bytes_;
    bytes_ = 0;
    return b;
  }

 private:
  std::unordered_set<const void*> seen_;
  int64_t bytes_ = 0;
};

Device model_device(nn::Module& model) {
  const std::vector<Tensor> params = model.parameters();
  EMBER_CHECK(!params.empty(), ValueError, "AmpTrainer: the model has no parameters");
  return params.front().device();
}

}  // namespace

AmpTrainer::AmpTrainer(nn::Module& model, std::vector<optim::ParamGroup> groups, const optim::OptimizerFactory& make,
                       AmpMode mode, optim::GradScalerOptions scaler)
    : model_(model), mode_(mode), device_type_(model_device(model).type) {
  if (mode == AmpMode::fp16 || mode == AmpMode::bf16) {
    const DType before = model.parameters().front().dtype();
    model.to(amp_weight_dtype(mode));
    optim::MixedPrecisionOptions o;
    o.dtype = amp_weight_dtype(mode);
    o.scaler = scaler;
    try {
      mixed_ = std::make_unique<optim::MixedPrecisionOptimizer>(std::move(groups), make, o);
    } catch (...) {
      model.to(before);  // a refused setup leaves the model as it came
      throw;
    }
    return;
  }
  plain_ = make(std::move(groups));
  EMBER_CHECK(plain_ != nullptr, ValueError, "AmpTrainer: the optimizer factory returned null");
  if (mode == AmpMode::autocast_fp16) scaler_ = std::make_unique<optim::GradScaler>(scaler);
}

AutocastGuard AmpTrainer::autocast() const {
  const DType dtype = amp_uses_autocast(mode_) ? amp_autocast_dtype(mode_) : autocast::dtype(device_type_);
  return AutocastGuard(device_type_, dtype, amp_uses_autocast(mode_));
}

void AmpTrainer::backward(const Tensor& loss) {
  if (mixed_) mixed_->backward(loss);
  else if (scaler_) scaler_->scale(loss).backward();
  else loss.backward();
}

double AmpTrainer::clip_grad_norm_(double max_norm) {
  if (mixed_) {
    if (!unscaled_) mixed_->unscale_();
    unscaled_ = true;
    return optim::clip_grad_norm_(mixed_->master_parameters(), max_norm);
  }
  if (scaler_ && !unscaled_) scaler_->unscale_(*plain_);
  unscaled_ = true;
  return optim::clip_grad_norm_(plain_->parameters(), max_norm);
}

bool AmpTrainer::step() {
  struct ResetUnscaled {  // the next step unscales afresh, also after an optimizer that threw
    bool& flag;
    ~ResetUnscaled() { flag = false; }
  } reset{unscaled_};
  bool taken = true;
  if (mixed_) {
    taken = mixed_->step();
  } else if (scaler_) {
    taken = scaler_->step(*plain_);
    scaler_->update();
  } else {
    plain_->step();
  }
  if (!taken) ++steps_skipped_;
  return taken;
}

void AmpTrainer::zero_grad(bool set_to_none) {
  // Also abandons a step that was unscaled (clip_grad_norm_) but not taken — an OOM between the two, a trial thrown
  // away: the next step's gradients must be unscaled afresh.
  unscaled_ = false;
  if (scaler_) scaler_->discard_step(*plain_);
  if (mixed_) mixed_->zero_grad(set_to_none);
  else plain_->zero_grad(set_to_none);
}

optim::Optimizer& AmpTrainer::optimizer() { return mixed_ ? mixed_->inner() : *plain_; }

double AmpTrainer::loss_scale() const {
  if (mixed_) return mixed_->loss_scale();
  return scaler_ ? scaler_->get_scale() : 1.0;
}

optim::StateDict AmpTrainer::state_dict() const {
  if (mixed_) return mixed_->state_dict();
  optim::StateDict out = plain_->state_dict();
  if (scaler_)
    for (auto& [name, t] : scaler_->state_dict()) out.emplace_back("scaler." + name, t);
  return out;
}

void AmpTrainer::load_state_dict(const optim::StateDict& dict) {
  if (mixed_) return mixed_->load_state_dict(dict);
  optim::StateDict inner, scaler;
  for (const auto& [name, t] : dict) (name.rfind("scaler.", 0) == 0 ? scaler : inner).emplace_back(name, t);
  EMBER_CHECK(scaler_ || scaler.empty(), ValueError, "AmpTrainer::load_state_dict: the dict has loss-scaler entries (",
              scaler.front().first, ") but mode ", amp_mode_name(mode_), " does not scale");
  EMBER_CHECK(!scaler_ || !scaler.empty(), ValueError, "AmpTrainer::load_state_dict: mode ", amp_mode_name(mode_),
              " needs the loss scaler's entries (\"scaler.*\"), the dict has none");
  for (auto& [name, t] : scaler) name = name.substr(7);
  if (scaler_) {
    // Validate both parts before loading either: the scaler's by loading into a copy first.
    optim::GradScaler probe(scaler_->options());
    probe.load_state_dict(scaler);
  }
  plain_->load_state_dict(inner);
  if (scaler_) scaler_->load_state_dict(scaler);
}

optim::StateDict AmpTrainer::scaler_state_dict() const {
  if (mixed_) return mode_ == AmpMode::fp16 ? mixed_->scaler_state_dict() : optim::StateDict{};
  return scaler_ ? scaler_->state_dict() : optim::StateDict{};
}

void AmpTrainer::load_scaler_state_dict(const optim::StateDict& entries) {
  if (mixed_ && mode_ == AmpMode::fp16) return mixed_->load_scaler_state_dict(entries);
  if (scaler_) return scaler_->load_state_dict(entries);
  EMBER_CHECK(entries.empty(), ValueError, "AmpTrainer::load_scaler_state_dict: mode ", amp_mode_name(mode_),
              " has no loss scaler, but ", entries.size(), " entries were given");
}

MemoryBreakdown AmpTrainer::memory() const {
  MemoryBreakdown m;
  if (mixed_) {
    const optim::MixedPrecisionOptimizer::MemoryUse u = mixed_->memory_use();
    m.weights = u.weights;
    m.grads = u.grads;
    m.master_weights = u.master_weights;
    m.master_grads = u.master_grads;
    m.optimizer_state = u.optimizer_state;
    return m;
  }
  StorageCounter count;
  const std::vector<Tensor> params = plain_->parameters();
  for (const Tensor& p : params) count.add(p);
  m.weights = count.take();
  for (const Tensor& p : params) count.add(p.grad());
  m.grads = count.take();
  for (const Tensor& p : params)
    for (const auto& [key, t] : plain_->state(p).entries()) count.add(t);
  m.optimizer_state = count.take();
  return m;
}

}  // namespace ember::train
