// DistributedDataParallel: data parallelism over a ProcessGroup (torch.nn.parallel.DistributedDataParallel).
// Parameters and buffers are broadcast from rank 0 at construction after a shape check across ranks; gradients are
// packed into buckets (reverse parameter order, the same on every rank) and all-reduced (averaged) asynchronously
// from post-accumulate-grad hooks as each bucket fills. Invariant: buckets are launched strictly in bucket order on
// every rank, so the collectives match across ranks whatever order the hooks fire in (Note [DDP buckets]).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ember/autograd/node.h"
#include "ember/dist/process_group.h"
#include "ember/nn/module.h"

namespace ember::dist {

struct DdpOptions {
  int64_t bucket_cap_bytes = int64_t{25} << 20;  // 25 MiB, PyTorch's bucket_cap_mb default
  bool broadcast_buffers = true;                  // buffers (BatchNorm statistics) from rank 0 at construction
};

// Use (every rank runs the same program on its own part of the batch):
//   dist::init();
//   auto ddp = std::make_shared<dist::DistributedDataParallel>(model);   // broadcasts rank 0's weights
//   AdamW opt(model->parameters());
//   for (...) { Tensor loss = loss_fn(ddp->forward(x_local), y_local); loss.backward(); ddp->finish();
//               opt.step(); opt.zero_grad(); }
// Note [DDP finish]: backward ends with the gradients averaged when every parameter got a gradient (the last hook
// waits for the buckets and writes the averages into .grad). finish() completes an iteration in which some parameter
// got no gradient (its bucket slot is reduced as zeros, so its .grad becomes the average of the other ranks'
// gradients, zeros when no rank used it) and is a no-op otherwise: call it before every optimizer step. forward()
// refuses to start an iteration while the previous one is unfinished (ValueError), so a missed finish() cannot
// silently train on unreduced gradients.
// Note [DDP no_sync]: as in PyTorch, whether a backward reduces is decided by its forward: a forward() run inside
// no_sync() (or without grad mode) makes the backward through it accumulate locally; a forward() run outside makes
// it reduce, the accumulated sums included, wherever backward() is called. Gradients of a graph that did not go
// through forward() are not reduced (as PyTorch's reducer ignores hooks it did not expect).
// Note [DDP exceptions]: a throw during a synced backward (a user hook, an error in a kernel) leaves some buckets
// launched and the iteration open. finish() completes it (the missing gradients count as zeros), so this rank's
// collectives match the other ranks' and no request stays pending; the destructor does the same when the wrapper
// goes out of scope while an iteration is open, then waits for every launched bucket.
class DistributedDataParallel {
 public:
  // ValueError (on every rank, before any weight moves) when the ranks' parameter lists differ in count, shape or
  // dtype, naming the first parameter that differs; DeviceError when a parameter is not on the group's device.
  explicit DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                   std::shared_ptr<ProcessGroup> group = default_group_ptr(), DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // The module's forward (ValueError when the previous synced backward was not finished); decides whether the
  // backward through it reduces (Note [DDP no_sync]).
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  // What forward() does before the module's forward, for a model called through another signature (a GPT's
  // forward(idx, targets)): the unfinished-iteration check and the decision whether the coming backward reduces.
  void prepare_for_backward();
  // torch's require_backward_grad_sync: false is what no_sync() sets for its scope (gradient accumulation's
  // non-final micro-batches, train::AccumulationOptions::on_micro_batch).
  void set_require_backward_grad_sync(bool sync) { sync_ = sync; }
  nn::Module& module() { return *module_; }
  std::shared_ptr<nn::Module> module_ptr() const { return module_; }
  ProcessGroup& group() { return *group_; }

  // Completes the current iteration's reduction (Note [DDP finish]); every rank must call it the same number of times.
  void finish();
  // True between the first gradient hook of a synced backward and the end of its reduction.
  bool in_iteration() const { return iteration_started_ && !iteration_done_; }

  // While the guard lives, forward() makes graphs whose backward only accumulates gradients locally; the next backward
  // through a forward() outside the guard reduces the accumulated sums (torch's no_sync(), Note [DDP no_sync]).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(&ddp), previous_(ddp.sync_) { ddp.sync_ = false; }
    ~NoSyncGuard() { ddp_->sync_ = previous_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel* ddp_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // Bucket layout (for tests and reports): the parameter indices (module->parameters() order) of each bucket, in
  // launch order, and the bytes all buckets hold.
  std::vector<std::vector<int64_t>> bucket_assignment() const;
  int64_t bucket_bytes() const;
  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }

 private:
  struct Bucket {
    Tensor flat;                  // 1-d, the parameters' dtype, on their device (tag "ddp.buckets/backward")
    std::vector<int64_t> params;  // indices into params_
    std::vector<int64_t> offsets;
    int64_t pending = 0;          // parameters whose gradient has not arrived in this iteration
    WorkPtr work;                 // set when launched
  };

  void check_shapes_across_ranks(const nn::NamedTensors& named);
  void broadcast_state();
  void build_buckets();
  void on_gradient(int64_t index);
  void start_iteration();
  void launch_ready_buckets();
  void complete_iteration();

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DdpOptions options_;
  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<int64_t, int64_t>> where_;  // per parameter: (bucket, offset)
  std::vector<char> ready_;                         // per parameter, this iteration
  std::vector<autograd::HookHandle> hooks_;
  int64_t num_ready_ = 0;
  size_t next_launch_ = 0;
  bool sync_ = true;   // outside no_sync()
  bool armed_ = false;  // the last forward() ran outside no_sync() with grad mode on: its backward reduces
  bool iteration_started_ = false;
  bool iteration_done_ = true;
  bool finished_by_hook_ = false;  // the last hook completed the iteration; the next finish() only acknowledges it
};

}  // namespace ember::dist
