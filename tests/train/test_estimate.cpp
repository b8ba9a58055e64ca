// The peak-memory estimator (ember/train/estimate.h), issue 10 item 2. Acceptance: the predicted peak allocated
// bytes of training steps of the standard configs lie within 3% — peak reserved within 5% — of the peaks measured
// through the CPU allocator when the same steps run for real, over batch sizes, precisions, checkpoint policies and
// gradient accumulation. The reference is the measurement (measure_step), a real run on the CPU; bytes by role are
// checked against parameter counts worked out by hand, and the generic entry against hand-computed size classes.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "ember/autograd/checkpoint_plan.h"
#include "ember/core/meta_scope.h"
#include "ember/memory/address_only.h"
#include "ember/memory/cpu_allocator.h"
#include "ember/nn/layers.h"
#include "ember/nn/models.h"
#include "ember/optim/adam.h"
#include "ember/train/estimate.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

constexpr int64_t kMiB = 1024 * 1024;

struct Config {
  const char* model;
  int64_t batch;
  const char* amp;
  const char* checkpoint;
  int64_t grad_accum;
};

std::ostream& operator<<(std::ostream& os, const Config& c) {
  return os << c.model << " batch " << c.batch << " " << c.amp << " " << c.checkpoint << " accum " << c.grad_accum;
}

train::EstimateOptions options_of(const Config& c) {
  train::EstimateOptions o;
  o.model = c.model;
  o.batch = c.batch;
  o.amp = c.amp;
  o.checkpoint = c.checkpoint;
  o.grad_accum = c.grad_accum;
  return o;
}

// Budget plans are chosen from a profile that includes each block's backward transient (Note [Backward transients]
// in autograd/checkpoint_plan.cpp); a dry run matches a real run's plan only if the profile measures that transient
// on meta too, through the scope's allocator.
bool meta_profiles_backward() {
  MetaAllocationScope scope;
  auto lin = std::make_shared<nn::Linear>(64, 64);
  lin->to(Device::meta());
  const std::vector<autograd::BlockProfile> p = autograd::profile_chain(
      {[lin](const Tensor& x) { return lin->forward(x); }}, empty({32, 64}, TensorOptions(DType::f32, Device::meta())));
  return p.front().backward_bytes > 0;
}

double relative_error(int64_t predicted, int64_t measured) {
  return static_cast<double>(predicted - measured) / static_cast<double>(measured);
}

class EstimateAccuracy : public ::testing::TestWithParam<Config> {};

TEST_P(EstimateAccuracy, PredictsTheMeasuredPeaks) {
  const Config c = GetParam();
  if (std::string(c.checkpoint).rfind("budget:", 0) == 0)
    ASSERT_TRUE(meta_profiles_backward()) << "the checkpoint profile measures no backward transient on meta, so a "
                                             "budget plan made on meta is not the real run's";
  const train::EstimateOptions o = options_of(c);
  const train::MemoryEstimate e = train::estimate_step(o);
  const train::MemoryEstimate m = train::measure_step(o);
  const double alloc = relative_error(e.peak_allocated_bytes, m.peak_allocated_bytes);
  const double reserved = relative_error(e.peak_reserved_bytes, m.peak_reserved_bytes);
  std::printf("[ estimate ] %-4s %4lld %-14s %-12s accum %lld: predicted %s / %s, measured %s / %s "
              "(allocated %+.2f%%, reserved %+.2f%%); dry run %.1f ms, real run %.1f ms\n",
              c.model, static_cast<long long>(c.batch), c.amp, c.checkpoint, static_cast<long long>(c.grad_accum),
              memory::format_bytes(e.peak_allocated_bytes).c_str(), memory::format_bytes(e.peak_reserved_bytes).c_str(),
              memory::format_bytes(m.peak_allocated_bytes).c_str(), memory::format_bytes(m.peak_reserved_bytes).c_str(),
              100 * alloc, 100 * reserved, e.seconds * 1e3, m.seconds * 1e3);
  EXPECT_LE(std::abs(alloc), 0.03) << e.to_string() << "\nmeasured: " << m.to_string();
  EXPECT_LE(std::abs(reserved), 0.05) << e.to_string() << "\nmeasured: " << m.to_string();
  // The two runs describe the same steps.
  EXPECT_EQ(e.batch, m.batch);
  EXPECT_EQ(e.parameters, m.parameters);
  EXPECT_EQ(e.by_role.weights, m.by_role.weights);
  EXPECT_EQ(e.by_role.optimizer_state, m.by_role.optimizer_state);
  EXPECT_EQ(e.by_role.activations, m.by_role.activations);
}

// Small batches keep the real runs short (the file runs under the sanitizer build too); every model, precision,
// checkpoint policy and accumulation appears.
INSTANTIATE_TEST_SUITE_P(
    StandardConfigs, EstimateAccuracy,
    ::testing::Values(Config{"mlp", 64, "none", "none", 1}, Config{"mlp", 256, "fp16", "sqrt", 1},
                      Config{"mlp", 128, "autocast-fp16", "budget:1MiB", 1}, Config{"mlp", 512, "bf16", "none", 1},
                      Config{"mlp", 128, "autocast-bf16", "sqrt", 2}, Config{"cnn", 16, "none", "none", 1},
                      Config{"cnn", 32, "fp16", "none", 1}, Config{"cnn", 16, "autocast-fp16", "none", 1},
                      Config{"cnn", 24, "bf16", "none", 2}, Config{"gpt", 4, "none", "none", 1},
                      Config{"gpt", 8, "autocast-fp16", "sqrt", 1}, Config{"gpt", 4, "bf16", "sqrt", 1},
                      Config{"gpt", 12, "fp16", "budget:8MiB", 1}, Config{"gpt", 8, "none", "budget:6MiB", 1},
                      Config{"gpt", 8, "autocast-fp16", "none", 4}));

TEST(Estimate, BytesByRoleByHand) {
  // mlp 784-1024-1024-10: P parameters in 6 tensors.
  const int64_t P = 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10;
  train::EstimateOptions o;
  o.model = "mlp";
  const train::MemoryEstimate e = train::estimate_step(o);
  EXPECT_EQ(e.batch, 256);
  EXPECT_EQ(e.parameters, P);
  EXPECT_EQ(e.by_role.weights, 4 * P);
  EXPECT_EQ(e.by_role.grads, 4 * P);
  EXPECT_EQ(e.by_role.optimizer_state, 2 * 4 * P + 6 * 8);  // AdamW's two moments and an f64 step count per tensor
  // The forward keeps the inputs of the three Linear layers' weight gradients and the ReLU outputs: at least the
  // two [256, 1024] ReLU outputs.
  EXPECT_GE(e.by_role.activations, 2 * 256 * 1024 * 4);
  EXPECT_GE(e.peak_allocated_bytes, 16 * P) << "weights, gradients and both moments are live at the peak";
  EXPECT_GE(e.peak_reserved_bytes, e.peak_allocated_bytes);

  o.amp = "fp16";  // f16 weights and gradients, fp32 masters and state
  const train::MemoryEstimate h = train::estimate_step(o);
  EXPECT_EQ(h.by_role.weights, 2 * P);
  EXPECT_EQ(h.by_role.grads, 2 * P);
  EXPECT_EQ(h.by_role.master_weights, 4 * P);
  EXPECT_EQ(h.by_role.optimizer_state, 2 * 4 * P + 6 * 8);
}

// A dry run standing in for CUDA (Note [Dry-run targets]): the CUDA kernels' workspace instead of the CPU's, and the
// step counts on the host.
TEST(Estimate, ACudaTargetReplaysTheCudaKernels) {
  const int64_t P = 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10;
  train::EstimateOptions o;
  o.model = "mlp";
  o.target = MetaTarget::cuda();
  const train::MemoryEstimate e = train::estimate_step(o);
  EXPECT_EQ(e.device, "cuda");
  EXPECT_NE(e.to_string().find("on cuda"), std::string::npos) << e.to_string();
  EXPECT_NE(e.to_json().find("\"device\":\"cuda\""), std::string::npos) << e.to_json();
  EXPECT_EQ(e.by_role.weights, 4 * P);
  EXPECT_GE(e.peak_allocated_bytes, 16 * P);
  // The CPU's f32 staging of 16-bit products is not taken on CUDA: the autocast GPT predicts less there.
  o.model = "gpt";
  o.amp = "autocast-bf16";
  const train::MemoryEstimate on_cuda = train::estimate_step(o);
  o.target = MetaTarget::cpu();
  const train::MemoryEstimate on_cpu = train::estimate_step(o);
  EXPECT_LT(on_cuda.peak_allocated_bytes, on_cpu.peak_allocated_bytes);
  EXPECT_EQ(on_cpu.device, "cpu");
  // An assumed cuBLASLt workspace is taken beside each product: the peak rises by at most that much.
  o.target = MetaTarget::cuda();
  o.target.gemm_workspace_bytes = 4 << 20;
  const train::MemoryEstimate with_ws = train::estimate_step(o);
  EXPECT_GT(with_ws.peak_allocated_bytes, on_cuda.peak_allocated_bytes);
  EXPECT_LE(with_ws.peak_allocated_bytes, on_cuda.peak_allocated_bytes + (4 << 20));
  // Measured runs are CPU runs.
  EXPECT_THROW(train::measure_step(o), ValueError);
}

TEST(Estimate, GenericEntryCountsWhatTheCallableAllocates) {
  memory::AllocatorConfig fixed;
  fixed.expandable_segments = false;
  const train::MemoryEstimate e = train::estimate_peak(
      [] {
        const Tensor a = empty({1024, 1024}, TensorOptions(DType::f32, Device::meta()));  // 4 MiB: a 20 MiB segment
        const Tensor b = ops::relu(a);  // 4 MiB more, split from the same segment's free 16 MiB
        const Tensor c = ops::sum(b);   // 4 bytes -> 512: a 2 MiB small-pool segment
      },
      fixed);
  EXPECT_EQ(e.peak_allocated_bytes, 8 * kMiB + 512);
  EXPECT_EQ(e.peak_reserved_bytes, 22 * kMiB);
  EXPECT_THROW(train::estimate_peak(nullptr, fixed), ValueError);
  // Standing in for CUDA: the whole-tensor sum of 2^20 floats takes CUB's storage beside its output — 256 bytes for
  // the accumulator and 132 SMs x 8 blocks x 5 double partials (+255): 42,751 bytes, a 43,008-byte block.
  const train::MemoryEstimate on_cuda = train::estimate_peak(
      [] {
        const Tensor a = empty({1024, 1024}, TensorOptions(DType::f32, Device::meta()));
        const Tensor c = ops::sum(a);
      },
      fixed, MetaTarget::cuda());
  EXPECT_EQ(on_cuda.device, "cuda");
  EXPECT_EQ(on_cuda.peak_allocated_bytes, 4 * kMiB + 512 + 43008);
}

TEST(Estimate, GenericEntryOnAUserModelMatchesARealRun) {
  // The docs' recipe: a model moved to meta, a meta batch, two AdamW steps. The same steps on the CPU are the
  // reference, measured through the CPU allocator from before the model existed.
  auto steps = [](Device device) {
    manual_seed(5);
    auto model = nn::make_mlp({96, 256, 128, 10});
    model->to(device);
    optim::AdamW opt(model->parameters());
    const Tensor x = device.is_meta() ? empty({48, 96}, TensorOptions(DType::f32, device)) : randn({48, 96});
    for (int step = 0; step < 2; ++step) {
      ember::sum(model->forward(x)).backward();
      opt.step();
      opt.zero_grad();
    }
  };
  const memory::AllocatorConfig policy = memory::effective_config(memory::cpu_allocator());
  const train::MemoryEstimate e = train::estimate_peak([&] { steps(Device::meta()); }, policy);
  memory::CachingAllocator& cpu = memory::cpu_allocator();
  cpu.empty_cache();
  cpu.reset_peak_stats();
  const memory::AllocatorStats before = cpu.stats();
  steps(Device::cpu());
  const memory::AllocatorStats after = cpu.stats();
  EXPECT_EQ(e.peak_allocated_bytes, after.peak_allocated_bytes - before.allocated_bytes);
  EXPECT_EQ(e.peak_reserved_bytes, after.peak_reserved_bytes - before.reserved_bytes);
}

TEST(Estimate, TakesNoHostMemoryAndIsDeterministic) {
  memory::CachingAllocator& cpu = memory::cpu_allocator();
  const int64_t before = cpu.stats().allocated_bytes;
  train::EstimateOptions o;
  o.model = "gpt";
  o.batch = 64;
  const train::MemoryEstimate a = train::estimate_step(o);
  const train::MemoryEstimate b = train::estimate_step(o);
  EXPECT_EQ(cpu.stats().allocated_bytes, before) << "the dry run leaves no host tensor behind";
  // Note [Models built on meta]: the model is never made on the host either (its 3.2 MB of f32 parameters would show in
  // the host allocator's peak; what the dry run allocates on the host is bookkeeping of a few KiB).
  cpu.reset_peak_stats();
  (void)train::estimate_step(o);
  EXPECT_LT(cpu.stats().peak_allocated_bytes - before, 64 * 1024) << "host bytes taken by a dry run";
  EXPECT_EQ(a.peak_allocated_bytes, b.peak_allocated_bytes);
  EXPECT_EQ(a.peak_reserved_bytes, b.peak_reserved_bytes);
  o.batch = 128;
  const train::MemoryEstimate twice = train::estimate_step(o);
  EXPECT_GT(twice.peak_allocated_bytes, a.peak_allocated_bytes);
  std::printf("[ estimate ] gpt batch 64: %s\n", a.to_string().c_str());
}

TEST(Estimate, SimulatedCapacityRunsOutOfMemory) {
  train::EstimateOptions o;
  o.model = "mlp";
  memory::AllocatorConfig small = memory::effective_config(memory::cpu_allocator());
  small.capacity = 16 * kMiB;  // the weights, gradients and moments alone are 28 MiB
  o.allocator = small;
  EXPECT_THROW(train::estimate_step(o), OutOfMemoryError);
}

TEST(Estimate, RejectsBadOptions) {
  train::EstimateOptions o;
  o.model = "gpt";
  o.grad_accum = 5;  // does not divide 12
  EXPECT_THROW(train::estimate_step(o), ValueError);
  o.grad_accum = 1;
  o.steps = 0;
  EXPECT_THROW(train::estimate_step(o), ValueError);
  o.steps = 2;
  o.model = "cnn";
  o.checkpoint = "sqrt";
  EXPECT_THROW(train::estimate_step(o), ValueError);
  o.checkpoint = "half";
  EXPECT_THROW(train::estimate_step(o), ConfigError);
  o.checkpoint = "none";
  o.amp = "fp8";
  EXPECT_THROW(train::estimate_step(o), ConfigError);
  o.amp = "none";
  memory::AllocatorConfig other = memory::effective_config(memory::cpu_allocator());
  other.garbage_collection_threshold = 0.5;
  o.allocator = other;
  EXPECT_THROW(train::measure_step(o), ValueError) << "a measurement is of the CPU allocator's own policy";
}

TEST(Estimate, ReportsAsTextAndJson) {
  train::EstimateOptions o;
  o.model = "gpt";
  o.batch = 8;
  o.amp = "bf16";
  o.checkpoint = "sqrt";
  o.grad_accum = 2;
  const train::MemoryEstimate e = train::estimate_step(o);
  const nlohmann::json j = nlohmann::json::parse(e.to_json());
  EXPECT_EQ(j["model"], "gpt");
  EXPECT_EQ(j["batch"], 8);
  EXPECT_EQ(j["amp"], "bf16");
  EXPECT_EQ(j["checkpoint"], "sqrt");
  EXPECT_EQ(j["grad_accum"], 2);
  EXPECT_EQ(j["peak_allocated_bytes"], e.peak_allocated_bytes);
  EXPECT_EQ(j["peak_reserved_bytes"], e.peak_reserved_bytes);
  EXPECT_GT(j["master_bytes"].get<int64_t>(), 0);
  EXPECT_GT(e.recompute_fraction, 0.0) << "sqrt recomputes two of the four blocks";
  const std::string text = e.to_string();
  EXPECT_NE(text.find("gpt batch 8 (2 micro-batches), amp bf16, checkpoint sqrt"), std::string::npos) << text;
  EXPECT_NE(text.find("peak allocated"), std::string::npos) << text;
}

}  // namespace
}  // namespace ember::testing
