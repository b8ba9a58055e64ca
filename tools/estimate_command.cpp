// `ember estimate`: predicts the peak allocated and peak reserved bytes of AdamW training steps of a standard config
// (ember/train/estimate.h) by a dry run on the meta device, and prints one readable line, or one JSON line with
// --json. Nothing is computed and no tensor bytes are allocated, so it answers in milliseconds for any batch size.
#include <cstdio>
#include <limits>
#include <memory>
#include <string>

#include "ember/autograd/checkpoint_plan.h"
#include "ember/base/error.h"
#include "ember/train/estimate.h"
#include "tools/commands.h"

namespace ember::tools {

namespace {

struct EstimateArgs {
  std::string model = "mlp";
  int64_t batch = 0;
  std::string amp = "none";
  std::string checkpoint = "none";
  int64_t grad_accum = 1;
  int64_t steps = 2;
  uint64_t seed = 0;
  bool json = false;
};

void run_estimate(const EstimateArgs& a) {
  train::EstimateOptions o;
  o.model = a.model;
  o.batch = a.batch;
  o.amp = a.amp;
  o.checkpoint = a.checkpoint;
  o.grad_accum = a.grad_accum;
  o.steps = a.steps;
  o.seed = a.seed;
  const train::MemoryEstimate e = train::estimate_step(o);
  std::printf("%s\n", a.json ? e.to_json().c_str() : e.to_string().c_str());
}

}  // namespace

void add_estimate_command(CLI::App& app) {
  auto args = std::make_shared<EstimateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "estimate", "predict the peak memory of AdamW training steps of a standard config (a dry run on meta, "
                  "through the CPU allocator's policy; EMBER_ALLOC_CONF sets it)");
  cmd->add_option("--model", args->model, "mlp | cnn | gpt | gpt2 (GPT-2 124M)")->check(CLI::IsMember({"mlp", "cnn", "gpt", "gpt2"}));
  cmd->add_option("--batch-size", args->batch, "batch size (default: the config's)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  cmd->add_option("--amp", args->amp, "mixed precision: none | fp16 | bf16 | autocast-fp16 | autocast-bf16")
      ->check(amp_mode_validator());
  cmd->add_option("--checkpoint", args->checkpoint,
                  "activation checkpointing: none | sqrt | budget:SIZE (e.g. budget:8MiB); cnn: none only")
      ->check(checkpoint_policy_validator());
  cmd->add_option("--grad-accum", args->grad_accum, "micro-batches per step (must divide the batch)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  cmd->add_option("--steps", args->steps, "steps simulated (the optimizer state appears in the first)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  cmd->add_option("--seed", args->seed, "seed of the model");
  cmd->add_flag("--json", args->json, "print one JSON line");
  cmd->callback([args] { run_estimate(*args); });
}

}  // namespace ember::tools
