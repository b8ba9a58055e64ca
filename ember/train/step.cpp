// The shared training step of the standard configurations (step.h).
// Invariant: the setup and the step allocate the same tensors in the same order on every device — on meta inside a
// MetaAllocationScope they are what the peak-memory estimator counts.
#include "ember/train/step.h"

#include "ember/autograd/functions.h"
#include "ember/base/error.h"
#include "ember/kernels/ops.h"
#include "ember/memory/cuda_device.h"
#include "ember/nn/layers.h"
#include "ember/nn/transformer.h"
#include "ember/optim/adam.h"

namespace ember::train {

namespace {

void sync(Device device) {
  if (device.is_cuda()) memory::cuda::synchronize(device.index);
}

// Makes the task's checkpoint plan from one micro-batch (under the trainer's autocast, so the profile sees the step's
// dtypes) and installs it — except for none, which only reports the prediction and leaves the forward as it was.
// Returns the plan (no segments when nothing was profiled).
autograd::CheckpointPlan plan_checkpointing(StandardTask& task, const Tensor& micro_inputs, const AmpTrainer& trainer,
                                            const autograd::CheckpointPolicy& policy) {
  nn::Module* model = task.model.get();
  auto* gpt = dynamic_cast<nn::GPT*>(model);
  auto* seq = dynamic_cast<nn::Sequential*>(model);
  if (!gpt && !seq) {
    EMBER_CHECK(policy.kind == autograd::CheckpointPolicy::Kind::none, ValueError, "training step: checkpoint policy ",
                policy.str(), ": the ", task.name, " config has no block chain (none only)");
    return {};
  }
  autograd::CheckpointPlan plan;
  {
    AutocastGuard region = trainer.autocast();
    plan = gpt ? gpt->plan_checkpointing(micro_inputs, policy) : seq->plan_checkpointing(micro_inputs, policy);
  }
  if (policy.kind == autograd::CheckpointPolicy::Kind::none) {
    if (gpt) gpt->set_checkpoint_plan({});
    if (seq) seq->set_checkpoint_plan({});
  }
  return plan;
}

}  // namespace

TrainingSetup make_training_setup(const TrainingOptions& o) {
  const AmpMode mode = parse_amp_mode(o.amp);
  const autograd::CheckpointPolicy policy = autograd::CheckpointPolicy::parse(o.checkpoint);
  EMBER_CHECK(o.grad_accum >= 1, ValueError, "training step: grad_accum must be >= 1, got ", o.grad_accum);
  TrainingSetup s;
  s.task = make_standard_task(o.model, o.device, o.seed, o.batch);
  EMBER_CHECK(s.task.batch % o.grad_accum == 0, ValueError, "training step: grad_accum ", o.grad_accum,
              " does not divide the batch of ", s.task.batch);
  s.grad_accum = o.grad_accum;
  s.micro_batch = s.task.batch / o.grad_accum;
  s.policy = policy;
  s.trainer = std::make_unique<AmpTrainer>(
      *s.task.model, std::vector<optim::ParamGroup>{optim::ParamGroup{s.task.model->parameters()}},
      [](std::vector<optim::ParamGroup> g) {
        return std::make_unique<optim::AdamW>(std::move(g), optim::AdamWOptions{.lr = 1e-3});
      },
      mode);
  const Tensor micro = o.grad_accum == 1 ? s.task.inputs : s.task.inputs.narrow(0, 0, s.micro_batch);
  s.plan = plan_checkpointing(s.task, micro, *s.trainer, policy);
  // The profiling forward's cached blocks go back, so the steps fill the cache as they would without it.
  sync(o.device);
  allocator_for(o.device).empty_cache();
  return s;
}

Tensor run_training_step(TrainingSetup& s, StepRecord* record) {
  AmpTrainer& trainer = *s.trainer;
  const Device device = s.task.inputs.device();
  Tensor total;
  for (int64_t m = 0; m < s.grad_accum; ++m) {
    const bool last = m + 1 == s.grad_accum;
    const int64_t before_forward = record && last ? allocator_for(device).stats().allocated_bytes : 0;
    Tensor loss;
    {
      AutocastGuard region = trainer.autocast();
      if (s.grad_accum == 1) {
        loss = s.task.loss();
      } else {
        const int64_t begin = m * s.micro_batch;
        loss = ember::div(s.task.loss_on(s.task.inputs.narrow(0, begin, s.micro_batch),
                                         s.task.targets.narrow(0, begin, s.micro_batch)),
                          static_cast<double>(s.grad_accum));
      }
    }
    if (record && last) record->activation_bytes = allocator_for(device).stats().allocated_bytes - before_forward;
    trainer.backward(loss);
    const Tensor value = loss.detach();
    total = total.defined() ? ops::add(total, value) : value;
  }
  if (record) record->after_backward = trainer.memory();
  trainer.step();
  if (record) record->optimizer_state_bytes = trainer.memory().optimizer_state;
  trainer.zero_grad(/*set_to_none=*/true);
  return total;
}

}  // namespace ember::train
