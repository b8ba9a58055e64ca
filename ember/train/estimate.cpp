// The peak-memory estimator and its measurement (estimate.h).
// Invariant: estimate_step and measure_step differ only in the device and the allocator they read; both build the
// task with make_training_setup and step it with run_training_step.
#include "ember/train/estimate.h"

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ember/base/error.h"
#include "ember/core/generator.h"
#include "ember/core/meta_scope.h"
#include "ember/kernels/cuda/attention.h"
#include "ember/kernels/cuda/conv.h"
#include "ember/kernels/cuda/device_info.h"
#include "ember/memory/address_only.h"
#include "ember/memory/cpu_allocator.h"
#include "ember/train/step.h"

namespace ember::train {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

TrainingOptions training_options(const EstimateOptions& o, Device device) {
  EMBER_CHECK(o.steps >= 1, ValueError, "estimate: steps must be >= 1, got ", o.steps);
  TrainingOptions t;
  t.model = o.model;
  t.device = device;
  t.seed = o.seed;
  t.batch = o.batch;
  t.amp = o.amp;
  t.checkpoint = o.checkpoint;
  t.grad_accum = o.grad_accum;
  return t;
}

// Builds the task on `device` and runs the steps; fills everything but the peaks and the time.
MemoryEstimate run_steps(const EstimateOptions& o, Device device) {
  TrainingSetup setup = make_training_setup(training_options(o, device));
  MemoryEstimate e;
  e.model = o.model;
  e.amp = amp_mode_name(setup.trainer->mode());
  e.checkpoint = setup.policy.str();
  e.batch = setup.task.batch;
  e.grad_accum = setup.grad_accum;
  e.steps = o.steps;
  e.parameters = setup.task.model->num_parameters();
  // Note [Plan cost model] (memory_plan.h): the recomputed blocks' share of the chain's activation bytes — on meta
  // there are no times to use, and bytes make the estimate deterministic.
  if (setup.policy.kind != autograd::CheckpointPolicy::Kind::none && setup.plan.activation_bytes > 0)
    e.recompute_fraction = double(setup.plan.recomputed_bytes) / double(setup.plan.activation_bytes);
  StepRecord record;
  for (int64_t i = 0; i < o.steps; ++i) run_training_step(setup, i + 1 == o.steps ? &record : nullptr);
  e.by_role = record.after_backward;
  e.by_role.optimizer_state = record.optimizer_state_bytes;
  e.by_role.activations = record.activation_bytes;
  return e;
}

memory::AllocatorConfig cpu_policy() { return memory::effective_config(memory::cpu_allocator()); }

}  // namespace

MetaTarget meta_target_for(Device device) {
  EMBER_CHECK(device.is_cpu() || device.is_cuda(), ValueError, "meta_target_for: a dry run stands in for the cpu or a "
              "cuda device, not ", device.str());
  if (device.is_cpu()) return MetaTarget::cpu();
  MetaTarget t = MetaTarget::cuda();
#if defined(EMBER_WITH_CUDA)
  t.sm_count = cuda::device_properties(device.index).sm_count;
  t.flash_attention = cuda::attention_strategy() == cuda::AttentionStrategy::Flash &&
                      cuda::device_properties(device.index).major >= 8;  // the flash kernels need sm_80
  t.conv_im2col = cuda::conv_strategy() == cuda::ConvStrategy::Im2col;
  t.im2col_chunk_bytes = cuda::im2col_chunk_bytes();
#else
  EMBER_THROW(DeviceError, "meta_target_for: ", device.str(), ": ember was built without CUDA");
#endif
  return t;
}

MemoryEstimate estimate_step(const EstimateOptions& o) {
  const auto t0 = Clock::now();
  // The standard task seeds the default generator: a dry run in the middle of training leaves its stream as it was.
  const PhiloxState rng = default_generator().state();
  struct RestoreRng {
    PhiloxState state;
    ~RestoreRng() { default_generator().set_state(state); }
  } restore_rng{rng};
  MetaAllocationScope scope(o.allocator.value_or(o.target.is_cuda() ? memory::alloc_config_from_env() : cpu_policy()),
                            o.target);
  MemoryEstimate e = run_steps(o, Device::meta());  // every meta tensor of the run is dead when it returns
  e.device = device_type_name(o.target.device);
  const memory::AllocatorStats s = scope.allocator().stats();
  e.peak_allocated_bytes = s.peak_allocated_bytes;
  e.peak_reserved_bytes = s.peak_reserved_bytes;
  e.seconds = since(t0);
  return e;
}

MemoryEstimate estimate_peak(const std::function<void()>& build_and_step, const memory::AllocatorConfig& config,
                             const MetaTarget& target) {
  EMBER_CHECK(static_cast<bool>(build_and_step), ValueError, "estimate_peak: no function to run");
  const auto t0 = Clock::now();
  MetaAllocationScope scope(config, target);
  build_and_step();
  const memory::AllocatorStats s = scope.allocator().stats();
  MemoryEstimate e;
  e.device = device_type_name(target.device);
  e.steps = 0;
  e.peak_allocated_bytes = s.peak_allocated_bytes;
  e.peak_reserved_bytes = s.peak_reserved_bytes;
  e.seconds = since(t0);
  return e;
}

MemoryEstimate measure_step(const EstimateOptions& o) {
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  EMBER_CHECK(!o.target.is_cuda(), ValueError, "measure_step: measures steps on the CPU; a CUDA target is for "
              "estimate_step (run the steps on the GPU and read its allocator to measure them there)");
  if (o.allocator.has_value()) {
    const std::string want = o.allocator->str(), have = cpu_policy().str();
    EMBER_CHECK(want == have, ValueError, "measure_step: the CPU allocator applies '", have,
                "', not the requested policy '", want, "' (configure_cpu_allocator first)");
  }
  const auto t0 = Clock::now();
  alloc.empty_cache();
  alloc.reset_peak_stats();
  const memory::AllocatorStats before = alloc.stats();
  MemoryEstimate e = run_steps(o, Device::cpu());
  const memory::AllocatorStats s = alloc.stats();
  e.peak_allocated_bytes = s.peak_allocated_bytes - before.allocated_bytes;
  e.peak_reserved_bytes = s.peak_reserved_bytes - before.reserved_bytes;
  e.seconds = since(t0);
  return e;
}

std::string MemoryEstimate::to_string() const {
  std::ostringstream os;
  if (!model.empty()) {
    os << model << " batch " << batch;
    if (device != "cpu") os << " on " << device;
    if (grad_accum > 1) os << " (" << grad_accum << " micro-batches)";
    os << ", amp " << amp << ", checkpoint " << checkpoint << ", " << steps << " steps: ";
  }
  os << "peak allocated " << memory::format_bytes(peak_allocated_bytes) << ", peak reserved "
     << memory::format_bytes(peak_reserved_bytes);
  if (!model.empty()) os << " (" << by_role.to_string() << ")";
  char ms[32];
  std::snprintf(ms, sizeof ms, "%.1f", seconds * 1e3);
  os << " in " << ms << " ms";
  return os.str();
}

std::string MemoryEstimate::to_json() const {
  nlohmann::ordered_json j;
  j["model"] = model;
  j["device"] = device;
  j["batch"] = batch;
  j["amp"] = amp;
  j["checkpoint"] = checkpoint;
  j["grad_accum"] = grad_accum;
  j["steps"] = steps;
  j["parameters"] = parameters;
  j["peak_allocated_bytes"] = peak_allocated_bytes;
  j["peak_reserved_bytes"] = peak_reserved_bytes;
  j["weights_bytes"] = by_role.weights;
  j["grads_bytes"] = by_role.grads;
  j["master_bytes"] = by_role.master_weights;
  j["master_grads_bytes"] = by_role.master_grads;
  j["optimizer_state_bytes"] = by_role.optimizer_state;
  j["activation_bytes"] = by_role.activations;
  j["recompute_fraction"] = recompute_fraction;
  j["ms"] = seconds * 1e3;
  return j.dump();
}

}  // namespace ember::train
