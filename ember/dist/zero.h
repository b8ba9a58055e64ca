// ZeroRedundancyOptimizer: ZeRO stage 1 — the optimizer state (fp32 master weights, Adam's m and v) sharded across
// the ranks of a ProcessGroup. Gradients are reduce-scattered (averaged), each rank steps its own shard with any ember
// optimizer, and the updated shards are all-gathered into every rank's parameters.
// Invariant: after every step() that was not skipped, each rank's parameters are identical (the all-gathered shards),
// and a rank holds optimizer state for its shard only (Note [ZeRO-1 layout]).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ember/dist/process_group.h"
#include "ember/optim/grad_scaler.h"
#include "ember/optim/mixed_precision.h"

namespace ember::dist {

struct ZeroOptions {
  // f16/bf16 parameters only (MixedPrecisionOptimizer's rules): loss scaling for f16 (GradScaler's defaults); bf16
  // keeps scale 1. Either way a step whose reduced gradients hold NaN/inf is skipped on every rank.
  optim::GradScalerOptions scaler = {};
};

// Note [ZeRO-1 layout]
// The parameters (one dtype, one device, in the given order) are laid end to end in a virtual flat vector of N
// elements, padded to a multiple of the world size W; rank r owns elements [r*S, (r+1)*S), S = ceil(N / W). The shard
// is an fp32 master leaf (f32 parameters: f32, f64: f64) that the wrapped optimizer steps — its state is S elements
// per tensor instead of N. A step: every parameter's gradient is packed into a transient flat buffer (zeros for a
// parameter without one and for the padding), reduce-scattered with ReduceOp::Avg into the shard's gradient, the
// shard is stepped, rounded to the parameters' dtype and all-gathered into a transient flat buffer that is unpacked
// into the parameters. Memory per rank for mixed-precision Adam: weights 2 + gradients 2 + (master 4 + m 4 + v 4)/W
// bytes per parameter, i.e. 4 + 12/W instead of 16, plus the transient buffers of one step.
// Only one parameter group: the shard is a single tensor; per-group options (weight-decay groups) are not supported.
class ZeroRedundancyOptimizer {
 public:
  // params: leaves that require grad, all of one floating dtype and on the group's device (DTypeError/DeviceError),
  // not empty (ValueError). make_optimizer builds the wrapped optimizer over a one-group list holding the shard.
  ZeroRedundancyOptimizer(std::vector<Tensor> params, const optim::OptimizerFactory& make_optimizer,
                          std::shared_ptr<ProcessGroup> group = default_group_ptr(), ZeroOptions options = {});
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;

  // Mixed precision: loss * scale (f16), loss otherwise; backward(loss) = scale_loss(loss).backward().
  Tensor scale_loss(const Tensor& loss);
  void backward(const Tensor& loss);
  // Collective: reduce-scatter, local step, all-gather. Returns whether the step was taken (false: NaN/inf in some
  // rank's reduced gradients; the loss scale backs off on every rank).
  bool step();
  void zero_grad(bool set_to_none = true);

  optim::Optimizer& inner() { return *inner_; }
  const Tensor& shard() const { return shard_; }  // this rank's master elements (its padding included)
  int64_t shard_offset() const { return shard_offset_; }
  int64_t numel() const { return numel_; }  // N, without padding
  bool mixed_precision() const { return mixed_; }
  double loss_scale() const;
  // Bytes of this rank's optimizer state: the wrapped optimizer's state tensors plus, in mixed precision, the fp32
  // master shard (an fp32 model's shard is its weights, counted with them, as unsharded training counts none).
  int64_t state_bytes() const;

 private:
  std::shared_ptr<ProcessGroup> group_;
  ZeroOptions options_;
  std::vector<Tensor> params_;
  DType dtype_;
  bool mixed_ = false;
  int64_t numel_ = 0, shard_numel_ = 0, shard_offset_ = 0;
  Tensor shard_;  // master leaf, S elements (tag "zero.shard/optimizer")
  std::unique_ptr<optim::Optimizer> inner_;
  Tensor scale_, growth_tracker_, found_inf_, inv_scale_;  // mixed precision: 1-element tensors
};

}  // namespace ember::dist
