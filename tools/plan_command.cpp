// `ember plan`: for a standard config, an effective batch and a memory budget, dry-runs every combination of mixed
// precision, activation checkpointing and gradient accumulation through the estimator (ember/train/memory_plan.h)
// and prints the candidates ranked — the cheapest that fits first — or one JSON line with --json. Exit status 0 also
// when nothing fits (the table says so); bad options exit 1.
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ember/memory/allocator.h"
#include "ember/train/memory_plan.h"
#include "tools/commands.h"

namespace ember::tools {

namespace {

struct PlanArgs {
  std::string model = "gpt";
  int64_t batch = 0;
  std::string budget;
  std::vector<std::string> amps = {"none", "bf16", "fp16"};
  std::vector<std::string> checkpoints = {"none", "sqrt"};
  int64_t max_grad_accum = 64;
  std::string device = "cpu";
  bool json = false;
};

void run_plan(const PlanArgs& a) {
  train::PlanOptions o;
  o.model = a.model;
  o.batch = a.batch;
  o.budget_bytes = memory::parse_bytes(a.budget, "--budget");
  EMBER_CHECK(o.budget_bytes > 0, ValueError, "--budget must be more than 0 bytes, got \"", a.budget, "\"");
  o.amps = a.amps;
  o.checkpoints = a.checkpoints;
  o.max_grad_accum = a.max_grad_accum;
  o.device = a.device == "cuda" ? DeviceType::CUDA : DeviceType::CPU;
  const train::TrainingPlan plan = train::plan_training(o);
  std::printf("%s%s", a.json ? plan.to_json().c_str() : plan.to_string().c_str(), a.json ? "\n" : "");
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "rank precision x checkpointing x accumulation plans of a standard config that fit a memory budget "
              "(dry runs through the estimator)");
  cmd->add_option("--model", args->model, "mlp | cnn | gpt | gpt2 (GPT-2 124M)")->check(CLI::IsMember({"mlp", "cnn", "gpt", "gpt2"}));
  cmd->add_option("--batch-size", args->batch, "effective batch (default: the config's)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  cmd->add_option("--budget", args->budget, "memory the step may reserve, e.g. 512MiB")->required();
  cmd->add_option("--amp", args->amps, "precisions to consider (default: none bf16 fp16)")
      ->delimiter(',')
      ->check(amp_mode_validator());
  cmd->add_option("--checkpoint", args->checkpoints, "checkpoint policies to consider (default: none sqrt)")
      ->delimiter(',')
      ->check(checkpoint_policy_validator());
  cmd->add_option("--max-grad-accum", args->max_grad_accum, "largest accumulation tried (powers of two)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--device", args->device, "whose relative speeds of the precisions apply: cpu | cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--json", args->json, "print one JSON line");
  cmd->callback([args] { run_plan(*args); });
}

}  // namespace ember::tools
