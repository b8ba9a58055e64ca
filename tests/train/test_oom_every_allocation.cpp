// An OOM at every allocation of a training step (issue 15): for each standard config (mlp, cnn, gpt) one AdamW step
// through train::OomResilientStep is run once per allocation request of the step, with the CPU allocator's fault
// injector failing that request (transient: that one only; persistent: it and every later one). Each time the step
// completes through the OOM-resilient path or raises OutOfMemoryError and nothing else; the allocator is back at the
// pre-step level and keeps its invariants; a raising step leaves weights and optimizer state untouched; the next
// step trains normally. Runs in test_train_device (it arms the process-wide CPU allocator).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "ember/ember.h"
#include "ember/memory/cpu_allocator.h"
#include "ember/memory/fault_injection.h"
#include "ember/optim/adam.h"
#include "ember/train/batch_finder.h"
#include "ember/train/bench_train.h"
#include "ember/train/oom_step.h"
#include "tests/train/simulated_device.h"

namespace ember::testing {
namespace {

using memory::FaultPlan;
using train::AmpMode;
using train::AmpTrainer;
using train::Batch;
using train::LossResult;

// Under AddressSanitizer or ThreadSanitizer (several times slower; the sweep is single-threaded, so TSan checks only
// what it shares with the other tests) the sweep takes every kStride-th index; Release covers every index.
#if defined(__SANITIZE_THREAD__)
#define EMBER_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMBER_TEST_TSAN 1
#endif
#endif
#if EMBER_TEST_LSAN || EMBER_TEST_TSAN
constexpr int64_t kStride = 16;
#else
constexpr int64_t kStride = 1;
#endif

// The sweep's batch per config: 2 rows (the smallest batch the OOM-resilient path can split) and, for gpt, the first
// 4 of the 64 positions. A step makes the same allocation requests at any batch and sequence length; the small
// batch keeps the sweep (a few steps per request of the step) inside the test's time budget.
constexpr int64_t kSweepRows = 2, kGptTokens = 4;

Batch sweep_batch(const train::StandardTask& task) {
  Tensor x = task.inputs.narrow(0, 0, kSweepRows), y = task.targets.narrow(0, 0, kSweepRows);
  if (task.name == "gpt") {
    x = x.narrow(1, 0, kGptTokens);
    y = y.narrow(1, 0, kGptTokens);
  }
  return {x.contiguous(), y.contiguous()};
}

// The training state as host bytes: parameters (in order) and the optimizer's state entries. Taken once per sweep
// for the references; the live state is compared with them in place (the tensors are contiguous CPU tensors).
struct HostState {
  std::vector<std::vector<unsigned char>> params, optimizer;
};

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<unsigned char> out(static_cast<size_t>(c.nbytes()));
  if (!out.empty()) std::memcpy(out.data(), c.raw_data(), out.size());
  return out;
}

bool same_bytes(const Tensor& t, const std::vector<unsigned char>& ref) {
  return t.is_contiguous() && static_cast<size_t>(t.nbytes()) == ref.size() &&
         (ref.empty() || std::memcmp(t.raw_data(), ref.data(), ref.size()) == 0);
}

std::vector<Tensor> optimizer_state(AmpTrainer& trainer) {
  std::vector<Tensor> out;
  for (const auto& [name, t] : trainer.optimizer().state_dict())
    if (name.rfind("state.", 0) == 0) out.push_back(t);
  return out;
}

HostState host_state(nn::Module& model, AmpTrainer& trainer) {
  HostState s;
  for (const Tensor& p : model.parameters()) s.params.push_back(bytes_of(p));
  for (const Tensor& t : optimizer_state(trainer)) s.optimizer.push_back(bytes_of(t));
  return s;
}

// Parameters that differ from `ref` bitwise.
int64_t params_changed(nn::Module& model, const HostState& ref) {
  const std::vector<Tensor> params = model.parameters();
  int64_t n = 0;
  for (size_t i = 0; i < params.size(); ++i) n += !same_bytes(params[i], ref.params[i]);
  return n;
}

bool optimizer_unchanged(AmpTrainer& trainer, const HostState& ref) {
  const std::vector<Tensor> state = optimizer_state(trainer);
  if (state.size() != ref.optimizer.size()) return false;
  for (size_t i = 0; i < state.size(); ++i)
    if (!same_bytes(state[i], ref.optimizer[i])) return false;
  return true;
}

// The largest |p - ref| over the parameters (f32; a plain float loop: it runs twice per swept request).
double max_param_diff(nn::Module& model, const HostState& ref) {
  const std::vector<Tensor> params = model.parameters();
  float m = 0.0f;
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t n = ref.params[i].size() / sizeof(float);
    const float* x = static_cast<const float*>(params[i].raw_data());
    const float* y = reinterpret_cast<const float*>(ref.params[i].data());
    for (size_t j = 0; j < n; ++j) {
      const float d = std::fabs(x[j] - y[j]);
      m = d > m ? d : m;
    }
  }
  return m;
}

// One config's model, trainer and step on a fixed batch.
struct Rig {
  train::StandardTask task;
  std::unique_ptr<AmpTrainer> trainer;
  std::unique_ptr<train::OomResilientStep> step;
  Batch batch;
  train::LossFn loss_fn;
  int64_t observed_ooms = 0;  // OomEvents the step reported

  explicit Rig(const std::string& name) {
    task = train::make_standard_task(name, Device::cpu(), /*seed=*/0);
    trainer = std::make_unique<AmpTrainer>(
        *task.model, std::vector<optim::ParamGroup>{optim::ParamGroup{task.model->parameters()}},
        [](std::vector<optim::ParamGroup> g) {
          return std::make_unique<optim::AdamW>(std::move(g), optim::AdamWOptions{.lr = 1e-3});
        },
        AmpMode::none);
    train::OomStepOptions o;
    o.on_oom = [this](const train::OomEvent&) { ++observed_ooms; };
    step = std::make_unique<train::OomResilientStep>(*task.model, *trainer, o);
    batch = sweep_batch(task);
    task.inputs = Tensor();  // the full batch is not needed (and its bytes are not part of the levels below)
    task.targets = Tensor();
    task.loss = nullptr;
    loss_fn = [this](const Batch& b) { return LossResult{task.loss_on(b[0], b[1]), b[1].numel()}; };
  }
  train::StepResult run() {
    step->set_micro_batch_size(0);  // every step starts at the whole batch
    return step->step(batch, loss_fn);
  }
  HostState state() { return host_state(*task.model, *trainer); }
};

struct Tally {
  int64_t points = 0, swept = 0, completed = 0, raised = 0, raised_untouched = 0, raised_partial = 0;
  double max_completed_diff = 0.0;  // largest weight difference of a completed step from the clean one
};

// Allocator levels: block bytes (after rounding; they depend on where in the cache a block landed) and the bytes the
// callers asked for (they do not).
struct Level {
  int64_t allocated = 0, requested = 0;
};
Level level() {
  const memory::AllocatorStats s = memory::cpu_allocator().stats();
  return {s.allocated_bytes, s.requested_bytes};
}

// Note [Pre-step level]
// What every injected step must return the allocator to. The start level is what is live before the step: the
// weights, the batch, and the optimizer state of the warm-up steps. A raising step must leave exactly the start level
// (the same live blocks: allocated and requested bytes both equal) — its gradients are cleared by OomResilientStep
// and state it created is freed (Note [All-or-nothing step] in optim/adam.cpp). A completed step must leave the level
// of the clean step: on a warm step that is the start level again (the same live blocks); on the first step it adds
// the optimizer state the step created, whose requested bytes are fixed but whose blocks may be rounded up
// differently (a cache the injected OOM emptied places them elsewhere), so there the requested bytes are compared.
void expect_level(const Level& now, const Level& want, bool same_blocks, const char* what) {
  EXPECT_EQ(now.requested, want.requested) << what;
  if (same_blocks) EXPECT_EQ(now.allocated, want.allocated) << what;
  EXPECT_GE(now.allocated, now.requested) << what;
}

// The sweep of one scenario: the state after `warmup` clean steps is the starting point of every injected step.
Tally sweep(const std::string& name, int64_t warmup, bool persistent) {
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  memory::FaultInjector& faults = alloc.fault_injector();
  Rig rig(name);
  for (int64_t i = 0; i < warmup; ++i) rig.run();
  train::TrainingSnapshot snapshot(*rig.task.model, *rig.trainer);
  const HostState start = rig.state();
  const Level start_level = level();
  const bool warm = warmup > 0;  // the optimizer state exists before the step

  // The clean reference: the step from the start (counted), and the one after it.
  faults.arm(FaultPlan::counting());
  const train::StepResult ref1 = rig.run();
  faults.disarm();
  const int64_t points = faults.seen();
  const Level done_level = level();
  const HostState after1 = rig.state();
  const train::StepResult ref2 = rig.run();
  const HostState after2 = rig.state();
  EXPECT_EQ(ref1.ooms, 0);
  EXPECT_TRUE(std::isfinite(ref1.loss) && std::isfinite(ref2.loss));
  if (warm) expect_level(done_level, start_level, true, "a clean warm step keeps no memory");
  // Counting is exact: the same step counts the same requests.
  snapshot.restore();
  faults.arm(FaultPlan::counting());
  rig.run();
  faults.disarm();
  EXPECT_EQ(faults.seen(), points) << "the step's allocation requests are not deterministic";

  Tally t;
  t.points = points;
  for (int64_t i = 0; i < points; i += kStride) {
    SCOPED_TRACE(name + (persistent ? ", persistent" : ", transient") + " fault at request " + std::to_string(i) +
                 " of " + std::to_string(points) + (warm ? " (warm step)" : " (first step)"));
    snapshot.restore();
    expect_level(level(), start_level, true, "restoring the snapshot allocates nothing");
    const int64_t ooms0 = alloc.device_stats().num_ooms;
    rig.observed_ooms = 0;
    bool raised = false;
    train::StepResult r;
    faults.arm(persistent ? FaultPlan::persistent(i) : FaultPlan::transient(i));
    try {
      r = rig.run();
    } catch (const OutOfMemoryError&) {
      raised = true;
    } catch (const std::exception& e) {
      faults.disarm();
      ADD_FAILURE() << "the step raised something other than OutOfMemoryError: " << e.what();
      return t;
    }
    faults.disarm();
    ++t.swept;
    EXPECT_GE(faults.injected(), 1) << "the plan never fired: request " << i << " did not happen";
    if (!persistent) EXPECT_EQ(faults.injected(), 1);
    EXPECT_EQ(alloc.device_stats().num_ooms - ooms0, faults.injected()) << "every injected fault is one OOM";
    EXPECT_NO_THROW(alloc.check_invariants());
    if (raised) {
      ++t.raised;
      expect_level(level(), start_level, true, "a raising step must leave the pre-step level");
      const int64_t changed = params_changed(*rig.task.model, start);
      if (changed == 0) ++t.raised_untouched;
      else ++t.raised_partial;
      EXPECT_EQ(changed, 0) << "a raising step updated " << changed << " of " << start.params.size() << " parameters";
      EXPECT_TRUE(optimizer_unchanged(*rig.trainer, start)) << "a raising step changed the optimizer state";
    } else {
      ++t.completed;
      EXPECT_GE(r.ooms, 1) << "every request of the step was failed once: the step must have recovered from it";
      EXPECT_EQ(rig.observed_ooms, r.ooms);
      EXPECT_TRUE(r.stepped);
      EXPECT_EQ(r.samples, kSweepRows);
      expect_level(level(), done_level, warm, "a completed step must leave the pre-step level");
      // Micro-batches sum the gradient in another order: close to the clean step, not bitwise.
      EXPECT_NEAR(r.loss, ref1.loss, 1e-5 * std::abs(ref1.loss));
      const double diff = max_param_diff(*rig.task.model, after1);
      t.max_completed_diff = std::max(t.max_completed_diff, diff);
      EXPECT_LT(diff, 1e-4) << "the recovered step's weights are not the clean step's";
    }
    // The next step, disarmed, trains normally. After a raising step the state is the start state: the next step is
    // the clean first step, bitwise. After a completed one it is (close to) the clean second step.
    const train::StepResult next = rig.run();
    EXPECT_TRUE(std::isfinite(next.loss));
    EXPECT_EQ(next.ooms, 0);
    EXPECT_TRUE(next.stepped);
    EXPECT_NO_THROW(alloc.check_invariants());
    expect_level(level(), done_level, warm, "the next step must leave the clean step's level");
    if (raised) {
      EXPECT_EQ(next.loss, ref1.loss);
      EXPECT_EQ(params_changed(*rig.task.model, after1), 0) << "the step after a raising step is not the clean step";
    } else {
      EXPECT_NEAR(next.loss, ref2.loss, 1e-4 * std::abs(ref2.loss));
      EXPECT_LT(max_param_diff(*rig.task.model, after2), 1e-4);
    }
    if (::testing::Test::HasFailure()) return t;  // one broken index says enough
  }
  snapshot.restore();
  return t;
}

// (config, warm-up steps before the swept step): 1 sweeps a warm step (the optimizer state exists), 0 the first step
// (AdamW creates its state inside the step).
using Scenario = std::tuple<std::string, int64_t>;

class OomEveryAllocation : public ::testing::TestWithParam<Scenario> {
 protected:
  void SetUp() override {
    use_device(memory::kNoLimit);
    // The explanation replays the allocation history for its advice: not needed here, and it dominates the time.
    memory::cpu_allocator().set_oom_explanations(false);
  }
  void TearDown() override {
    memory::cpu_allocator().fault_injector().disarm();
    memory::cpu_allocator().set_oom_explanations(true);
  }
};

TEST_P(OomEveryAllocation, EveryRequestOfAStep) {
  const auto& [name, warmup] = GetParam();
  for (bool persistent : {false, true}) {
    const auto t0 = std::chrono::steady_clock::now();
    const Tally t = sweep(name, warmup, persistent);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string scenario = std::string(warmup ? "warm" : "first") + (persistent ? "_persistent" : "_transient");
    std::cout << "[oom every allocation] " << name << " " << scenario << ": " << t.points << " injection points, "
              << t.swept << " swept (every " << kStride << "), " << t.completed << " completed via the resilient path, "
              << t.raised << " raised OutOfMemoryError (" << t.raised_untouched << " weights untouched, "
              << t.raised_partial << " partially updated); max weight diff of a recovered step "
              << t.max_completed_diff << "; " << s << " s\n";
    RecordProperty(scenario + "_points", static_cast<int>(t.points));
    RecordProperty(scenario + "_completed", static_cast<int>(t.completed));
    RecordProperty(scenario + "_raised", static_cast<int>(t.raised));
    EXPECT_GT(t.points, 0);
    if (::testing::Test::HasFailure()) return;
    EXPECT_EQ(t.swept, (t.points + kStride - 1) / kStride);
    if (persistent) EXPECT_EQ(t.completed, 0) << "a device that refuses everything cannot complete a step";
  }
}

INSTANTIATE_TEST_SUITE_P(StandardConfigs, OomEveryAllocation,
                         ::testing::Combine(::testing::Values("mlp", "cnn", "gpt"),
                                            ::testing::Values(int64_t{1}, int64_t{0})),
                         [](const ::testing::TestParamInfo<Scenario>& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_warm" : "_first_step");
                         });

}  // namespace
}  // namespace ember::testing
