// Training plans under a memory budget: for a standard config and an effective batch, every combination of mixed
// precision, activation checkpointing and gradient accumulation is dry-run through the peak-memory estimator
// (estimate.h), and the candidates are ranked — those that fit first, cheapest first — with their predicted peaks
// and relative step costs (Note [Plan cost model]).
// Invariant: a candidate's micro-batch times its accumulation is the effective batch; "fits" means the predicted
// peak reserved bytes are within the budget.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ember/core/device.h"
#include "ember/memory/alloc_config.h"

namespace ember::train {

// Note [Plan cost model]
// A candidate's step time relative to fp32, no checkpointing, no accumulation:
//     precision_factor(amp) x (1 + recompute_fraction / 3) x (1 + accum_overhead x (grad_accum - 1))
// - precision_factor: the device's speed of each mode relative to fp32. CPU defaults are ember's measured GPT step
//   times on the 2-vCPU reference machine (bench/RESULTS.md: bf16 1.06x, fp16 1.42x — the CPU computes half
//   precision in f32 and pays for conversions); CUDA defaults assume tensor cores (0.5x for fp16/bf16, 0.55x for the
//   autocast modes that keep fp32 weights) until the GPU benchmarks replace them.
// - recompute_fraction: the share of the forward that checkpointing runs again, taken as the recomputed blocks'
//   share of the chain's activation bytes (recomputation re-creates exactly those bytes; on meta there are no
//   times to use); a forward is a third of a step (backward costs about two forwards).
// - accum_overhead: per extra micro-batch (smaller kernels, one more pass over the weights); 2% by default.
// The factors are options, so a user who measured their device can put their own numbers in.
struct PlanOptions {
  std::string model = "gpt";   // a standard config (bench_train.h)
  int64_t batch = 0;           // the effective batch (0: the config's default)
  int64_t budget_bytes = 0;    // the device memory the step may reserve (> 0)
  std::vector<std::string> amps = {"none", "bf16", "fp16"};
  std::vector<std::string> checkpoints = {"none", "sqrt"};  // a config without a block chain (cnn) plans none only
  int64_t max_grad_accum = 64;  // accumulation tried: 1, 2, 4, ... dividing the batch, up to this
  DeviceType device = DeviceType::CPU;  // whose default precision factors and kernel workspace apply
  std::vector<std::pair<std::string, double>> precision_factors;  // overrides, e.g. {{"fp16", 0.6}}
  double accum_overhead = 0.02;
  std::optional<memory::AllocatorConfig> allocator;  // the policy to simulate (unset: the device's allocator's)
};

struct PlanCandidate {
  std::string amp, checkpoint;
  int64_t micro_batch = 0, grad_accum = 1;
  int64_t predicted_peak_allocated = 0, predicted_peak_reserved = 0;
  double recompute_fraction = 0.0;
  double relative_cost = 1.0;  // Note [Plan cost model]
  bool fits = false;
};

struct TrainingPlan {
  int64_t batch = 0, budget_bytes = 0;
  std::string model;
  std::vector<PlanCandidate> candidates;  // fitting ones by cost (ties: less memory), then the rest by peak
  double seconds = 0.0;                   // time spent estimating
  const PlanCandidate* best() const;      // the cheapest that fits; null when none does
  std::string to_string() const;          // a table, the best marked
  std::string to_json() const;            // one JSON line
};

// For each precision and checkpoint policy, the accumulations 1, 2, 4, ... (dividing the batch, up to
// max_grad_accum) are estimated until one fits (more accumulation only costs more). A config without a block chain
// (cnn) leaves out every checkpoint policy but none. ValueError for a budget <= 0, a negative batch, an empty list,
// a precision factor <= 0, or no none among the policies of a config without a block chain; ConfigError for unknown
// spellings (in precision_factors too).
TrainingPlan plan_training(const PlanOptions& options);

}  // namespace ember::train
