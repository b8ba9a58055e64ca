// `ember bench train`: times AdamW training steps of a standard config (ember/train/bench_train.h) and prints a
// human-readable line, or one JSON line with --json.
#include <cstdio>
#include <limits>
#include <memory>
#include <string>

#include "ember/autograd/checkpoint_plan.h"
#include "ember/base/error.h"
#include "ember/core/device.h"
#include "ember/core/parallel.h"
#include "ember/memory/allocator.h"
#include "ember/train/bench_train.h"
#include "tools/commands.h"

namespace ember::tools {

namespace {

struct BenchTrainArgs {
  std::string model = "mlp";
  int64_t steps = 20;
  int64_t warmup = 3;
  std::string device = "cpu";
  uint64_t seed = 0;
  std::string amp = "none";
  std::string checkpoint = "none";
  int64_t batch = 0;
  int64_t grad_accum = 1;
  int threads = 0;  // 0: the default (EMBER_NUM_THREADS or the CPUs available)
  bool json = false;
};

void run_bench_train(const BenchTrainArgs& a) {
  train::BenchTrainOptions o;
  o.model = a.model;
  o.steps = a.steps;
  o.warmup = a.warmup;
  o.device = Device(a.device);
  o.seed = a.seed;
  o.amp = a.amp;
  o.checkpoint = a.checkpoint;
  o.batch = a.batch;
  o.grad_accum = a.grad_accum;
  if (a.threads > 0) set_num_threads(a.threads);
  const train::BenchTrainResult r = train::bench_train(o);
  if (a.json) {
    std::printf("%s\n", r.to_json().c_str());
    return;
  }
  std::printf("%s on %s: batch %lld, %lld parameters, %lld steps: median %.2f ms/step (min %.2f, max %.2f); "
              "loss %.4f -> %.4f; peak allocated %s, peak reserved %s, peak RSS %.1f MiB\n",
              r.model.c_str(), r.device.c_str(), static_cast<long long>(r.batch),
              static_cast<long long>(r.parameters), static_cast<long long>(r.steps), r.ms_per_step_median,
              r.ms_per_step_min, r.ms_per_step_max, r.first_loss, r.last_loss,
              memory::format_bytes(r.peak_allocated_bytes).c_str(),
              memory::format_bytes(r.peak_reserved_bytes).c_str(), r.peak_rss_mib);
  std::printf("  precision %s: weights %s, grads %s, fp32 masters %s, optimizer state %s, activations %s; "
              "%lld steps skipped\n",
              r.amp.c_str(), memory::format_bytes(r.weights_bytes).c_str(), memory::format_bytes(r.grads_bytes).c_str(),
              memory::format_bytes(r.master_bytes).c_str(), memory::format_bytes(r.optimizer_state_bytes).c_str(),
              memory::format_bytes(r.activation_bytes).c_str(), static_cast<long long>(r.steps_skipped));
  if (!r.checkpoint_report.empty())
    std::printf("  %s\n", r.checkpoint_report.c_str());
  else
    std::printf("  checkpoint %s\n", r.checkpoint.c_str());
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  auto args = std::make_shared<BenchTrainArgs>();
  CLI::App* train = bench->add_subcommand("train", "time AdamW training steps of a standard config");
  train->add_option("--model", args->model, "mlp | cnn | gpt | gpt2 (GPT-2 124M)")->check(CLI::IsMember({"mlp", "cnn", "gpt", "gpt2"}));
  train->add_option("--steps", args->steps, "timed steps")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  train->add_option("--warmup", args->warmup, "untimed steps first")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  train->add_option("--device", args->device, "cpu | cuda | cuda:N");
  train->add_option("--seed", args->seed, "seed of the model and the batch");
  train->add_option("--amp", args->amp, "mixed precision: none | fp16 | bf16 | autocast-fp16 | autocast-bf16")
      ->check(amp_mode_validator());
  train->add_option("--checkpoint", args->checkpoint,
                    "activation checkpointing: none | sqrt | budget:SIZE (e.g. budget:8MiB), planned once before the "
                    "first step")
      ->check(checkpoint_policy_validator());
  train->add_option("--batch-size", args->batch, "batch size (default: the config's)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  train->add_option("--grad-accum", args->grad_accum, "micro-batches per step (must divide the batch)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  train->add_option("--threads", args->threads, "CPU threads of the kernels (default: EMBER_NUM_THREADS or every CPU)")
      ->check(CLI::Range(1, 1024));
  train->add_flag("--json", args->json, "print one JSON line");
  train->callback([args] { run_bench_train(*args); });
}

}  // namespace ember::tools
