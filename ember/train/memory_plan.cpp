// Training plans under a memory budget (memory_plan.h): candidates dry-run through the estimator, costed by Note
// [Plan cost model], ranked.
#include "ember/train/memory_plan.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ember/autograd/checkpoint_plan.h"
#include "ember/base/error.h"
#include "ember/memory/allocator.h"
#include "ember/memory/cpu_allocator.h"
#include "ember/memory/address_only.h"
#include "ember/nn/layers.h"
#include "ember/nn/transformer.h"
#include "ember/train/amp.h"
#include "ember/train/bench_train.h"
#include "ember/train/estimate.h"

namespace ember::train {

namespace {

double default_precision_factor(DeviceType device, AmpMode mode) {
  if (device == DeviceType::CUDA) {
    switch (mode) {
      case AmpMode::none: return 1.0;
      case AmpMode::fp16:
      case AmpMode::bf16: return 0.5;
      case AmpMode::autocast_fp16:
      case AmpMode::autocast_bf16: return 0.55;
    }
  }
  switch (mode) {  // CPU: bench/RESULTS.md, GPT step times relative to fp32
    case AmpMode::none: return 1.0;
    case AmpMode::bf16:
    case AmpMode::autocast_bf16: return 1.06;
    case AmpMode::fp16:
    case AmpMode::autocast_fp16: return 1.42;
  }
  return 1.0;
}

double precision_factor(const PlanOptions& o, AmpMode mode) {
  for (const auto& [name, factor] : o.precision_factors)
    if (parse_amp_mode(name) == mode) {
      EMBER_CHECK(factor > 0.0, ValueError, "plan_training: the precision factor for ", name, " must be > 0, got ",
                  factor);
      return factor;
    }
  return default_precision_factor(o.device, mode);
}

// The dry run's target for the plan's device (Note [Dry-run targets]): a present GPU's SM count and attention path,
// else an H100's defaults.
MetaTarget plan_target(DeviceType device) {
  if (device != DeviceType::CUDA) return MetaTarget::cpu();
  try {
    return meta_target_for(Device::cuda(0));
  } catch (const Error&) {
    return MetaTarget::cuda();
  }
}

bool cheaper(const PlanCandidate& a, const PlanCandidate& b) {
  if (a.fits != b.fits) return a.fits;
  if (a.fits) {
    if (a.relative_cost != b.relative_cost) return a.relative_cost < b.relative_cost;
    return a.predicted_peak_reserved < b.predicted_peak_reserved;
  }
  if (a.predicted_peak_reserved != b.predicted_peak_reserved)
    return a.predicted_peak_reserved < b.predicted_peak_reserved;
  return a.relative_cost < b.relative_cost;
}

}  // namespace

const PlanCandidate* TrainingPlan::best() const {
  return !candidates.empty() && candidates.front().fits ? &candidates.front() : nullptr;
}

std::string TrainingPlan::to_string() const {
  std::ostringstream os;
  os << "training plans for " << model << ", effective batch " << batch << ", budget "
     << memory::format_bytes(budget_bytes) << " (" << candidates.size() << " candidates estimated in ";
  char buf[200];
  std::snprintf(buf, sizeof buf, "%.0f ms)\n", seconds * 1e3);
  os << buf;
  std::snprintf(buf, sizeof buf, "  %-14s %-16s %6s %6s %14s %14s %6s  %s\n", "amp", "checkpoint", "micro", "accum",
                "peak alloc", "peak reserved", "cost", "fits");
  os << buf;
  const PlanCandidate* pick = best();
  for (const PlanCandidate& c : candidates) {
    std::snprintf(buf, sizeof buf, "%s %-14s %-16s %6lld %6lld %14s %14s %5.2fx  %s\n", &c == pick ? "*" : " ",
                  c.amp.c_str(), c.checkpoint.c_str(), static_cast<long long>(c.micro_batch),
                  static_cast<long long>(c.grad_accum), memory::format_bytes(c.predicted_peak_allocated).c_str(),
                  memory::format_bytes(c.predicted_peak_reserved).c_str(), c.relative_cost, c.fits ? "yes" : "no");
    os << buf;
  }
  if (pick == nullptr) os << "  nothing fits the budget: the first row comes closest\n";
  return os.str();
}

std::string TrainingPlan::to_json() const {
  nlohmann::json j;
  j["model"] = model;
  j["batch"] = batch;
  j["budget_bytes"] = budget_bytes;
  j["seconds"] = seconds;
  nlohmann::json rows = nlohmann::json::array();
  for (const PlanCandidate& c : candidates)
    rows.push_back({{"amp", c.amp},
                    {"checkpoint", c.checkpoint},
                    {"micro_batch", c.micro_batch},
                    {"grad_accum", c.grad_accum},
                    {"predicted_peak_allocated_bytes", c.predicted_peak_allocated},
                    {"predicted_peak_reserved_bytes", c.predicted_peak_reserved},
                    {"recompute_fraction", c.recompute_fraction},
                    {"relative_cost", c.relative_cost},
                    {"fits", c.fits}});
  j["candidates"] = rows;
  j["best"] = best() ? static_cast<int64_t>(0) : static_cast<int64_t>(-1);
  return j.dump();
}

// Note [Fitting a budget]
// A candidate is first dry-run on an unbounded simulated device: its peak reserved bytes are what the step reserves
// when nothing stops the cache from growing. When that is over the budget, it is run again on a simulated device of
// exactly the budget's capacity, where the allocator frees its cache and retries before giving up, as the real one
// does: a step that completes there fits (its peaks are then the constrained run's), one that raises
// OutOfMemoryError does not (its peaks stay the unbounded run's).
TrainingPlan plan_training(const PlanOptions& o) {
  EMBER_CHECK(o.budget_bytes > 0, ValueError, "plan_training: the budget must be > 0 bytes, got ", o.budget_bytes);
  EMBER_CHECK(!o.amps.empty() && !o.checkpoints.empty(), ValueError,
              "plan_training: give at least one precision and one checkpoint policy");
  EMBER_CHECK(o.max_grad_accum >= 1, ValueError, "plan_training: max_grad_accum must be >= 1, got ", o.max_grad_accum);
  EMBER_CHECK(o.accum_overhead >= 0.0, ValueError, "plan_training: accum_overhead must be >= 0, got ",
              o.accum_overhead);
  for (const auto& [name, factor] : o.precision_factors) {  // every override, planned precision or not
    parse_amp_mode(name);
    EMBER_CHECK(factor > 0.0, ValueError, "plan_training: the precision factor for ", name, " must be > 0, got ",
                factor);
  }
  const auto t0 = std::chrono::steady_clock::now();
  TrainingPlan plan;
  plan.model = o.model;
  plan.budget_bytes = o.budget_bytes;
  // The config on meta, outside any scope (byte-free): its default batch, and whether it has a block chain to
  // checkpoint. ValueError for an unknown config or a negative batch.
  const StandardTask probe = make_standard_task(o.model, Device::meta(), /*seed=*/0, o.batch);
  plan.batch = probe.batch;
  const bool has_chain = dynamic_cast<const nn::GPT*>(probe.model.get()) != nullptr ||
                         dynamic_cast<const nn::Sequential*>(probe.model.get()) != nullptr;
  // A config without a block chain (cnn) runs without checkpointing only: the other policies are left out.
  // A policy or precision listed twice (or under two spellings: fp32 and none) is planned once.
  std::vector<std::string> checkpoints;
  std::set<std::string> seen_policies;
  for (const std::string& checkpoint : o.checkpoints) {
    const autograd::CheckpointPolicy policy = autograd::CheckpointPolicy::parse(checkpoint);  // ConfigError
    if (!seen_policies.insert(policy.str()).second) continue;
    if (has_chain || policy.kind == autograd::CheckpointPolicy::Kind::none) checkpoints.push_back(checkpoint);
  }
  EMBER_CHECK(!checkpoints.empty(), ValueError, "plan_training: the ", o.model,
              " config has no block chain to checkpoint; include the policy none");
  const MetaTarget target = plan_target(o.device);
  std::set<AmpMode> seen_modes;
  for (const std::string& amp : o.amps) {
    const AmpMode mode = parse_amp_mode(amp);
    if (!seen_modes.insert(mode).second) continue;
    const double precision = precision_factor(o, mode);
    for (const std::string& checkpoint : checkpoints) {
      for (int64_t k = 1; k <= std::min(o.max_grad_accum, plan.batch); k *= 2) {
        if (plan.batch % k != 0) continue;
        EstimateOptions e;
        e.model = o.model;
        e.batch = plan.batch;
        e.amp = amp;
        e.checkpoint = checkpoint;
        e.grad_accum = k;
        e.target = target;
        memory::AllocatorConfig policy = o.allocator.value_or(
            target.is_cuda() ? memory::alloc_config_from_env() : memory::effective_config(memory::cpu_allocator()));
        policy.capacity = memory::kNoLimit;  // Note [Fitting a budget]
        e.allocator = policy;
        MemoryEstimate est = estimate_step(e);
        bool fits = est.peak_reserved_bytes <= o.budget_bytes;
        if (!fits) {
          policy.capacity = o.budget_bytes;
          e.allocator = policy;
          try {
            est = estimate_step(e);
            fits = true;
          } catch (const OutOfMemoryError&) {
          }
        }
        PlanCandidate c;
        c.amp = amp_mode_name(mode);
        c.checkpoint = est.checkpoint;
        c.micro_batch = plan.batch / k;
        c.grad_accum = k;
        c.predicted_peak_allocated = est.peak_allocated_bytes;
        c.predicted_peak_reserved = est.peak_reserved_bytes;
        c.recompute_fraction = est.recompute_fraction;
        c.relative_cost =
            precision * (1.0 + c.recompute_fraction / 3.0) * (1.0 + o.accum_overhead * static_cast<double>(k - 1));
        c.fits = fits;
        plan.candidates.push_back(c);
        if (c.fits) break;  // more accumulation only costs more
      }
    }
  }
  std::stable_sort(plan.candidates.begin(), plan.candidates.end(), cheaper);
  plan.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}

}  // namespace ember::train
