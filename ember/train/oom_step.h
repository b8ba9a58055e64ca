// OOM-resilient training step: runs a batch as micro-batches of a remembered size; when a micro-batch's forward or
// backward throws OutOfMemoryError it drops everything that attempt made, empties the allocator's cache, halves the
// micro-batch and goes on with the same rows — one optimizer step per batch, every sample counted once.
// Invariant: an attempt's gradients reach .grad only when its backward completed (Note [Gradients set aside]); the
// loss weights are grad_accum.h's (Note [Micro-batch weights]), so the step equals one accumulated step.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "ember/memory/allocator.h"
#include "ember/train/grad_accum.h"

namespace ember::train {

// One OutOfMemoryError caught and recovered from, reported after the attempt was released and the cache emptied.
struct OomEvent {
  int64_t step = 0;         // index of the step (0 for the object's first step() call)
  int64_t start = 0;        // first row of the micro-batch that failed
  int64_t rows = 0;         // its rows
  int64_t next_rows = 0;    // the micro-batch size tried next (rows / 2, rounded up)
  std::string phase;        // "forward" (loss function) or "backward"
  int64_t requested = 0;    // the request that failed (bytes)
  memory::AllocatorStats stats;  // the device allocator's statistics after the release and empty_cache()
  std::string message;      // the error's message
};

struct OomStepOptions {
  double max_grad_norm = 0.0;     // > 0: AmpTrainer::clip_grad_norm_ before the step
  MicroBatchHook on_micro_batch;  // DDP no_sync hook, as GradAccumulator's (called before every attempt)
  int64_t micro_batch_size = 0;   // the size to start with; 0: whole batches until an OOM says otherwise
  // Growing back (optional): after this many steps in a row without an OOM, the remembered micro-batch size doubles
  // (a size >= the batch becomes "whole batches" again). 0: never grow; a size that worked is kept.
  int64_t grow_interval = 0;
  std::function<void(const OomEvent&)> on_oom;  // optional observer (logging, tests)
};

// Note [Gradients set aside]
// Before each micro-batch after the first, every parameter's accumulated .grad is moved aside (the tensor handle
// kept, the slot cleared — no copy), so the micro-batch's backward writes fresh .grad tensors. On success each saved
// gradient is added back into the fresh one in place (or becomes .grad again where the micro-batch gave none); on an
// OutOfMemoryError the fresh, partial gradients are dropped and the saved ones put back. Backward accumulates into
// .grad in place, so without this a backward that failed halfway would leave half of its contribution in the sums.
// Memory: nothing while the step runs as one micro-batch; otherwise, from the second micro-batch on, the saved
// gradients and the fresh ones coexist at the end of each backward — one extra gradient per parameter (4 bytes per
// parameter for fp32 weights, 2 for fp16/bf16 weights), where plain accumulation adds in place. The in-place merge
// allocates nothing.
//
//   train::OomResilientStep step(*model, trainer, {.max_grad_norm = 1.0});
//   for (auto [x, y] : loader) {
//     train::StepResult r = step.step({x, y}, [&](const train::Batch& b) {
//       return train::LossResult{F::cross_entropy(model->forward(b[0]), b[1]), b[0].size(0)};
//     });
//     // r.ooms, step.micro_batch_size(): what the step had to do
//   }
class OomResilientStep {
 public:
  // model: the module whose parameters receive the gradients; trainer: the optimizer (both must outlive this object).
  OomResilientStep(nn::Module& model, AmpTrainer& trainer, OomStepOptions options = {});

  // One optimizer step over `batch` (rows along dim 0). A micro-batch of one row that does not fit rethrows its
  // OutOfMemoryError after clearing the step's gradients (nothing stepped). An OOM outside a micro-batch's forward
  // and backward (the optimizer step, the unscale, clipping) is not retried: it propagates and the next step starts
  // from cleared gradients. Other exceptions propagate the same way.
  StepResult step(const Batch& batch, const LossFn& loss_fn);

  // The remembered micro-batch size (0: whole batches).
  int64_t micro_batch_size() const { return micro_; }
  void set_micro_batch_size(int64_t rows);  // ValueError for < 0
  int64_t total_ooms() const { return total_ooms_; }
  const OomStepOptions& options() const { return options_; }

 private:
  nn::Module& model_;
  AmpTrainer& trainer_;
  OomStepOptions options_;
  int64_t micro_ = 0;
  int64_t clean_steps_ = 0;  // steps in a row without an OOM (for growing back)
  int64_t steps_ = 0;
  int64_t total_ooms_ = 0;
};

}  // namespace ember::train
