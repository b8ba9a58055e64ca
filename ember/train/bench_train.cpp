// Standard training configurations and the step timer (bench_train.h).
// Invariant: the timed region of a step ends with a device synchronisation, so GPU steps are timed whole.
#include "ember/train/bench_train.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "ember/autograd/checkpoint_plan.h"
#include "ember/core/generator.h"
#include "ember/core/grad_mode.h"
#include "ember/memory/cuda_device.h"
#include "ember/nn/functional.h"
#include "ember/nn/layers.h"
#include "ember/nn/models.h"
#include "ember/nn/transformer.h"
#include "ember/optim/adam.h"
#include "ember/train/amp.h"

namespace ember::train {

namespace F = nn::functional;

StandardTask make_standard_task(const std::string& name, Device device, uint64_t seed) {
  manual_seed(seed);
  StandardTask t;
  t.name = name;
  const TensorOptions f32(DType::f32, device);
  if (name == "mlp") {
    t.batch = 256;
    t.model = nn::make_mlp({784, 1024, 1024, 10});
    t.inputs = randn({t.batch, 784}, f32);
    t.targets = (rand({t.batch}, f32) * 10.0).to(DType::i64);
  } else if (name == "cnn") {
    t.batch = 64;
    t.model = std::make_shared<nn::MnistNet>(/*dropout=*/false);
    t.inputs = randn({t.batch, 1, 28, 28}, f32);
    t.targets = (rand({t.batch}, f32) * 10.0).to(DType::i64);
  } else if (name == "gpt") {
    t.batch = 12;
    const nn::GPTConfig cfg;  // nanoGPT's CPU Shakespeare config: vocab 65, block 64, 4 layers, 4 heads, 128 wide
    t.model = std::make_shared<nn::GPT>(cfg);
    t.inputs = (rand({t.batch, cfg.block_size}, f32) * double(cfg.vocab_size)).to(DType::i64);
    t.targets = (rand({t.batch, cfg.block_size}, f32) * double(cfg.vocab_size)).to(DType::i64);
  } else {
    EMBER_THROW(ValueError, "unknown standard config '", name, "' (known: mlp, cnn, gpt)");
  }
  t.model->to(device);
  nn::Module* model = t.model.get();
  const Tensor x = t.inputs, y = t.targets;
  t.loss = [model, x, y]() {
    const Tensor logits = model->forward(x);
    return F::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
  };
  return t;
}

namespace {

void sync(Device device) {
  if (device.is_cuda()) memory::cuda::synchronize(device.index);
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// Makes the task's checkpoint plan from its batch (under the trainer's autocast, so the profile sees the step's
// dtypes) and installs it — except for none, which only reports the prediction and leaves the forward as it was.
// Returns the plan (no segments when nothing was profiled).
autograd::CheckpointPlan plan_checkpointing(StandardTask& task, const AmpTrainer& trainer,
                                            const autograd::CheckpointPolicy& policy) {
  nn::Module* model = task.model.get();
  auto* gpt = dynamic_cast<nn::GPT*>(model);
  auto* seq = dynamic_cast<nn::Sequential*>(model);
  if (!gpt && !seq) {
    EMBER_CHECK(policy.kind == autograd::CheckpointPolicy::Kind::none, ValueError, "bench train --checkpoint ",
                policy.str(), ": the ", task.name, " config has no block chain");
    return {};
  }
  autograd::CheckpointPlan plan;
  {
    AutocastGuard region = trainer.autocast();
    plan = gpt ? gpt->plan_checkpointing(task.inputs, policy) : seq->plan_checkpointing(task.inputs, policy);
  }
  if (policy.kind == autograd::CheckpointPolicy::Kind::none) {
    if (gpt) gpt->set_checkpoint_plan({});
    if (seq) seq->set_checkpoint_plan({});
  }
  return plan;
}

}  // namespace

BenchTrainResult bench_train(const BenchTrainOptions& o) {
  EMBER_CHECK(o.steps > 0 && o.warmup >= 0 && o.steps <= std::numeric_limits<int64_t>::max() - o.warmup, ValueError,
              "bench train: steps must be > 0, warmup >= 0 and their sum representable (got steps ", o.steps,
              ", warmup ", o.warmup, ")");
  const AmpMode mode = parse_amp_mode(o.amp);
  StandardTask task = make_standard_task(o.model, o.device, o.seed);
  AmpTrainer trainer(*task.model, {optim::ParamGroup{task.model->parameters()}},
                     [](std::vector<optim::ParamGroup> g) {
                       return std::make_unique<optim::AdamW>(std::move(g), optim::AdamWOptions{.lr = 1e-3});
                     },
                     mode);
  memory::Allocator& alloc = allocator_for(o.device);
  const autograd::CheckpointPolicy policy = autograd::CheckpointPolicy::parse(o.checkpoint);
  const autograd::CheckpointPlan plan = plan_checkpointing(task, trainer, policy);
  // The profiling forward's cached blocks go back, so the steps below fill the cache as they would without it.
  sync(o.device);
  alloc.empty_cache();

  BenchTrainResult r;
  r.model = o.model;
  r.device = o.device.str();
  r.amp = amp_mode_name(mode);
  r.steps = o.steps;
  r.batch = task.batch;
  r.parameters = task.model->num_parameters();
  r.checkpoint = policy.str();
  r.predicted_peak_bytes = plan.predicted_peak_bytes;
  if (!plan.segments.empty()) r.checkpoint_report = plan.to_string();
  std::vector<double> ms;
  for (int64_t i = 0; i < o.warmup + o.steps; ++i) {
    if (i == o.warmup) {
      sync(o.device);
      alloc.reset_peak_stats();
    }
    const bool last = i + 1 == o.warmup + o.steps;
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t before_forward = last ? alloc.stats().allocated_bytes : 0;
    Tensor loss;
    {
      AutocastGuard region = trainer.autocast();
      loss = task.loss();
    }
    if (last) r.activation_bytes = alloc.stats().allocated_bytes - before_forward;
    trainer.backward(loss);
    if (last) {
      const MemoryBreakdown m = trainer.memory();
      r.weights_bytes = m.weights;
      r.grads_bytes = m.grads;
      r.master_bytes = m.master_weights;
    }
    trainer.step();
    if (last) r.optimizer_state_bytes = trainer.memory().optimizer_state;
    trainer.zero_grad(/*set_to_none=*/true);
    const double value = loss.item_double();  // also synchronises with the device
    sync(o.device);
    const auto t1 = std::chrono::steady_clock::now();
    if (i == 0) r.first_loss = value;
    r.last_loss = value;
    if (i >= o.warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  r.steps_skipped = trainer.steps_skipped();
  std::sort(ms.begin(), ms.end());
  r.ms_per_step_median = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  r.ms_per_step_min = ms.front();
  r.ms_per_step_max = ms.back();
  const memory::AllocatorStats s = alloc.stats();
  r.peak_allocated_bytes = s.peak_allocated_bytes;
  r.peak_reserved_bytes = s.peak_reserved_bytes;
  r.peak_rss_mib = peak_rss_mib();
  return r;
}

std::string BenchTrainResult::to_json() const {
  nlohmann::ordered_json j;
  j["model"] = model;
  j["device"] = device;
  j["steps"] = steps;
  j["batch"] = batch;
  j["parameters"] = parameters;
  j["ms_per_step_median"] = ms_per_step_median;
  j["ms_per_step_min"] = ms_per_step_min;
  j["ms_per_step_max"] = ms_per_step_max;
  j["peak_rss_mib"] = peak_rss_mib;
  j["peak_allocated_bytes"] = peak_allocated_bytes;
  j["peak_reserved_bytes"] = peak_reserved_bytes;
  j["first_loss"] = first_loss;
  j["last_loss"] = last_loss;
  j["amp"] = amp;
  j["weights_bytes"] = weights_bytes;
  j["grads_bytes"] = grads_bytes;
  j["master_bytes"] = master_bytes;
  j["optimizer_state_bytes"] = optimizer_state_bytes;
  j["activation_bytes"] = activation_bytes;
  j["steps_skipped"] = steps_skipped;
  j["checkpoint"] = checkpoint;
  j["predicted_peak_bytes"] = predicted_peak_bytes;
  return j.dump();
}

}  // namespace ember::train
