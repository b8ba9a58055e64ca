// The peak-memory estimator: a dry run of training steps on the meta device (shapes and dtypes, no data, no compute)
// through the caching allocator's policy over an address-only simulated device (core/meta_scope.h), predicting the
// peak allocated and peak reserved bytes of the real steps — model, batch, activations, gradients, optimizer state,
// mixed-precision masters, checkpoint recomputation and kernel workspace — in milliseconds.
// Invariant: the estimate runs the very step code a real run uses (train/step.h), so predicted and measured numbers
// (measure_step) count the same allocations from the same starting point.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "ember/core/meta_scope.h"
#include "ember/memory/alloc_config.h"
#include "ember/train/amp.h"

namespace ember::train {

struct EstimateOptions {
  std::string model = "mlp";        // a standard config (bench_train.h): mlp | cnn | gpt
  int64_t batch = 0;                // 0: the config's default
  std::string amp = "none";         // parse_amp_mode: none, fp16, bf16, autocast-fp16, autocast-bf16
  std::string checkpoint = "none";  // CheckpointPolicy::parse: none, sqrt, budget:SIZE (cnn: none only)
  int64_t grad_accum = 1;           // micro-batches per step (must divide the batch)
  int64_t steps = 2;                // steps run; the peak is over all of them (optimizer state appears in step 1)
  uint64_t seed = 0;
  // The allocator policy to simulate; unset: the one the target's allocator applies — the CPU allocator's now
  // (memory::effective_config), so the estimate predicts what measure_step measures; for a CUDA target the policy a
  // CUDA allocator would take from EMBER_ALLOC_CONF (expandable segments included). Its capacity caps the simulated
  // device (OutOfMemoryError).
  std::optional<memory::AllocatorConfig> allocator;
  // The device the steps are predicted for (Note [Dry-run targets] in core/meta_scope.h): the CPU (the default), or
  // a CUDA device with its SM count, attention path and assumed library workspaces.
  MetaTarget target;
};

struct MemoryEstimate {
  std::string model, amp, checkpoint;  // empty for estimate_peak
  std::string device = "cpu";          // the target: "cpu" or "cuda"
  int64_t batch = 0, grad_accum = 1, steps = 0, parameters = 0;
  int64_t peak_allocated_bytes = 0;  // high-water mark of live allocations (after the allocator's rounding)
  int64_t peak_reserved_bytes = 0;   // high-water mark of the bytes held from the device
  // Bytes by role in the last step: weights, gradients, fp32 masters and optimizer state after its backward (state:
  // after its optimizer step), activations = what its forward left allocated. Zero for estimate_peak.
  MemoryBreakdown by_role;
  // Forward compute the checkpoint plan adds per step, as a fraction of one forward of the block chain, taken as the
  // recomputed blocks' share of the chain's activation bytes (deterministic on meta; Note [Plan cost model] in
  // memory_plan.h); 0 when nothing is recomputed.
  double recompute_fraction = 0.0;
  double seconds = 0.0;  // wall time of the dry run (or of the measured run)
  std::string to_string() const;  // one readable line
  std::string to_json() const;    // one JSON line
};

// The target of a dry run that stands in for `device` in this process: the CPU target for the CPU; for a CUDA
// device its SM count and the attention path in use (EMBER_ATTENTION / set_attention_strategy), with the library
// workspaces assumed 0. DeviceError when the device does not exist (or ember was built without CUDA).
MetaTarget meta_target_for(Device device);

// Dry-runs options.steps training steps of the standard config on meta and returns their peaks (from before the
// model existed). The model is built on the host and moved to meta, so its parameters' initial values cost host
// time and transient host memory, not simulated bytes. ConfigError/ValueError as make_training_setup; the simulated
// device's OutOfMemoryError when the policy's capacity is too small.
MemoryEstimate estimate_step(const EstimateOptions& options);

// The generic entry for user code: runs build_and_step inside a MetaAllocationScope with `config` and `target` (the
// device whose kernels' workspace is replayed, Note [Dry-run targets]) and returns the scope allocator's peaks.
// build_and_step should make its model, batch and optimizer on Device::meta() (or move them there) and run its steps;
// meta tensors it lets escape keep counting until they die.
MemoryEstimate estimate_peak(const std::function<void()>& build_and_step, const memory::AllocatorConfig& config,
                             const MetaTarget& target = MetaTarget::cpu());

// The same steps for real on the CPU, measured through memory::cpu_allocator(): its cache is emptied and its peaks
// reset first, and the bytes allocated (reserved) before the task is built are subtracted, so the numbers mean what
// estimate_step's do. options.allocator must be unset or equal the CPU allocator's effective policy, and the target
// the CPU (ValueError).
MemoryEstimate measure_step(const EstimateOptions& options);

}  // namespace ember::train
