// Batch-size finder and training snapshots (batch_finder.h).
// Invariant: every trial runs on an emptied cache under the trial budget's capacity cap (the budget less the
// headroom) and is followed by the restore
// callback; the search keeps lo (largest batch that fit, 0: none yet) < hi (smallest that failed, max_batch + 1: none
// yet) and ends with hi == lo + 1.
#include "ember/train/batch_finder.h"

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <map>
#include <sstream>
#include <unordered_set>

#include "ember/base/error.h"
#include "ember/core/grad_mode.h"
#include "ember/core/storage.h"
#include "ember/memory/caching_allocator.h"
#include "ember/memory/cuda_device.h"

namespace ember::train {

// ---- TrainingSnapshot ---------------------------------------------------------------------------------------------

TrainingSnapshot::TrainingSnapshot(nn::Module& model, optim::Optimizer* optimizer, optim::GradScaler* scaler)
    : model_(model), optimizer_(optimizer), scaler_(scaler) {
  capture();
}

TrainingSnapshot::TrainingSnapshot(nn::Module& model, optim::MixedPrecisionOptimizer& optimizer)
    : model_(model), mixed_(&optimizer) {
  capture();
}

TrainingSnapshot::TrainingSnapshot(nn::Module& model, AmpTrainer& trainer)
    : model_(model), optimizer_(&trainer.optimizer()), trainer_(&trainer) {
  capture();
}

TrainingSnapshot::HostTensor TrainingSnapshot::to_host(const std::string& name, const Tensor& t) {
  HostTensor h;
  h.name = name;
  h.dtype = t.dtype();
  h.shape = t.sizes();
  const Tensor c = t.to(Device::cpu()).contiguous();  // no copy for a contiguous CPU tensor
  h.bytes.resize(static_cast<size_t>(c.nbytes()));
  if (c.nbytes() > 0) std::memcpy(h.bytes.data(), c.raw_data(), h.bytes.size());
  return h;
}

Tensor TrainingSnapshot::to_tensor(const HostTensor& h) {
  Tensor t = empty(h.shape, TensorOptions(h.dtype));
  if (!h.bytes.empty()) std::memcpy(t.raw_data(), h.bytes.data(), h.bytes.size());
  return t;
}

std::vector<TrainingSnapshot::HostTensor> TrainingSnapshot::to_host(
    const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<HostTensor> out;
  out.reserve(named.size());
  for (const auto& [name, t] : named) out.push_back(to_host(name, t));
  return out;
}

std::vector<std::pair<std::string, Tensor>> TrainingSnapshot::to_tensors(const std::vector<HostTensor>& host) {
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(host.size());
  for (const HostTensor& h : host) out.emplace_back(h.name, to_tensor(h));
  return out;
}

std::vector<Tensor> TrainingSnapshot::extra_params() const {
  if (mixed_) return mixed_->master_parameters();
  std::vector<Tensor> out;
  if (!optimizer_) return out;
  std::unordered_set<const TensorImpl*> in_model;
  for (const Tensor& p : model_.parameters()) in_model.insert(p.unsafe_impl());
  for (const Tensor& p : optimizer_->parameters())
    if (!in_model.count(p.unsafe_impl())) out.push_back(p);
  return out;
}

std::vector<Tensor> TrainingSnapshot::all_params() const {
  std::vector<Tensor> out = model_.parameters();
  for (const Tensor& p : extra_params()) out.push_back(p);
  return out;
}

void TrainingSnapshot::capture() {
  NoGradGuard no_grad;
  model_state_ = to_host(model_.state_dict());
  optimizer_state_ = optimizer_ ? to_host(optimizer_->state_dict()) : std::vector<HostTensor>{};
  group_options_.clear();
  if (optimizer_)
    for (const optim::ParamGroup& g : optimizer_->param_groups()) group_options_.push_back(g.options);
  mixed_state_ = mixed_ ? to_host(mixed_->state_dict()) : std::vector<HostTensor>{};
  scaler_state_ = scaler_ && scaler_->is_enabled() ? to_host(scaler_->state_dict()) : std::vector<HostTensor>{};
  trainer_scaler_ = trainer_ ? to_host(trainer_->scaler_state_dict()) : std::vector<HostTensor>{};
  extra_values_.clear();
  if (!mixed_)  // a MixedPrecisionOptimizer's state_dict holds its masters
    for (const Tensor& p : extra_params()) extra_values_.push_back(to_host("extra", p));
  grads_.clear();
  for (const Tensor& p : all_params()) {
    const Tensor g = p.grad();
    grads_.push_back(g.defined() ? to_host("grad", g) : HostTensor{});
  }
  generator_ = default_generator().state();
}

bool TrainingSnapshot::fits(const Tensor& dst, const HostTensor& h) {
  return dst.defined() && dst.dtype() == h.dtype && dst.sizes() == h.shape;
}

void TrainingSnapshot::write_into(const Tensor& dst, const HostTensor& h) {
  if (dst.device().is_cpu() && dst.is_contiguous()) {
    if (!h.bytes.empty()) std::memcpy(dst.raw_data(), h.bytes.data(), h.bytes.size());
    dst.bump_version();
    return;
  }
  Tensor d = dst;
  d.copy_(to_tensor(h));
}

// Note [Training snapshot]: values go back into the tensors that hold them now, so a restore allocates nothing on the
// device (the trial after it starts from the same memory layout as the one before) — except where the set of tensors
// changed: optimizer state made after the capture (load_state_dict drops it), a MixedPrecisionOptimizer (its scaler
// is reachable only through load_state_dict), gradients that appeared or vanished.
void TrainingSnapshot::restore() const {
  NoGradGuard no_grad;
  // A trial that unscaled (clipped) and then ran out of memory left the trainer mid-step: abandon that step (the
  // gradients are zeroed in place here and overwritten below).
  if (trainer_) trainer_->zero_grad(/*set_to_none=*/false);
  if (mixed_) mixed_->load_state_dict(to_tensors(mixed_state_));
  const nn::NamedTensors live = model_.state_dict();
  EMBER_CHECK(live.size() == model_state_.size(), ValueError, "TrainingSnapshot::restore: the model has ",
              live.size(), " state tensors, the snapshot ", model_state_.size());
  for (size_t i = 0; i < live.size(); ++i) {
    EMBER_CHECK(live[i].first == model_state_[i].name && fits(live[i].second, model_state_[i]), ValueError,
                "TrainingSnapshot::restore: the model's '", live[i].first, "' (", live[i].second.description(),
                ") is not the '", model_state_[i].name, "' of the snapshot");
    write_into(live[i].second, model_state_[i]);
  }
  if (optimizer_) {
    const optim::StateDict now = optimizer_->state_dict();
    bool same = now.size() == optimizer_state_.size();
    for (size_t i = 0; same && i < now.size(); ++i)
      same = now[i].first == optimizer_state_[i].name && fits(now[i].second, optimizer_state_[i]);
    if (same) {
      for (size_t i = 0; i < now.size(); ++i)
        if (now[i].first.rfind("state.", 0) == 0) write_into(now[i].second, optimizer_state_[i]);
      for (size_t g = 0; g < group_options_.size(); ++g) optimizer_->param_groups()[g].options = group_options_[g];
    } else {
      optimizer_->load_state_dict(to_tensors(optimizer_state_));
    }
  }
  if (!scaler_state_.empty()) scaler_->load_state_dict(to_tensors(scaler_state_));
  if (!trainer_scaler_.empty()) trainer_->load_scaler_state_dict(to_tensors(trainer_scaler_));
  const std::vector<Tensor> extra = extra_params();
  for (size_t i = 0; i < extra_values_.size() && i < extra.size(); ++i) write_into(extra[i], extra_values_[i]);
  const std::vector<Tensor> params = all_params();
  EMBER_CHECK(params.size() == grads_.size(), ValueError, "TrainingSnapshot::restore: the model now has ",
              params.size(), " parameters, the snapshot ", grads_.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const HostTensor& h = grads_[i];
    const Tensor g = params[i].grad();
    if (h.name.empty()) params[i].set_grad(Tensor());
    else if (fits(g, h)) write_into(g, h);
    else params[i].set_grad(to_tensor(h).to(params[i].device()));
  }
  default_generator().set_state(generator_);
}

int64_t TrainingSnapshot::host_bytes() const {
  int64_t n = 0;
  for (const auto* list : {&model_state_, &optimizer_state_, &extra_values_, &scaler_state_, &mixed_state_, &grads_,
                            &trainer_scaler_})
    for (const HostTensor& h : *list) n += static_cast<int64_t>(h.bytes.size());
  return n;
}

// ---- find_batch_size ------------------------------------------------------------------------------------------------

namespace {

void release_cache(Device device, memory::Allocator& alloc) {
  if (device.type == DeviceType::CUDA) memory::cuda::synchronize(device.index);
  alloc.empty_cache();
}

// Caps the caching allocator's capacity at the budget for the finder's lifetime.
class CapacityCap {
 public:
  CapacityCap(memory::CachingAllocator* alloc, int64_t budget) : alloc_(alloc) {
    if (alloc_ == nullptr || budget <= 0) return;
    old_ = alloc_->config();
    memory::AllocatorConfig capped = old_;
    capped.capacity = std::min(old_.capacity, budget);
    alloc_->set_config(capped);
    set_ = true;
  }
  ~CapacityCap() {
    if (!set_) return;
    try {
      alloc_->set_config(old_);
    } catch (...) {  // only the capacity differs, which set_config always accepts
    }
  }
  CapacityCap(const CapacityCap&) = delete;
  CapacityCap& operator=(const CapacityCap&) = delete;

 private:
  memory::CachingAllocator* alloc_;
  memory::AllocatorConfig old_;
  bool set_ = false;
};

}  // namespace

// Note [Batch search]
// Trials are whole training steps (seconds on a big model), estimates are milliseconds, so the estimator does the
// wide search and the trials only confirm: the largest batch predicted to fit is tried first, then the search gallops
// away from it in steps of 1, 2, 4, ... (a good estimate is off by little, so the bracket [last success, first OOM]
// is found in a few trials) and bisects the bracket. Without an estimator the first trial is start_batch and the
// gallop doubles the batch (1, 2, 4, ...) or halves it. Each trial starts from an emptied cache, so its outcome does
// not depend on what the previous trial left cached, and from the restored state, so each sees the same weights and
// optimizer state (a first step creates optimizer state: every trial pays for it the same way).
BatchFinderResult find_batch_size(const std::function<void(int64_t)>& trial, const BatchFinderOptions& o) {
  const char* who = "find_batch_size";
  EMBER_CHECK(static_cast<bool>(trial), ValueError, who, ": the trial function is empty");
  EMBER_CHECK(static_cast<bool>(o.restore), ValueError, who,
              ": a restore callback is required (e.g. [&] { snapshot.restore(); } with a TrainingSnapshot)");
  EMBER_CHECK(1 <= o.min_batch && o.min_batch <= o.max_batch && o.max_batch < (int64_t{1} << 62), ValueError, who,
              ": need 1 <= min_batch <= max_batch < 2^62, got ", o.min_batch, " and ", o.max_batch);
  EMBER_CHECK(o.budget >= 0 && o.effective_batch >= 0 && o.start_batch >= 0, ValueError, who,
              ": budget, effective_batch and start_batch must be >= 0");

  EMBER_CHECK(o.headroom >= 0.0 && o.headroom <= 0.5, ValueError, who, ": headroom must be in [0, 0.5], got ",
              o.headroom);

  memory::Allocator& alloc = allocator_for(o.device);
  auto* caching = dynamic_cast<memory::CachingAllocator*>(&alloc);
  BatchFinderResult r;
  {
    const CapacityCap probe(caching, o.budget);
    r.budget = caching ? caching->allowed_memory() : (o.budget > 0 ? o.budget : memory::kNoLimit);
  }
  r.trial_budget = r.budget;
  if (o.headroom > 0.0 && r.budget != memory::kNoLimit)  // (1 - headroom) < 1: the product is below 2^63
    r.trial_budget = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(r.budget) * (1.0 - o.headroom)));
  const CapacityCap cap(caching, r.trial_budget == memory::kNoLimit ? o.budget : r.trial_budget);

  std::map<int64_t, int64_t> estimates;
  auto estimate = [&](int64_t b) {
    auto it = estimates.find(b);
    if (it == estimates.end()) it = estimates.emplace(b, o.estimate(b)).first;
    return it->second;
  };
  auto run = [&](int64_t b) {
    BatchTrial t;
    t.batch = b;
    if (o.estimate) t.estimated = estimate(b);
    release_cache(o.device, alloc);
    alloc.reset_peak_stats();
    try {
      trial(b);
      t.ok = true;
    } catch (const OutOfMemoryError&) {
      t.ok = false;
    } catch (...) {
      o.restore();
      throw;
    }
    const memory::AllocatorStats s = alloc.stats();
    t.peak_allocated = s.peak_allocated_bytes;
    t.peak_reserved = s.peak_reserved_bytes;
    // A step that ran but reserved more than the budget did not fit it: the cap stops growth, but memory reserved
    // before the finder started (above a budget below it) stays; and an allocator the cap cannot reach.
    if (t.ok && t.peak_reserved > r.trial_budget) t.ok = false;
    o.restore();
    r.trials.push_back(t);
    return t.ok;
  };

  const bool use_estimate = static_cast<bool>(o.estimate) && r.budget != memory::kNoLimit;
  int64_t first = o.start_batch > 0 ? std::clamp(o.start_batch, o.min_batch, o.max_batch) : o.min_batch;
  if (use_estimate) {
    int64_t l = o.min_batch, h = o.max_batch;
    if (estimate(l) <= r.trial_budget) {
      while (l < h) {
        const int64_t mid = l + (h - l + 1) / 2;
        if (estimate(mid) <= r.trial_budget) l = mid;
        else h = mid - 1;
      }
      r.estimated_batch = l;
    }
    first = std::max(l, o.min_batch);
  }

  int64_t lo = 0, hi = o.max_batch + 1;
  if (run(first)) {
    lo = first;
    for (int64_t step = 1; lo < o.max_batch; step *= 2) {
      const int64_t next = std::min(o.max_batch, use_estimate ? lo + step : lo * 2);
      if (!run(next)) {
        hi = next;
        break;
      }
      lo = next;
    }
  } else {
    hi = first;
    for (int64_t step = 1; hi > o.min_batch; step *= 2) {
      const int64_t next = std::max(o.min_batch, use_estimate ? hi - step : hi / 2);
      if (run(next)) {
        lo = next;
        break;
      }
      hi = next;
    }
  }
  if (lo > 0)
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (run(mid)) lo = mid;
      else hi = mid;
    }
  release_cache(o.device, alloc);

  r.batch = lo;
  if (lo > 0) {
    r.effective_batch = o.effective_batch > 0 ? o.effective_batch : lo;
    r.accumulation = (r.effective_batch + lo - 1) / lo;
    r.micro_batch = (r.effective_batch + r.accumulation - 1) / r.accumulation;
  }
  return r;
}

std::string BatchFinderResult::to_string() const {
  std::ostringstream os;
  os << "batch-size search (budget " << (budget == memory::kNoLimit ? std::string("unknown")
                                                                     : memory::format_bytes(budget))
     << (trial_budget < budget ? ", trials within " + memory::format_bytes(trial_budget) : std::string())
     << (estimated_batch > 0 ? ", estimator's pick " + std::to_string(estimated_batch) : std::string()) << ")\n";
  os << std::setw(8) << "batch" << std::setw(8) << "result" << std::setw(16) << "peak allocated" << std::setw(16)
     << "peak reserved" << std::setw(16) << "estimate" << "\n";
  for (const BatchTrial& t : trials)
    os << std::setw(8) << t.batch << std::setw(8) << (t.ok ? "fits" : "OOM") << std::setw(16)
       << memory::format_bytes(t.peak_allocated) << std::setw(16) << memory::format_bytes(t.peak_reserved)
       << std::setw(16) << (t.estimated >= 0 ? memory::format_bytes(t.estimated) : std::string("-")) << "\n";
  if (batch == 0) {
    os << "no batch fits";
  } else {
    os << "largest batch: " << batch;
    if (accumulation > 1)
      os << "; effective batch " << effective_batch << " = " << accumulation << " micro-batches of " << micro_batch
         << " rows";
  }
  return os.str();
}

}  // namespace ember::train
