// The training step of the standard configurations, shared by everything that runs or predicts one: the step timer
// (bench_train.h), the peak-memory estimator (estimate.h) and its measurement on a real device. Predicted and
// measured bytes mean the same thing because both come from this code.
// Invariant: a step is, per micro-batch, forward + loss under the trainer's autocast and (scaled) backward; then one
// optimizer step and zero_grad(set_to_none) — nothing else allocates between them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ember/autograd/checkpoint_plan.h"
#include "ember/train/amp.h"
#include "ember/train/bench_train.h"

namespace ember::train {

struct TrainingOptions {
  std::string model = "mlp";  // mlp | cnn | gpt (make_standard_task)
  Device device = Device::cpu();
  uint64_t seed = 0;
  int64_t batch = 0;            // 0: the config's default
  std::string amp = "none";     // parse_amp_mode: none, fp16, bf16, autocast-fp16, autocast-bf16
  std::string checkpoint = "none";  // CheckpointPolicy::parse: none, sqrt, budget:SIZE
  int64_t grad_accum = 1;       // micro-batches per step; must divide the batch
};

// A standard task with its AdamW trainer (lr 1e-3) and checkpoint plan, ready to step.
struct TrainingSetup {
  StandardTask task;
  std::unique_ptr<AmpTrainer> trainer;
  autograd::CheckpointPolicy policy;
  autograd::CheckpointPlan plan;  // no segments when nothing was profiled (cnn, or none on a chain: the prediction)
  int64_t grad_accum = 1;
  int64_t micro_batch = 0;        // task.batch / grad_accum
};

// Builds, on options.device and in this order: the task (model, then batch), the trainer (converting the model for
// fp16/bf16), and the checkpoint plan — profiled on the first micro-batch under the trainer's autocast (mlp: the
// Sequential's children are the blocks; gpt: its transformer blocks; cnn: ValueError unless none) and installed
// unless the policy is none. Then the device allocator's cache is emptied, so the steps fill it as they would
// without the profile. ConfigError for an unknown amp mode or policy spelling, ValueError for a grad_accum that does
// not divide the batch.
TrainingSetup make_training_setup(const TrainingOptions& options);

// What a step saw, for reports (filled when a StepRecord is passed).
struct StepRecord {
  int64_t activation_bytes = 0;  // bytes the last micro-batch's forward left allocated (saved for backward + outputs)
  MemoryBreakdown after_backward;  // trainer.memory() after the last backward, before the optimizer step
  int64_t optimizer_state_bytes = 0;  // after the optimizer step
};

// One training step: for each micro-batch (the batch split along dim 0), loss / grad_accum forward under autocast
// and backward; then trainer.step() and zero_grad(set_to_none = true). Returns the step's loss (the sum of the
// micro-batch losses, detached; on meta a meta tensor).
Tensor run_training_step(TrainingSetup& setup, StepRecord* record = nullptr);

}  // namespace ember::train
