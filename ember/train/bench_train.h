// The standard training configurations (mlp, cnn, gpt) and a timer for their AdamW training steps — what
// `ember bench train` runs, and what peer comparisons and memory tests use as "one step of each standard config".
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ember/core/tensor.h"
#include "ember/nn/module.h"
#include "ember/nn/transformer.h"

namespace ember::train {

// One standard configuration on a device: the model, one fixed batch, and the loss of the model on it.
//   mlp: 784-1024-1024-10 ReLU, batch 256, random inputs and labels;
//   cnn: the MNIST Net without dropout, batch 64, random 1×28×28 inputs;
//   gpt: nanoGPT's char config (4 layers, 4 heads, 128 wide, block 64, vocab 65), batch 12, random tokens;
//   gpt2: GPT-2 124M (gpt2_124m()), batch 4, random tokens — the GPU peer comparison's model.
struct StandardTask {
  std::string name;
  std::shared_ptr<nn::Module> model;
  Tensor inputs, targets;
  int64_t batch = 0;
  int64_t tokens = 0;            // what one step consumes: batch x block tokens for gpt/gpt2, batch samples otherwise
  std::function<Tensor()> loss;  // forward + cross-entropy on the batch (records the graph)
  // The same on any (inputs, targets) of the task's layout, e.g. a micro-batch: rows of the batch.
  std::function<Tensor(const Tensor& inputs, const Tensor& targets)> loss_on;
};
// GPT-2 124M as nanoGPT and llm.c train it: 12 layers, 12 heads, 768 wide, block 1024, vocab 50304, biases.
nn::GPTConfig gpt2_124m();

// ValueError for an unknown name (the message lists the known ones) or a negative batch; batch 0 takes the
// config's default above. Seeds the default generator with `seed`. The model is made on the host and moved to
// `device` before the batch is made there (on meta, the model is made on meta and the batch draws nothing from the
// generator: Note [Models built on meta] in bench_train.cpp).
StandardTask make_standard_task(const std::string& name, Device device, uint64_t seed = 0, int64_t batch = 0);

struct BenchTrainOptions {
  std::string model = "mlp";
  int64_t steps = 20;  // timed steps
  int64_t warmup = 3;  // untimed steps first (the allocator's cache fills, the optimizer state is created)
  Device device = Device::cpu();
  uint64_t seed = 0;
  std::string amp = "none";  // a mode parse_amp_mode takes (train/amp.h): none, fp16, bf16, autocast-fp16/-bf16
  // Activation checkpointing: a policy CheckpointPolicy::parse takes (none, sqrt, budget:SIZE). The plan is made once
  // from the task's batch before the first step (mlp: the Sequential's children are the blocks; gpt: its
  // transformer blocks; cnn: ValueError unless none).
  std::string checkpoint = "none";
  int64_t batch = 0;       // 0: the config's default
  int64_t grad_accum = 1;  // micro-batches per step (must divide the batch)
};

struct BenchTrainResult {
  std::string model, device;
  int64_t steps = 0, batch = 0, parameters = 0;
  int threads = 1;  // CPU threads of the kernels (get_num_threads) during the run
  double ms_per_step_median = 0, ms_per_step_min = 0, ms_per_step_max = 0;
  int64_t tokens_per_step = 0;       // StandardTask::tokens
  double tokens_per_s = 0;           // tokens_per_step over the median step time
  double peak_rss_mib = 0;           // the process's peak resident set (getrusage), MiB
  int64_t peak_allocated_bytes = 0;  // the device allocator's peak during the timed steps
  int64_t peak_reserved_bytes = 0;
  double first_loss = 0, last_loss = 0;
  std::string amp = "none";
  // Bytes by role after the last timed step's backward (before its optimizer step): weights, grads, fp32 masters,
  // optimizer state; activations = the bytes the last forward left allocated (saved for backward, and its outputs).
  int64_t weights_bytes = 0, grads_bytes = 0, master_bytes = 0, optimizer_state_bytes = 0, activation_bytes = 0;
  int64_t steps_skipped = 0;  // steps skipped for NaN/inf gradients (loss-scaled modes)
  std::string checkpoint = "none";
  // The checkpoint plan's predicted activation peak (Note [Checkpoint memory model]); for none the prediction without
  // checkpointing; 0 for cnn, which is not profiled.
  int64_t predicted_peak_bytes = 0;
  // Calls of the CUDA flash attention kernels (forward or backward) during the run: > 0 when the Flash path of
  // kernels/cuda/attention.h ran the model's attention, 0 on the tiled path, the CPU and builds without CUDA.
  int64_t flash_attention_calls = 0;
  // Products the hand-written CUDA GEMMs ran during the run (GemmStrategy::TensorCore, EMBER_GEMM=tensorcore), and
  // those of them on the Hopper wgmma kernel; 0 under cuBLASLt, on the CPU and in builds without CUDA.
  int64_t tensor_core_gemm_calls = 0, wgmma_gemm_calls = 0;
  std::string checkpoint_report;  // the plan's to_string() (empty when nothing was profiled); not in the JSON
  std::string to_json() const;    // one line
};

// Times AdamW (lr 1e-3) training steps — forward, backward, optimizer step, zero_grad(set_to_none) — of the
// standard config `options.model`, in the mixed-precision mode `options.amp` (ConfigError for an unknown one), under
// the checkpoint policy `options.checkpoint` (ConfigError for a bad spelling).
BenchTrainResult bench_train(const BenchTrainOptions& options);

}  // namespace ember::train
