// Activation checkpointing (torch.utils.checkpoint, non-reentrant form): a region's forward runs with grad mode on but
// keeps none of the tensors its ops save for backward — only the region's inputs (and what lives anyway, like
// parameters). The first time backward needs one of them, the region is re-run from its inputs with the random-number
// and autocast state it first ran with, and the recomputed tensors stand in for the discarded ones.
// Invariant: the recomputation saves the same sequence of tensors (count, shapes, dtypes) as the first run, or
// backward raises CheckpointError naming the first difference; gradients are bit-identical to running without
// checkpointing (same ops, same order, same dropout masks).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ember/base/error.h"
#include "ember/core/tensor.h"

namespace ember {

// Raised when a recomputation does not reproduce the region's first run (Note [Checkpoint determinism]).
class CheckpointError : public Error {
  using Error::Error;
};

namespace autograd {

using RegionFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;
using TensorFn = std::function<Tensor(const Tensor&)>;

// Runs fn(inputs) as a checkpointed region and returns its outputs (with their history). `fn` must be callable again
// during backward with the same inputs (capture modules by reference or shared_ptr, not temporaries), and must not
// depend on state that changes between the forward and the backward except through the inputs. The random draws of
// the first run are logged and replayed by the recomputation (Note [Checkpoint RNG]; no generator moves, even with
// other threads drawing), and this thread's autocast state is restored for it, so dropout draws the same masks.
// Outside grad mode it is simply fn(inputs). Regions nest. Recomputed tensors are released as backward uses them;
// those of ops backward never reaches (autograd::grad on a subset) live until the graph is freed, as in PyTorch.
// An in-place write into a tensor the region saved is detected only when the recomputation runs: CheckpointError.
std::vector<Tensor> checkpoint(const RegionFn& fn, const std::vector<Tensor>& inputs);
Tensor checkpoint(const TensorFn& fn, const Tensor& input);

// fns applied in order to x (fns[0] first); no checkpointing. The plain chain the checkpointed forms must equal.
Tensor apply_chain(const std::vector<TensorFn>& fns, const Tensor& x);

// Splits `fns` (applied in order, each to the previous one's output) into `segments` contiguous runs of nearly equal
// length and checkpoints every run but the last (torch.utils.checkpoint.checkpoint_sequential). segments in
// [1, fns.size()] (ValueError otherwise).
Tensor checkpoint_sequential(const std::vector<TensorFn>& fns, int64_t segments, const Tensor& input);

// Statistics of the checkpointed regions of this thread since the last reset (for reports and tests).
struct CheckpointStats {
  int64_t regions = 0;          // checkpointed regions run forward
  int64_t recomputations = 0;   // regions re-run during backward
  int64_t saved_discarded = 0;  // tensors the regions did not keep
};
CheckpointStats checkpoint_stats();
void reset_checkpoint_stats();

// True while this thread re-runs a checkpointed region during backward. Side effects that must happen once per
// forward (BatchNorm's running statistics) check it and skip the second time.
bool is_recomputing();

}  // namespace autograd
}  // namespace ember
