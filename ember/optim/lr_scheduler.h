// Learning-rate schedulers (torch.optim.lr_scheduler): StepLR, LambdaLR, and nanoGPT's warmup + cosine get_lr.
// Invariant: as in PyTorch, construction takes the initial step (last_epoch 0, groups get the epoch-0 lr) and each
// step() advances last_epoch by one and sets every group's "lr"; base_lrs are the group lrs at construction.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ember/optim/optimizer.h"

namespace ember::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  void step();
  const std::vector<double>& get_last_lr() const { return last_lr_; }  // the lrs the last step set, per group
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  int64_t last_epoch() const { return last_epoch_; }
  Optimizer& optimizer() const { return optimizer_; }

  // "last_epoch" (0-d i64), "base_lrs.<g>" and "last_lr.<g>" (0-d f64); load_state_dict restores them (ValueError
  // for a missing or unexpected name, or a group count that differs) without touching the optimizer's lrs.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& dict);

 protected:
  explicit LRScheduler(Optimizer& optimizer);
  // The initial step; a derived constructor calls it last (it calls compute_lrs()).
  void initial_step() { step(); }
  // The lrs for last_epoch(), one per group.
  virtual std::vector<double> compute_lrs() const = 0;
  std::vector<double> group_lrs() const;  // the groups' current lrs

 private:
  Optimizer& optimizer_;
  std::vector<double> base_lrs_, last_lr_;
  int64_t last_epoch_ = -1;
};

// lr decays by gamma every step_size epochs. PyTorch's chainable form: at an epoch that is a positive multiple of
// step_size the group's current lr is multiplied by gamma (so lr = base_lr * gamma^(epoch / step_size) when nothing
// else changes it). ValueError unless step_size >= 1.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  std::vector<double> compute_lrs() const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr = base_lr * fn(epoch); one function for every group, or one per group (ValueError when the count differs).
class LambdaLR : public LRScheduler {
 public:
  using LrLambda = std::function<double(int64_t epoch)>;
  LambdaLR(Optimizer& optimizer, LrLambda fn);
  LambdaLR(Optimizer& optimizer, std::vector<LrLambda> fns);

 protected:
  std::vector<double> compute_lrs() const override;

 private:
  std::vector<LrLambda> fns_;
};

// nanoGPT's get_lr(it) with learning_rate = base_lr (it = the scheduler's epoch, i.e. the iteration):
//   it <  warmup_iters:    base_lr * (it + 1) / (warmup_iters + 1)
//   it >  lr_decay_iters:  min_lr
//   otherwise:             min_lr + 0.5 * (1 + cos(pi * (it - warmup_iters) / (lr_decay_iters - warmup_iters)))
//                                   * (base_lr - min_lr)
double cosine_warmup_lr(int64_t it, double base_lr, int64_t warmup_iters, int64_t lr_decay_iters, double min_lr);

// The schedule above for every group. ValueError unless 0 <= warmup_iters < lr_decay_iters and min_lr >= 0.
class CosineWarmupLR : public LRScheduler {
 public:
  CosineWarmupLR(Optimizer& optimizer, int64_t warmup_iters, int64_t lr_decay_iters, double min_lr);

 protected:
  std::vector<double> compute_lrs() const override;

 private:
  int64_t warmup_iters_, lr_decay_iters_;
  double min_lr_;
};

}  // namespace ember::optim
