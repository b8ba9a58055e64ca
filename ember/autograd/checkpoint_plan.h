// The checkpoint planner: for a chain of blocks (a model's layers applied one after another), choose which runs of
// blocks to recompute so that the activation memory of a training step fits a policy — none, Chen's sqrt(n)
// segmentation, or a byte budget at the least recompute cost — from one profiled forward; then run the chain under
// the plan and report it.
// Invariant: a plan's segments tile [0, n) in order; predicted peaks use the model in Note [Checkpoint memory model].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ember/autograd/checkpoint.h"

namespace ember::autograd {

// "none", "sqrt", or "budget:SIZE" with SIZE as memory::parse_bytes takes it ("budget:64MiB", "budget:1.5GB");
// ConfigError otherwise.
struct CheckpointPolicy {
  enum class Kind { none, sqrt, budget };
  Kind kind = Kind::none;
  int64_t budget_bytes = 0;  // for budget
  static CheckpointPolicy parse(const std::string& text);
  std::string str() const;  // the spelling parse takes
};

// What one forward through block i costs and keeps, and what its backward holds (measured by profile_chain).
struct BlockProfile {
  int64_t input_bytes = 0;       // the block's input (kept when the block starts a recomputed segment)
  int64_t activation_bytes = 0;  // bytes of the distinct storages the block's ops save for backward, parameters
                                 // excluded; the block's input is included when its ops save it and the block
                                 // before did not count it (it saves the tensor it outputs): Note [Hand-off tensors]
  double cost = 0.0;             // forward time, seconds (what a recomputation costs)
  int64_t backward_bytes = 0;    // the most the block's backward holds beyond its activations: the gradient flowing
                                 // in, the one flowing out, each weight's fresh gradient before it is added into
                                 // .grad, temporaries (Note [Backward transients])
  int64_t input_saved_bytes = 0;  // the part of activation_bytes that is the block's input (0 when not counted)
};

// Note [Checkpoint memory model]
// Segments S_1..S_m in chain order; a kept segment s holds A(s) (the sum of activation_bytes over its blocks) from
// its forward until backward passes it; a recomputed segment holds only in(s) (its first block's input_bytes) —
// until backward reaches it, re-runs it, and holds in(s) + A(s) - saved(s) while its blocks' backward runs (saved(s):
// its first block's input_saved_bytes, the input that in(s) already holds). Backward visits the
// chain in reverse: when it reaches block k of segment s (first block b), every segment after s has been freed, the
// blocks of s after k have released their activations, and every segment before s is still held. With P(s) = the
// bytes held by the segments before s (sum of A over kept ones, in over recomputed ones) and T_k = backward_bytes,
// the memory the plan predicts for a training step is
//     max over blocks k ( P(s) + [in(s) - saved(s) if s is recomputed] + A(b..k) + T_k )
// which also covers the end of the forward (P(end of chain) <= the term of the last block). With every T_k = 0 it is
//     max( P(end of chain),  max over recomputed s of  P(s) + in(s) - saved(s) + A(s) ).
// Extra compute is the sum of cost over recomputed blocks.
//
// Note [Hand-off tensors]
// The tensor one block passes to the next is held for backward by whichever saves it: the producer (an op that saves
// its output, ReLU) or the consumer (one that saves its input, Linear, GELU, LayerNorm). profile_chain counts it once:
// in the producer when the producer saves it (it then lives until the producer's backward, the later of the two),
// else in the consumer when the consumer saves it. Counting it only in the producer lost every hand-off between a
// GELU and a Linear: a chain of 16 Linear+GELU blocks was predicted at 5.28 MiB and measured at 8.78 MiB. One case
// is still left out: a producer that counts the tensor and ends a recomputed segment holds nothing at rest, while the
// kept consumer after it does hold the tensor — at most one block's output per recomputed segment.
struct CheckpointSegment {
  int64_t begin = 0, end = 0;  // blocks [begin, end)
  bool recompute = false;
};

struct CheckpointPlan {
  CheckpointPolicy policy;
  std::vector<CheckpointSegment> segments;
  int64_t predicted_peak_bytes = 0;  // the memory model above: activations and backward's transients
  int64_t no_checkpoint_bytes = 0;   // the same with every block kept
  double extra_cost = 0.0;           // seconds of forward recomputed per step
  double forward_cost = 0.0;         // seconds of one forward of the whole chain
  int64_t recomputed_bytes = 0;      // activation bytes of the recomputed blocks (what recomputation re-creates)
  int64_t activation_bytes = 0;      // activation bytes of the whole chain
  bool fits = true;                  // budget: the prediction fits (false: the cheapest plan that comes closest)
  int64_t num_blocks() const { return segments.empty() ? 0 : segments.back().end; }
  bool recomputes(int64_t block) const;
  // ValueError naming `who` unless the segments tile [0, n) in order (each non-empty).
  void check_covers(int64_t n, const char* who) const;
  // A readable report: policy, the recomputed segments, predicted peak against no checkpointing, extra compute.
  std::string to_string() const;
};

// none: one kept segment. sqrt: Chen et al.'s segmentation — runs of ceil(sqrt(n)) blocks, every run but the last
// recomputed. budget(B): the plan with the least extra cost whose predicted peak is <= B — dynamic programming over
// the chain with the held prefix P counted in units of B/256 rounded up (so a plan said to fit does fit the model);
// when none fits, the plan with the smallest predicted peak, fits = false.
// ValueError for an empty profile or negative sizes.
CheckpointPlan plan_checkpoints(const std::vector<BlockProfile>& profile, const CheckpointPolicy& policy);

// One recorded forward (and backward) through the blocks from x, measuring each block's profile (saved-tensor hooks
// count the storages saved; a steady clock times each block's forward; the device allocator's peak window measures
// each block's backward). Leaves the parameters' .grad, their hooks and the random stream as they were.
std::vector<BlockProfile> profile_chain(const std::vector<TensorFn>& blocks, const Tensor& x);

// Runs x through the blocks in order, each recomputed segment of the plan as one checkpointed region. ValueError when
// the plan does not cover exactly blocks.size() blocks.
Tensor run_chain(const std::vector<TensorFn>& blocks, const Tensor& x, const CheckpointPlan& plan);

}  // namespace ember::autograd
