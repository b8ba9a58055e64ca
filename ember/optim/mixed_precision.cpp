// MixedPrecisionOptimizer: f16/bf16 model weights stepped through fp32 masters by any inner optimizer, with the fused
// unscale (model gradient -> master gradient, NaN/inf check) and dynamic loss scale of kernels/ops.h.
// Invariant: masters_[i] is the fp32 master of params_[i]; after a step that was not skipped every weight equals its
// master rounded, and a skipped step writes no weight, master or inner state (Note [Mixed-precision memory]).
#include "ember/optim/mixed_precision.h"

#include <set>
#include <string>

#include "ember/autograd/functions.h"
#include "ember/core/grad_mode.h"
#include "ember/kernels/ops.h"
#include "ember/memory/tags.h"

namespace ember::optim {

namespace {
constexpr const char* kWho = "MixedPrecisionOptimizer";

// Whether the loss is scaled: f16 weights with the scaler enabled (bf16 has fp32's exponent range: no scaling).
bool uses_scaling(const MixedPrecisionOptions& o) { return o.dtype == DType::f16 && o.scaler.enabled; }

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// "<digits>" -> index; false for anything else (empty, signs, more than 18 digits).
bool parse_index(const std::string& s, int64_t& index) {
  if (s.empty() || s.size() > 18) return false;
  index = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    index = index * 10 + (c - '0');
  }
  return true;
}
}  // namespace

MixedPrecisionOptimizer::MixedPrecisionOptimizer(std::vector<Tensor> params, const OptimizerFactory& make_optimizer,
                                                 MixedPrecisionOptions options)
    : MixedPrecisionOptimizer(std::vector<ParamGroup>{ParamGroup{std::move(params)}}, make_optimizer, options) {}

MixedPrecisionOptimizer::MixedPrecisionOptimizer(std::vector<ParamGroup> groups,
                                                 const OptimizerFactory& make_optimizer,
                                                 MixedPrecisionOptions options)
    : options_(options) {
  EMBER_CHECK(is_reduced_float(options_.dtype), ValueError, kWho,
              ": dtype must be f16 or bf16, got ", dtype_name(options_.dtype));
  if (uses_scaling(options_)) detail::check_scaler_options(kWho, options_.scaler);
  EMBER_CHECK(make_optimizer != nullptr, ValueError, kWho, ": no optimizer factory");
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);  // the f32 masters are optimizer state
  NoGradGuard no_grad;
  std::set<const TensorImpl*> seen;
  std::vector<ParamGroup> master_groups;
  for (const ParamGroup& group : groups) {
    ParamGroup mg{{}, group.options};
    for (const Tensor& p : group.params) {
      const size_t i = params_.size();
      EMBER_CHECK(p.defined(), ValueError, kWho, ": parameter ", i, " is an undefined tensor");
      EMBER_CHECK(p.dtype() == options_.dtype, DTypeError, kWho, ": parameter ", i, " is ", p.description(),
                  " but the optimizer was set up for ", dtype_name(options_.dtype), " weights (convert the model "
                  "with Module::to(DType), or pass options.dtype)");
      EMBER_CHECK(p.requires_grad() && p.is_leaf(), ValueError, kWho, ": parameter ", i, " (", p.description(),
                  ") must be a leaf that requires grad");
      EMBER_CHECK(seen.insert(p.unsafe_impl()).second, ValueError, kWho, ": parameter ", i, " (",
                  p.description(), ") appears more than once");
      EMBER_CHECK(params_.empty() || p.device() == params_.front().device(), DeviceError, kWho,
                  ": parameters on two devices (", params_.empty() ? p.description() : params_.front().description(),
                  " and ", p.description(), ")");
      Tensor master = p.detach().to(DType::f32);
      master.requires_grad_(true);
      params_.push_back(p);
      masters_.push_back(master);
      mg.params.push_back(master);
    }
    master_groups.push_back(std::move(mg));
  }
  EMBER_CHECK(!params_.empty(), ValueError, kWho, ": got an empty parameter list");
  inner_ = make_optimizer(std::move(master_groups));
  EMBER_CHECK(inner_ != nullptr, ValueError, kWho, ": the optimizer factory returned null");
  const Device device = params_.front().device();
  const double init = uses_scaling(options_) ? options_.scaler.init_scale : 1.0;
  scale_ = full({1}, init, TensorOptions(DType::f32, device));
  growth_tracker_ = zeros({1}, TensorOptions(DType::i32, device));
  found_inf_ = zeros({1}, TensorOptions(DType::f32, device));
  inv_scale_ = ones({1}, TensorOptions(DType::f32, device));
}

Tensor MixedPrecisionOptimizer::scale_loss(const Tensor& loss) {
  EMBER_CHECK(loss.defined(), ValueError, kWho, "::scale_loss: loss is an undefined tensor");
  if (!uses_scaling(options_)) return loss;
  // As GradScaler::scale: the f32 scale promotes an f16 loss to f32, and a 0-d loss stays 0-d.
  const Tensor s = scale_.to(loss.device());
  return ember::mul(loss, loss.dim() == 0 ? s.view({}) : s);
}

void MixedPrecisionOptimizer::backward(const Tensor& loss) { scale_loss(loss).backward(); }

void MixedPrecisionOptimizer::unscale_() {
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);
  EMBER_CHECK(!unscaled_, ValueError, kWho, "::unscale_: unscale_() has already been called since the last step()");
  NoGradGuard no_grad;
  found_inf_.zero_();
  if (uses_scaling(options_)) {
    const Device d = scale_.device();
    inv_scale_.copy_(ops::div(ones({1}, TensorOptions(DType::f64, d)), ops::cast(scale_, DType::f64)));
  }
  // Note [Mixed-precision memory]: fused calls over batches of at most kUnscaleBatchBytes of master gradients; each
  // batch's f16/bf16 gradients are freed right after it, so the f32 master gradients replace them batch by batch.
  constexpr int64_t kUnscaleBatchBytes = 16 << 20;
  std::vector<Tensor> grads, outs;
  std::vector<size_t> index;
  int64_t batch_bytes = 0;
  auto flush = [&] {
    if (grads.empty()) return;
    ops::amp_unscale_(grads, found_inf_, inv_scale_, outs);
    for (size_t k = 0; k < index.size(); ++k) {
      masters_[index[k]].set_grad(outs[k]);
      params_[index[k]].set_grad(Tensor());
    }
    grads.clear();
    outs.clear();
    index.clear();
    batch_bytes = 0;
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = params_[i].grad();
    const Tensor& master = masters_[i];
    if (!g.defined()) {
      master.set_grad(Tensor());  // no model gradient: no master gradient, so the inner optimizer skips it
      continue;
    }
    Tensor mg = master.grad();  // reused when zero_grad(false) kept it
    if (!mg.defined() || !mg.is_contiguous()) mg = empty(master.sizes(), TensorOptions(DType::f32, master.device()));
    grads.push_back(g);
    outs.push_back(mg);
    index.push_back(i);
    batch_bytes += mg.nbytes();
    if (batch_bytes >= kUnscaleBatchBytes) flush();
  }
  flush();
  unscaled_ = true;
}

bool MixedPrecisionOptimizer::step() {
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);
  if (!unscaled_) unscale_();
  // Whatever happens below (an inner optimizer that throws), the next step starts with a fresh unscale_ of the next
  // backward's gradients: this step's model gradients were consumed above.
  struct ResetUnscaled {
    bool& flag;
    ~ResetUnscaled() { flag = false; }
  } reset{unscaled_};
  const bool found = found_inf_.item_double() != 0.0;  // the one host sync of a step
  if (!found) {
    inner_->step();
    NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(masters_[i]);  // round to f16/bf16
  }
  if (uses_scaling(options_))
    ops::amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.scaler.growth_factor,
                           options_.scaler.backoff_factor, options_.scaler.growth_interval);
  last_skipped_ = found;
  if (found) ++steps_skipped_;
  return !found;
}

void MixedPrecisionOptimizer::zero_grad(bool set_to_none) {
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);
  unscaled_ = false;  // cleared gradients: whatever was unscaled is gone, the next step unscales afresh
  inner_->zero_grad(set_to_none);  // the inner optimizer's parameters are the masters
  NoGradGuard no_grad;
  for (const Tensor& p : params_) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else g.zero_();
  }
}

const Tensor& MixedPrecisionOptimizer::master_of(const Tensor& param) const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].unsafe_impl() == param.unsafe_impl()) return masters_[i];
  EMBER_THROW(ValueError, kWho, "::master_of: ", param.defined() ? param.description() : std::string("an undefined "
              "tensor"), " is not a parameter of this optimizer");
}

double MixedPrecisionOptimizer::loss_scale() const {
  return uses_scaling(options_) ? scale_.item_double() : 1.0;
}

MixedPrecisionOptimizer::MemoryUse MixedPrecisionOptimizer::memory_use() const {
  MemoryUse use;
  std::set<const void*> seen;
  auto count = [&](const Tensor& t, int64_t& field) {
    if (t.defined() && seen.insert(t.storage().get()).second) field += t.storage()->nbytes();
  };
  for (const Tensor& p : params_) count(p, use.weights);
  for (const Tensor& p : params_) count(p.grad(), use.grads);
  for (const Tensor& m : masters_) count(m, use.master_weights);
  for (const Tensor& m : masters_) count(m.grad(), use.master_grads);
  for (const Tensor& m : masters_)
    for (const auto& [key, t] : inner_->state(m).entries()) count(t, use.optimizer_state);
  return use;
}

StateDict MixedPrecisionOptimizer::state_dict() const {
  StateDict out = inner_->state_dict();
  for (size_t i = 0; i < masters_.size(); ++i) out.emplace_back("master." + std::to_string(i), masters_[i]);
  const int64_t tracker = growth_tracker_.item<int32_t>();
  for (auto& entry : detail::scaler_state_dict(loss_scale(), tracker, options_.scaler, "scaler."))
    out.push_back(std::move(entry));
  return out;
}

// Takes a parsed scaler state: its growth/backoff options (keeping whether scaling is on) and, where this optimizer
// scales, the scale and growth tracker written in place.
void MixedPrecisionOptimizer::apply_scaler_state(const detail::ScalerState& s) {
  NoGradGuard no_grad;
  const bool enabled = options_.scaler.enabled;
  options_.scaler = s.options;
  options_.scaler.enabled = enabled;
  if (uses_scaling(options_)) {
    scale_.fill_(s.scale);
    growth_tracker_.fill_(s.growth_tracker);
  }
}

StateDict MixedPrecisionOptimizer::scaler_state_dict() const {
  return detail::scaler_state_dict(loss_scale(), growth_tracker_.item<int32_t>(), options_.scaler, "");
}

void MixedPrecisionOptimizer::load_scaler_state_dict(const StateDict& entries) {
  const std::string who = std::string(kWho) + "::load_scaler_state_dict";
  const detail::ScalerState s = detail::parse_scaler_state(who.c_str(), entries);
  apply_scaler_state(s);
}

void MixedPrecisionOptimizer::load_state_dict(const StateDict& dict) {
  memory::PhaseScope optimizer_phase(memory::Phase::Optimizer);
  const std::string who = std::string(kWho) + "::load_state_dict";
  const int64_t n = static_cast<int64_t>(masters_.size());
  StateDict inner_entries, scaler_entries;
  std::vector<Tensor> loaded(masters_.size());
  for (const auto& [name, t] : dict) {
    if (starts_with(name, "master.")) {
      int64_t i = 0;
      EMBER_CHECK(parse_index(name.substr(7), i) && i < n, ValueError, who, ": '", name, "' names no master (the "
                  "optimizer holds ", n, ")");
      const Tensor& m = masters_[static_cast<size_t>(i)];
      EMBER_CHECK(t.defined() && is_floating(t.dtype()) && t.sizes() == m.sizes(), ValueError, who, ": '", name,
                  "' must be a floating tensor of shape ", shape_str(m.sizes()), ", got ",
                  t.defined() ? t.description() : std::string("an undefined tensor"));
      EMBER_CHECK(!loaded[static_cast<size_t>(i)].defined(), ValueError, who, ": the name '", name,
                  "' appears twice");
      loaded[static_cast<size_t>(i)] = t;
    } else if (starts_with(name, "scaler.")) {
      scaler_entries.emplace_back(name.substr(7), t);
    } else {
      inner_entries.emplace_back(name, t);
    }
  }
  for (int64_t i = 0; i < n; ++i)
    EMBER_CHECK(loaded[static_cast<size_t>(i)].defined(), ValueError, who, ": 'master.", i, "' is missing");
  const detail::ScalerState s = detail::parse_scaler_state(who.c_str(), scaler_entries);
  inner_->load_state_dict(inner_entries);  // validates everything before it changes anything

  NoGradGuard no_grad;
  for (size_t i = 0; i < masters_.size(); ++i) {
    masters_[i].copy_(loaded[i]);
    params_[i].copy_(masters_[i]);
  }
  apply_scaler_state(s);
  unscaled_ = false;
}

}  // namespace ember::optim
