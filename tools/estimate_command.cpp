// `ember estimate`: predicts the peak allocated and peak reserved bytes of AdamW training steps of a standard config
// (ember/train/estimate.h) by a dry run on the meta device, and prints one readable line, or one JSON line with
// --json. Nothing is computed and no tensor bytes are allocated, so it answers in milliseconds for any batch size.
#include <cstdio>
#include <limits>
#include <memory>
#include <string>

#include "ember/autograd/checkpoint_plan.h"
#include "ember/base/error.h"
#include "ember/core/meta_scope.h"
#include "ember/memory/allocator.h"
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
  std::string device = "cpu";
  int sm_count = 0;  // 0: the device's where one is present, else 132
  std::string attention, conv, gemm_workspace = "0", conv_workspace = "0";
};

// The target of the dry run (Note [Dry-run targets] in ember/core/meta_scope.h): a present GPU's SM count and
// attention path unless the flags say otherwise; without one an H100's 132 SMs and the flash path.
MetaTarget target_of(const EstimateArgs& a) {
  const int64_t gemm_ws = memory::parse_bytes(a.gemm_workspace, "--gemm-workspace");
  const int64_t conv_ws = memory::parse_bytes(a.conv_workspace, "--conv-workspace");
  if (a.device == "cpu") {
    EMBER_CHECK(a.sm_count == 0 && a.attention.empty() && a.conv.empty() && gemm_ws == 0 && conv_ws == 0,
                ValueError, "estimate: --sm-count, --attention, --conv, --gemm-workspace and --conv-workspace describe "
                "a CUDA target; add --device cuda");
    return MetaTarget::cpu();
  }
  MetaTarget t = MetaTarget::cuda();
  if (a.sm_count == 0 || a.attention.empty() || a.conv.empty()) {
    try {
      t = train::meta_target_for(Device::cuda(0));
    } catch (const DeviceError&) {
      // no GPU here: the defaults stand in for one
    }
  }
  if (a.sm_count > 0) t.sm_count = a.sm_count;
  if (!a.attention.empty()) t.flash_attention = a.attention == "flash";
  if (!a.conv.empty()) t.conv_im2col = a.conv == "im2col";
  t.gemm_workspace_bytes = gemm_ws;
  t.conv_workspace_bytes = conv_ws;
  return t;
}

void run_estimate(const EstimateArgs& a) {
  train::EstimateOptions o;
  o.model = a.model;
  o.batch = a.batch;
  o.amp = a.amp;
  o.checkpoint = a.checkpoint;
  o.grad_accum = a.grad_accum;
  o.steps = a.steps;
  o.seed = a.seed;
  o.target = target_of(a);
  const train::MemoryEstimate e = train::estimate_step(o);
  std::printf("%s\n", a.json ? e.to_json().c_str() : e.to_string().c_str());
}

}  // namespace

void add_estimate_command(CLI::App& app) {
  auto args = std::make_shared<EstimateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "estimate", "predict the peak memory of AdamW training steps of a standard config (a dry run on meta, "
                  "through the allocator policy EMBER_ALLOC_CONF sets, with the workspace of the --device's "
                  "kernels)");
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
  cmd->add_option("--device", args->device, "the device the steps are predicted for: cpu | cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--sm-count", args->sm_count,
                  "cuda: streaming multiprocessors (default: the GPU's if one is present, else 132 as on an H100)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--attention", args->attention,
                  "cuda: attention path, tiled | flash (default: the GPU's, EMBER_ATTENTION, if one is present, else "
                  "flash)")
      ->check(CLI::IsMember({"tiled", "flash"}));
  cmd->add_option("--conv", args->conv,
                  "cuda: convolution path, cudnn | im2col (default: the GPU's, EMBER_CONV, if one is present, else "
                  "cudnn)")
      ->check(CLI::IsMember({"cudnn", "im2col"}));
  cmd->add_option("--gemm-workspace", args->gemm_workspace,
                  "cuda: cuBLASLt workspace each product takes (e.g. 4MiB; default 0: not known without the GPU)");
  cmd->add_option("--conv-workspace", args->conv_workspace,
                  "cuda: cuDNN workspace each convolution pass takes (default 0: not known without the GPU)");
  cmd->callback([args] { run_estimate(*args); });
}

}  // namespace ember::tools
