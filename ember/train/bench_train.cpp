// Standard training configurations and the step timer (bench_train.h).
// Invariant: the timed region of a step ends with a device synchronisation, so GPU steps are timed whole.
#include "ember/train/bench_train.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "ember/autograd/checkpoint_plan.h"
#include "ember/core/generator.h"
#include "ember/core/grad_mode.h"
#include "ember/core/parallel.h"
#include "ember/memory/cuda_device.h"
#include "ember/nn/functional.h"
#include "ember/nn/layers.h"
#include "ember/nn/models.h"
#include "ember/nn/transformer.h"
#include "ember/optim/adam.h"
#include "ember/train/amp.h"
#include "ember/train/step.h"

#if defined(EMBER_WITH_CUDA)
#include "ember/kernels/cuda/attention.h"
#include "ember/kernels/cuda/blas.h"
#endif

namespace ember::train {

namespace F = nn::functional;

nn::GPTConfig gpt2_124m() {
  nn::GPTConfig c;
  c.vocab_size = 50304;  // GPT-2's 50257 tokens padded to a multiple of 128, as nanoGPT and llm.c train it
  c.block_size = 1024;
  c.n_layer = 12;
  c.n_head = 12;
  c.n_embd = 768;
  c.bias = true;
  return c;
}

StandardTask make_standard_task(const std::string& name, Device device, uint64_t seed, int64_t batch) {
  EMBER_CHECK(batch >= 0, ValueError, "make_standard_task: batch must be >= 0 (0: the default), got ", batch);
  manual_seed(seed);
  StandardTask t;
  t.name = name;
  const TensorOptions f32(DType::f32, device);
  // The model first, on the host, then on the device, then the batch: the device's allocator sees the parameters
  // before the batch whatever the device (on cpu the move is a no-op).
  // Note [Models built on meta]
  // For meta (the estimator's and the planner's dry runs) the model is built on meta directly (DefaultDeviceGuard):
  // a host copy would cost the model's bytes in host memory and its initialisation (5 s of random draws for GPT-2
  // 124M on this project's 2-core machine) for values a dry run never reads. The parameters are then allocated in
  // construction order, as a cpu run allocates them.
  std::optional<DefaultDeviceGuard> on_meta;
  if (device.is_meta()) on_meta.emplace(device);
  nn::GPTConfig gpt;  // nanoGPT's CPU Shakespeare config: vocab 65, block 64, 4 layers, 4 heads, 128 wide
  if (name == "mlp") {
    t.batch = batch > 0 ? batch : 256;
    t.model = nn::make_mlp({784, 1024, 1024, 10});
  } else if (name == "cnn") {
    t.batch = batch > 0 ? batch : 64;
    t.model = std::make_shared<nn::MnistNet>(/*dropout=*/false);
  } else if (name == "gpt") {
    t.batch = batch > 0 ? batch : 12;
    t.model = std::make_shared<nn::GPT>(gpt);
  } else if (name == "gpt2") {
    gpt = gpt2_124m();
    t.batch = batch > 0 ? batch : 4;
    t.model = std::make_shared<nn::GPT>(gpt);
  } else {
    EMBER_THROW(ValueError, "unknown standard config '", name, "' (known: mlp, cnn, gpt, gpt2)");
  }
  on_meta.reset();
  t.model->to(device);
  if (name == "mlp") {
    t.inputs = randn({t.batch, 784}, f32);
    t.targets = (rand({t.batch}, f32) * 10.0).to(DType::i64);
  } else if (name == "cnn") {
    t.inputs = randn({t.batch, 1, 28, 28}, f32);
    t.targets = (rand({t.batch}, f32) * 10.0).to(DType::i64);
  } else {
    t.inputs = (rand({t.batch, gpt.block_size}, f32) * double(gpt.vocab_size)).to(DType::i64);
    t.targets = (rand({t.batch, gpt.block_size}, f32) * double(gpt.vocab_size)).to(DType::i64);
  }
  t.tokens = name == "gpt" || name == "gpt2" ? t.batch * gpt.block_size : t.batch;
  nn::Module* model = t.model.get();
  t.loss_on = [model](const Tensor& x, const Tensor& y) {
    const Tensor logits = model->forward(x);
    return F::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
  };
  const Tensor x = t.inputs, y = t.targets;
  auto loss_on = t.loss_on;
  t.loss = [loss_on, x, y]() { return loss_on(x, y); };
  return t;
}

namespace {

void sync(Device device) {
  if (device.is_cuda()) memory::cuda::synchronize(device.index);
}

int64_t flash_calls() {
#if defined(EMBER_WITH_CUDA)
  return cuda::flash_attention_calls();
#else
  return 0;
#endif
}

// Hand-written GEMM calls so far: all, and those on the wgmma kernel.
std::pair<int64_t, int64_t> tensor_core_calls() {
#if defined(EMBER_WITH_CUDA)
  return {cuda::tensor_core_gemm_calls(), cuda::wgmma_gemm_calls()};
#else
  return {0, 0};
#endif
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace

BenchTrainResult bench_train(const BenchTrainOptions& o) {
  EMBER_CHECK(o.steps > 0 && o.warmup >= 0 && o.steps <= std::numeric_limits<int64_t>::max() - o.warmup, ValueError,
              "bench train: steps must be > 0, warmup >= 0 and their sum representable (got steps ", o.steps,
              ", warmup ", o.warmup, ")");
  EMBER_CHECK(o.device.is_cpu() || o.device.is_cuda(), ValueError, "bench train: --device ", o.device.str(),
              ": training runs on cpu or cuda[:N] (ember estimate dry-runs a step on meta)");
  TrainingOptions to;
  to.model = o.model;
  to.device = o.device;
  to.seed = o.seed;
  to.batch = o.batch;
  to.amp = o.amp;
  to.checkpoint = o.checkpoint;
  to.grad_accum = o.grad_accum;
  TrainingSetup setup = make_training_setup(to);
  memory::Allocator& alloc = allocator_for(o.device);

  BenchTrainResult r;
  r.model = o.model;
  r.device = o.device.str();
  r.amp = amp_mode_name(setup.trainer->mode());
  r.steps = o.steps;
  r.batch = setup.task.batch;
  r.parameters = setup.task.model->num_parameters();
  r.checkpoint = setup.policy.str();
  r.predicted_peak_bytes = setup.plan.predicted_peak_bytes;
  if (!setup.plan.segments.empty()) r.checkpoint_report = setup.plan.to_string();
  const int64_t flash_calls_before = flash_calls();
  const std::pair<int64_t, int64_t> tc_calls_before = tensor_core_calls();
  std::vector<double> ms;
  for (int64_t i = 0; i < o.warmup + o.steps; ++i) {
    if (i == o.warmup) {
      sync(o.device);
      alloc.reset_peak_stats();
    }
    const bool last = i + 1 == o.warmup + o.steps;
    const auto t0 = std::chrono::steady_clock::now();
    StepRecord record;
    const Tensor loss = run_training_step(setup, last ? &record : nullptr);
    const double value = loss.item_double();  // also synchronises with the device
    sync(o.device);
    const auto t1 = std::chrono::steady_clock::now();
    if (last) {
      r.activation_bytes = record.activation_bytes;
      r.weights_bytes = record.after_backward.weights;
      r.grads_bytes = record.after_backward.grads;
      r.master_bytes = record.after_backward.master_weights;
      r.optimizer_state_bytes = record.optimizer_state_bytes;
    }
    if (i == 0) r.first_loss = value;
    r.last_loss = value;
    if (i >= o.warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  r.steps_skipped = setup.trainer->steps_skipped();
  std::sort(ms.begin(), ms.end());
  r.ms_per_step_median = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  r.ms_per_step_min = ms.front();
  r.ms_per_step_max = ms.back();
  r.tokens_per_step = setup.task.tokens;
  r.tokens_per_s = static_cast<double>(r.tokens_per_step) / (r.ms_per_step_median * 1e-3);
  const memory::AllocatorStats s = alloc.stats();
  r.peak_allocated_bytes = s.peak_allocated_bytes;
  r.peak_reserved_bytes = s.peak_reserved_bytes;
  r.peak_rss_mib = peak_rss_mib();
  r.threads = get_num_threads();
  r.flash_attention_calls = flash_calls() - flash_calls_before;
  r.tensor_core_gemm_calls = tensor_core_calls().first - tc_calls_before.first;
  r.wgmma_gemm_calls = tensor_core_calls().second - tc_calls_before.second;
  return r;
}

std::string BenchTrainResult::to_json() const {
  nlohmann::ordered_json j;
  j["model"] = model;
  j["device"] = device;
  j["steps"] = steps;
  j["batch"] = batch;
  j["parameters"] = parameters;
  j["threads"] = threads;
  j["ms_per_step_median"] = ms_per_step_median;
  j["ms_per_step_min"] = ms_per_step_min;
  j["ms_per_step_max"] = ms_per_step_max;
  j["tokens_per_step"] = tokens_per_step;
  j["tokens_per_s"] = tokens_per_s;
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
  j["flash_attention_calls"] = flash_attention_calls;
  j["tensor_core_gemm_calls"] = tensor_core_gemm_calls;
  j["wgmma_gemm_calls"] = wgmma_gemm_calls;
  return j.dump();
}

}  // namespace ember::train
