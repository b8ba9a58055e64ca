// The subcommands of the `ember` program, each adding itself to the CLI11 app.
// Invariant: a subcommand reports failures by throwing ember::Error; main() turns that into exit status 1.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "ember/autograd/checkpoint_plan.h"
#include "ember/base/error.h"
#include "ember/train/amp.h"

namespace ember::tools {

// Accepts what autograd::CheckpointPolicy::parse takes (none, sqrt, budget:SIZE); CLI11 prints parse's message.
inline CLI::Validator checkpoint_policy_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          autograd::CheckpointPolicy::parse(text);
          return {};
        } catch (const Error& e) {
          return e.what();
        }
      },
      "none|sqrt|budget:SIZE");
}

// Accepts what train::parse_amp_mode takes (none or fp32, fp16, bf16, autocast-fp16, autocast-bf16).
inline CLI::Validator amp_mode_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          train::parse_amp_mode(text);
          return {};
        } catch (const Error& e) {
          return e.what();
        }
      },
      "none|fp32|fp16|bf16|autocast-fp16|autocast-bf16");
}

// `ember bench train --model mlp|cnn|gpt --steps N --device cpu|cuda[:N] [--warmup N] [--batch-size N]
// [--grad-accum N] [--json]`
void add_bench_command(CLI::App& app);

// `ember estimate --model mlp|cnn|gpt [--batch-size N] [--amp MODE] [--checkpoint POLICY] [--grad-accum N] [--json]`
void add_estimate_command(CLI::App& app);

// `ember plan --model mlp|cnn|gpt --budget SIZE [--batch-size N] [--amp a,b] [--checkpoint a,b] [--max-grad-accum N]
// [--device cpu|cuda] [--json]`
void add_plan_command(CLI::App& app);

// `ember mem summary|replay|compare|html TRACE ...` (docs/cli.md)
void add_mem_command(CLI::App& app);

// `ember train --model mnist-cnn|char-gpt|mlp|cnn|gpt ...` (docs/cli.md)
void add_train_command(CLI::App& app);

// `ember info [--json]`: devices, memory free/total, build options
void add_info_command(CLI::App& app);

}  // namespace ember::tools
