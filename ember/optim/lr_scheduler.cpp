// The schedulers' lr formulas and the shared step / state_dict logic.
// Invariant: step() writes exactly one lr per parameter group and records it in get_last_lr().
#include "ember/optim/lr_scheduler.h"

#include <cmath>
#include <numbers>
#include <set>

namespace ember::optim {

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer), base_lrs_(group_lrs()) {}

std::vector<double> LRScheduler::group_lrs() const {
  std::vector<double> lrs;
  for (const ParamGroup& g : optimizer_.param_groups()) lrs.push_back(g.lr());
  return lrs;
}

void LRScheduler::step() {
  EMBER_CHECK(optimizer_.param_groups().size() == base_lrs_.size(), ValueError, "lr scheduler: the optimizer has ",
              optimizer_.param_groups().size(), " parameter groups, the scheduler was made for ", base_lrs_.size());
  ++last_epoch_;
  const std::vector<double> lrs = compute_lrs();
  for (size_t g = 0; g < lrs.size(); ++g) optimizer_.param_groups()[g].set_lr(lrs[g]);
  last_lr_ = lrs;
}

StateDict LRScheduler::state_dict() const {
  StateDict out;
  const TensorOptions i64(DType::i64, Device::cpu()), f64(DType::f64, Device::cpu());
  out.emplace_back("last_epoch", scalar_tensor(last_epoch_, i64));
  for (size_t g = 0; g < base_lrs_.size(); ++g)
    out.emplace_back("base_lrs." + std::to_string(g), scalar_tensor(base_lrs_[g], f64));
  for (size_t g = 0; g < last_lr_.size(); ++g)
    out.emplace_back("last_lr." + std::to_string(g), scalar_tensor(last_lr_[g], f64));
  return out;
}

void LRScheduler::load_state_dict(const StateDict& dict) {
  const size_t n = base_lrs_.size();
  std::vector<double> base(n), last(n);
  std::set<std::string> expected{"last_epoch"}, seen;
  for (size_t g = 0; g < n; ++g) {
    expected.insert("base_lrs." + std::to_string(g));
    expected.insert("last_lr." + std::to_string(g));
  }
  int64_t epoch = 0;
  for (const auto& [name, t] : dict) {
    EMBER_CHECK(expected.count(name) == 1, ValueError, "lr scheduler load_state_dict: unexpected name '", name,
                "' (the scheduler has ", n, " groups)");
    EMBER_CHECK(seen.insert(name).second, ValueError, "lr scheduler load_state_dict: '", name, "' appears twice");
    EMBER_CHECK(t.defined() && t.numel() == 1, ValueError, "lr scheduler load_state_dict: '", name,
                "' must hold one value");
    if (name == "last_epoch") {
      epoch = t.item<int64_t>();
    } else {
      const size_t dot = name.find('.');
      const size_t g = std::stoul(name.substr(dot + 1));
      (name[0] == 'b' ? base : last)[g] = t.item_double();
    }
  }
  for (const std::string& name : expected)
    EMBER_CHECK(seen.count(name) == 1, ValueError, "lr scheduler load_state_dict: '", name, "' is missing");
  last_epoch_ = epoch;
  base_lrs_ = base;
  last_lr_ = last;
}

// ---- StepLR -------------------------------------------------------------------------------------------------------

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  EMBER_CHECK(step_size >= 1, ValueError, "StepLR: step_size must be >= 1, got ", step_size);
  initial_step();
}

std::vector<double> StepLR::compute_lrs() const {
  std::vector<double> lrs = group_lrs();
  if (last_epoch() == 0 || last_epoch() % step_size_ != 0) return lrs;
  for (double& lr : lrs) lr *= gamma_;
  return lrs;
}

// ---- LambdaLR -----------------------------------------------------------------------------------------------------

LambdaLR::LambdaLR(Optimizer& optimizer, LrLambda fn)
    : LambdaLR(optimizer, std::vector<LrLambda>(optimizer.param_groups().size(), fn)) {}

LambdaLR::LambdaLR(Optimizer& optimizer, std::vector<LrLambda> fns) : LRScheduler(optimizer), fns_(std::move(fns)) {
  EMBER_CHECK(fns_.size() == optimizer.param_groups().size(), ValueError, "LambdaLR: expected ",
              optimizer.param_groups().size(), " lr lambdas (one per parameter group), got ", fns_.size());
  for (size_t g = 0; g < fns_.size(); ++g)
    EMBER_CHECK(static_cast<bool>(fns_[g]), ValueError, "LambdaLR: lr lambda ", g, " is empty");
  initial_step();
}

std::vector<double> LambdaLR::compute_lrs() const {
  std::vector<double> lrs;
  for (size_t g = 0; g < fns_.size(); ++g) lrs.push_back(base_lrs()[g] * fns_[g](last_epoch()));
  return lrs;
}

// ---- CosineWarmupLR -----------------------------------------------------------------------------------------------

double cosine_warmup_lr(int64_t it, double base_lr, int64_t warmup_iters, int64_t lr_decay_iters, double min_lr) {
  if (it < warmup_iters) return base_lr * static_cast<double>(it + 1) / static_cast<double>(warmup_iters + 1);
  if (it > lr_decay_iters) return min_lr;
  const double decay_ratio =
      static_cast<double>(it - warmup_iters) / static_cast<double>(lr_decay_iters - warmup_iters);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * decay_ratio));
  return min_lr + coeff * (base_lr - min_lr);
}

CosineWarmupLR::CosineWarmupLR(Optimizer& optimizer, int64_t warmup_iters, int64_t lr_decay_iters, double min_lr)
    : LRScheduler(optimizer), warmup_iters_(warmup_iters), lr_decay_iters_(lr_decay_iters), min_lr_(min_lr) {
  EMBER_CHECK(warmup_iters >= 0 && lr_decay_iters > warmup_iters, ValueError,
              "CosineWarmupLR: expected 0 <= warmup_iters < lr_decay_iters, got warmup_iters ", warmup_iters,
              " and lr_decay_iters ", lr_decay_iters);
  EMBER_CHECK(min_lr >= 0.0, ValueError, "CosineWarmupLR: invalid min_lr: ", min_lr);
  initial_step();
}

std::vector<double> CosineWarmupLR::compute_lrs() const {
  std::vector<double> lrs;
  for (double base : base_lrs())
    lrs.push_back(cosine_warmup_lr(last_epoch(), base, warmup_iters_, lr_decay_iters_, min_lr_));
  return lrs;
}

}  // namespace ember::optim
