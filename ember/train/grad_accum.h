// Gradient accumulation: one optimizer step over several micro-batches, each micro-batch's loss weighted so that the
// accumulated gradient is the gradient of the whole batch's loss (Note [Micro-batch weights]).
// Invariant: per effective batch, every sample is in exactly one micro-batch, and the AmpTrainer steps once (one
// unscale, one NaN/inf check, one loss-scale update); gradients start cleared and are cleared after the step.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "ember/core/tensor.h"
#include "ember/nn/module.h"
#include "ember/train/amp.h"

namespace ember::train {

// A batch: tensors that share their first dimension (inputs, targets, masks, ...), split together along dim 0.
using Batch = std::vector<Tensor>;

// What a loss function returns for one micro-batch: `loss` is the mean over `count` — the samples it averaged over
// (a sample-mean loss: the micro-batch's rows) or the tokens it counted (a token loss with ignore_index: the
// non-ignored targets). A count of 0 (every target ignored) contributes nothing: that micro-batch runs no backward.
struct LossResult {
  Tensor loss;        // one element, floating, with its graph
  int64_t count = 0;  // >= 0
};
// Runs the forward and the loss on a micro-batch (the helpers call it inside the trainer's autocast region).
using LossFn = std::function<LossResult(const Batch& micro_batch)>;

// Runs before each micro-batch's forward; final_micro is true for the micro-batch that completes the effective batch.
// Meant for DDP's no_sync (dist/ddp.h): skip the gradient all-reduce when !final_micro, e.g.
// `[&](bool final) { ddp.set_require_backward_grad_sync(final); }`. Its forward runs after the hook, as PyTorch's no_sync
// context must cover the forward too.
using MicroBatchHook = std::function<void(bool final_micro)>;

// The rows every tensor of `batch` has in dim 0; ShapeError for an empty list, a 0-d tensor or differing rows.
int64_t batch_rows(const Batch& batch);
// Rows [start, end) of every tensor (views, no copy); IndexError unless 0 <= start < end <= rows.
Batch slice_batch(const Batch& batch, int64_t start, int64_t end);
// Consecutive micro-batches of micro_batch_size rows, the last one smaller when the rows do not divide (views).
std::vector<Batch> split_batch(const Batch& batch, int64_t micro_batch_size);

struct StepResult {
  double loss = std::numeric_limits<double>::quiet_NaN();  // sum_i loss_i * count_i / count: the whole batch's loss
  int64_t count = 0;          // sum of the micro-batches' counts
  int64_t samples = 0;        // rows of the batch
  int64_t micro_batches = 0;  // micro-batches run to the end (forward and backward)
  bool stepped = false;       // false when the step was skipped (NaN/inf gradients, or a count of 0)
  double grad_norm = std::numeric_limits<double>::quiet_NaN();  // the norm clipping saw (NaN without clipping)
  int64_t ooms = 0;                 // OutOfMemoryErrors caught and recovered from (OomResilientStep only)
  int64_t micro_batch_size = 0;     // the largest micro-batch of the step
};

// Note [BatchNorm and micro-batches]
// Accumulation reproduces the big batch's gradient only for models whose forward treats samples independently
// (Linear, convolutions, LayerNorm, attention within a sample, dropout up to its random draws). BatchNorm in training
// mode normalises with the statistics of the batch it sees: with micro-batches those are per micro-batch, so the
// outputs, the gradients and the running statistics (updated once per micro-batch, with momentum applied N times)
// differ from one big batch's. Use LayerNorm/GroupNorm-style layers, large enough micro-batches, or frozen (eval-mode)
// BatchNorm when accumulating.

struct AccumulationOptions {
  // step(batch) splits the batch into this many micro-batches of ceil(rows / n) rows, the last one smaller (as
  // torch.chunk: fewer pieces when the rows do not allow n, e.g. 9 rows in 4 → 3 + 3 + 3).
  int64_t micro_batches = 1;
  double max_grad_norm = 0.0;     // > 0: AmpTrainer::clip_grad_norm_(max_grad_norm) before the step
  MicroBatchHook on_micro_batch;  // optional
};

// Accumulates the micro-batches of each effective batch into one step of `trainer` over `model` (the module whose
// parameters receive the gradients; both must outlive this object). BatchNorm: Note [BatchNorm and micro-batches].
//
//   train::GradAccumulator accum(*model, trainer, {.micro_batches = 4, .max_grad_norm = 1.0});
//   train::StepResult r = accum.step({x, y}, [&](const train::Batch& b) {
//     return train::LossResult{F::cross_entropy(model->forward(b[0]), b[1]), b[0].size(0)};
//   });
class GradAccumulator {
 public:
  GradAccumulator(nn::Module& model, AmpTrainer& trainer, AccumulationOptions options = {});

  // Splits `batch` (options.micro_batches pieces) and runs one accumulated step.
  StepResult step(const Batch& batch, const LossFn& loss_fn);
  // One accumulated step over micro-batches given one by one (e.g. N batches from a DataLoader); sizes may differ.
  StepResult step_micro_batches(const std::vector<Batch>& micro_batches, const LossFn& loss_fn);

  const AccumulationOptions& options() const { return options_; }

 private:
  nn::Module& model_;
  AmpTrainer& trainer_;
  AccumulationOptions options_;
};

namespace detail {

// Note [Micro-batch weights]
// The big batch's loss is L = sum_i loss_i * count_i / C with C = sum_i count_i, so micro-batch i's loss is
// back-propagated with weight count_i / C. C is known only after the last micro-batch's forward (token counts live in
// the targets), so the weights use a reference R instead — fixed by the first micro-batch that counts anything: its
// count scaled to all rows, R = count_first * rows / rows_first — and the summed gradients are multiplied by R / C
// before the optimizer sees them. For a sample-mean loss (count_i = rows_i) R == C exactly: the weights are
// rows_i / rows (1/N for equal micro-batches) and no correction runs; a single micro-batch of all rows runs unweighted
// (its gradients are bitwise those of a plain step). For token losses R / C is close to 1, so the scaled gradients
// keep the range a loss scaler chose for them.
class LossWeights {
 public:
  explicit LossWeights(int64_t rows) : rows_(rows) {}
  // The weight for a micro-batch of `rows` rows whose loss is a mean over `count` > 0 (fixes R at the first call).
  double weight(int64_t rows, int64_t count);
  // Records a micro-batch whose backward completed.
  void add(double loss, int64_t count);
  int64_t count() const { return count_; }
  double loss() const;        // sum loss_i * count_i / C (NaN when C == 0)
  double correction() const;  // R / C (1 when nothing was counted)

 private:
  int64_t rows_;
  double reference_ = 0.0;
  double weighted_loss_ = 0.0;
  int64_t count_ = 0;
};

// Checks a loss function's result (ValueError naming `who`).
void check_loss_result(const char* who, const LossResult& r);
// loss * weight (loss itself for weight 1), back-propagated through the trainer.
void backward_weighted(AmpTrainer& trainer, const Tensor& loss, double weight);
// Multiplies every defined .grad of params by factor in place (under NoGradGuard); nothing for factor 1.
void scale_grads(const std::vector<Tensor>& params, double factor);
// The end of an accumulated step: the correction R / C, optional clipping, trainer.step(), zero_grad. With C == 0
// nothing steps (stepped false, loss NaN). Fills loss, count, stepped and grad_norm.
void finish_step(nn::Module& model, AmpTrainer& trainer, const LossWeights& weights, double max_grad_norm,
                 StepResult& result);

}  // namespace detail

}  // namespace ember::train
