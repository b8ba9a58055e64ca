// OOM-resilient step on a simulated small device (the CPU allocator rebuilt with a capacity; this file runs in
// test_train_device, a process of its own): the step that OOMs at full batch finishes in micro-batches with the
// weights of the same steps on an unbounded device, the allocator returns to the pre-step level and keeps its
// invariants; OOMs planted mid-forward and mid-backward of a later micro-batch drop exactly that attempt; a single
// row that does not fit gives up; the micro-batch size is remembered and may grow back. Also the checkpoint profiler
// when its backward measurement runs out of memory: every leaf keeps its .grad and hooks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ember/autograd/checkpoint_plan.h"
#include "ember/autograd/hooks.h"
#include "ember/ember.h"
#include "ember/memory/cpu_allocator.h"
#include "ember/nn/functional.h"
#include "ember/nn/layers.h"
#include "ember/nn/models.h"
#include "ember/optim/sgd.h"
#include "ember/train/oom_step.h"
#include "ember/train/runner.h"
#include "tests/harness/op_harness.h"
#include "tests/train/simulated_device.h"

namespace ember::testing {
namespace {

namespace F = nn::functional;
using memory::kMiB;
using train::AmpMode;
using train::AmpTrainer;
using train::Batch;
using train::LossResult;

class OomStep : public ::testing::Test {
 protected:
  void TearDown() override { use_device(memory::kNoLimit); }
};

optim::OptimizerFactory sgd_momentum() {
  return [](std::vector<optim::ParamGroup> g) {
    return std::make_unique<optim::SGD>(std::move(g), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  };
}

// A 64-1024-10 MLP: 75k parameters (0.3 MiB), about 16 KiB of activations and their gradients per row.
constexpr int64_t kIn = 64, kHidden = 1024, kOut = 10;
std::shared_ptr<nn::Sequential> make_model() { return nn::make_mlp({kIn, kHidden, kOut}); }

struct Data {
  Tensor x, y;
  explicit Data(int64_t rows) {
    x = rand_input_seeded({rows, kIn}, 41).to(DType::f32);
    std::vector<int64_t> labels;  // fixed by a seed (rand_indices draws a fresh one per call)
    for (double u : rand_input_seeded({rows}, 42, 0.0, static_cast<double>(kOut)).to_vector<double>())
      labels.push_back(static_cast<int64_t>(u));
    y = from_vector(labels, {rows});
  }
};

LossResult mean_ce(nn::Module& model, const Batch& b) {
  return LossResult{F::cross_entropy(model.forward(b[0]), b[1]), b[0].size(0)};
}

std::vector<float> weights_of(nn::Module& model) {
  std::vector<float> out;
  for (const Tensor& p : model.parameters())
    for (float v : p.to(DType::f32).to_vector<float>()) out.push_back(v);
  return out;
}

// `steps` plain full-batch steps (forward, backward, step, zero_grad) of the MLP: the reference.
std::vector<float> reference_weights(AmpMode mode, int64_t rows, int64_t steps) {
  manual_seed(5);
  std::shared_ptr<nn::Sequential> model = make_model();
  AmpTrainer trainer(*model, {optim::ParamGroup{model->parameters()}}, sgd_momentum(), mode);
  const Data data(rows);
  for (int64_t i = 0; i < steps; ++i) {
    Tensor loss;
    {
      AutocastGuard region = trainer.autocast();
      loss = F::cross_entropy(model->forward(data.x), data.y);
    }
    trainer.backward(loss);
    trainer.step();
    trainer.zero_grad();
  }
  return weights_of(*model);
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rtol, double atol) {
  ASSERT_EQ(a.size(), b.size());
  int bad = 0;
  for (size_t i = 0; i < a.size() && bad < 5; ++i)
    if (std::abs(static_cast<double>(a[i]) - b[i]) > atol + rtol * std::abs(static_cast<double>(b[i]))) {
      ADD_FAILURE() << "element " << i << ": " << a[i] << " vs " << b[i];
      ++bad;
    }
}

TEST_F(OomStep, FullBatchThatDoesNotFitFinishesInMicroBatches) {
  constexpr int64_t kRows = 1024;
  const std::vector<float> ref = reference_weights(AmpMode::none, kRows, 2);  // on the unbounded host

  use_device(6 * kMiB);
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  {
    manual_seed(5);
    std::shared_ptr<nn::Sequential> model = make_model();
    AmpTrainer trainer(*model, {optim::ParamGroup{model->parameters()}}, sgd_momentum(), AmpMode::none);
    const Data data(kRows);
    std::vector<train::OomEvent> events;
    int64_t before = 0;
    train::OomStepOptions o;
    o.on_oom = [&](const train::OomEvent& e) {
      events.push_back(e);
      EXPECT_NO_THROW(alloc.check_invariants());
      // The first attempt of a step holds no earlier gradient: everything it made is gone.
      if (e.start == 0) EXPECT_EQ(e.stats.allocated_bytes, before) << "the failed attempt left tensors behind";
    };
    train::OomResilientStep step(*model, trainer, o);
    auto loss_fn = [&](const Batch& b) { return mean_ce(*model, b); };

    before = alloc.stats().allocated_bytes;
    const train::StepResult r1 = step.step({data.x, data.y}, loss_fn);
    EXPECT_GE(r1.ooms, 1) << "the full batch must not fit a 6 MiB device";
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events[0].rows, kRows);
    EXPECT_EQ(events[0].next_rows, kRows / 2);
    EXPECT_TRUE(r1.stepped);
    EXPECT_EQ(r1.samples, kRows);
    EXPECT_EQ(r1.count, kRows) << "every sample counted once";
    EXPECT_GT(r1.micro_batches, 1);
    EXPECT_LT(step.micro_batch_size(), kRows);
    EXPECT_EQ(step.micro_batch_size(), r1.micro_batch_size) << "the working size is remembered";
    std::cout << "[oom step] 6 MiB device: " << r1.ooms << " OOM(s), micro-batches of " << step.micro_batch_size()
              << " rows\n";

    // The second step starts at the remembered size: no OOM, and the allocator ends where it started.
    events.clear();
    before = alloc.stats().allocated_bytes;
    const train::StepResult r2 = step.step({data.x, data.y}, loss_fn);
    EXPECT_EQ(r2.ooms, 0);
    EXPECT_EQ(alloc.stats().allocated_bytes, before) << "allocator statistics back at the pre-step level";
    EXPECT_NO_THROW(alloc.check_invariants());

    expect_close(weights_of(*model), ref, 1e-5, 1e-6);
  }
  EXPECT_EQ(alloc.stats().allocated_bytes, 0);
}

// `ember train --oom-resilient` (RunnerOptions::oom_resilient): the standard mlp task at 4096 rows under a 64 MiB cap
// recovers from its OOMs (the first step at full batch, a later one once the optimizer state exists) and ends with the
// weights of the same steps run whole on the unbounded host; without the option the capped run fails.
TEST_F(OomStep, RunnerOptionRecoversAndMatchesTheUnboundedRun) {
  train::RunnerOptions o;
  o.model = "mlp";
  o.batch_size = 4096;
  o.steps = 3;
  auto run = [&](int64_t cap, bool resilient, train::RunResult* result) {
    train::RunnerOptions ro = o;
    ro.max_memory = cap;
    ro.oom_resilient = resilient;
    train::TrainRunner runner(ro);
    *result = runner.run();
    return weights_of(runner.model());
  };
  train::RunResult whole, split;
  const std::vector<float> ref = run(0, false, &whole);  // the unbounded host, before any cap exists
  EXPECT_EQ(whole.ooms_recovered, 0);
  const std::vector<float> got = run(64 * kMiB, true, &split);
  EXPECT_EQ(split.steps, 3);
  EXPECT_GE(split.ooms_recovered, 1) << "4096 rows must not fit 64 MiB whole";
  EXPECT_LT(split.micro_batch, 4096) << "the run reports the micro-batch size the OOMs left";
  EXPECT_LE(split.peak_reserved_bytes, 64 * kMiB);
  // Micro-batches sum each gradient in another order. AdamW's first updates are nearly lr x sign(g) (lr 1e-3 here),
  // so where a gradient is near zero a last-bit difference moves the weight by up to 2 lr a step: how many such
  // weights there are depends on the GEMM's blocking, i.e. on the ISA and the machine's caches. Of the 1.86M
  // weights, beyond 10% of lr: 1 in an AVX2 build, 48 in an AVX-512 one (the largest 4.5e-4 there). A lost micro-batch
  // changes the direction of the summed gradients: 1.53M beyond it. So: at most 0.1% of the weights beyond 10% of lr.
  ASSERT_EQ(got.size(), ref.size());
  size_t beyond = 0;
  for (size_t i = 0; i < got.size(); ++i) beyond += std::abs(static_cast<double>(got[i]) - ref[i]) > 1e-4;
  EXPECT_LE(beyond, got.size() / 1000) << "weights more than 1e-4 (10% of lr) from the unbounded run's";
  train::RunResult failed;
  EXPECT_THROW(run(64 * kMiB, false, &failed), OutOfMemoryError) << "without the option the same run fails";
}

// Micro-batches of 8 rows on a device where nothing OOMs by itself; the `fail_at`-th forward (phase forward) or
// backward (phase backward) of the step asks for more than the device holds.
void planted_oom(AmpMode mode, const std::string& phase) {
  SCOPED_TRACE(std::string(train::amp_mode_name(mode)) + ", OOM in the " + phase);
  constexpr int64_t kRows = 32, kFailAt = 3;
  use_device(64 * kMiB);
  const std::vector<float> ref = reference_weights(mode, kRows, 1);
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  manual_seed(5);
  std::shared_ptr<nn::Sequential> model = make_model();
  AmpTrainer trainer(*model, {optim::ParamGroup{model->parameters()}}, sgd_momentum(), mode);
  const Data data(kRows);
  int64_t forwards = 0, backwards = 0;
  auto too_big = [] { return empty({128 * kMiB}, TensorOptions(DType::f32)); };  // 512 MiB
  // The first layer's weight gets its gradient last: by then the other layers' gradients are in .grad.
  const Tensor first_weight = model->at<nn::Linear>(0)->weight;
  autograd::HookHandle hook = autograd::register_hook(first_weight, [&](const Tensor&) {
    if (phase == "backward" && ++backwards == kFailAt) too_big();
    return Tensor();
  });
  std::vector<train::OomEvent> events;
  int64_t before = 0, grad_bytes = 0;
  for (const Tensor& p : model->parameters()) grad_bytes += (p.nbytes() + 511) / 512 * 512;  // 512 B rounding
  train::OomStepOptions o;
  o.micro_batch_size = 8;
  o.on_oom = [&](const train::OomEvent& e) {
    events.push_back(e);
    EXPECT_NO_THROW(alloc.check_invariants());
    // Two micro-batches completed: their summed gradients (one per parameter) are all that is left of the step.
    EXPECT_EQ(e.stats.allocated_bytes, before + grad_bytes);
  };
  train::OomResilientStep step(*model, trainer, o);
  before = alloc.stats().allocated_bytes;
  const train::StepResult r = step.step({data.x, data.y}, [&](const Batch& b) {
    if (phase == "forward" && ++forwards == kFailAt) too_big();
    return mean_ce(*model, b);
  });
  hook.remove();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].phase, phase);
  EXPECT_EQ(events[0].start, 16);
  EXPECT_EQ(events[0].rows, 8);
  EXPECT_EQ(events[0].next_rows, 4);
  EXPECT_EQ(events[0].requested, 512 * kMiB);
  EXPECT_EQ(r.ooms, 1);
  EXPECT_EQ(r.micro_batches, 6) << "8 + 8 + (8 failed) 4 + 4 + 4 + 4";
  EXPECT_EQ(r.count, kRows);
  EXPECT_EQ(step.micro_batch_size(), 4);
  // fp16: the f16 gradients of 8- and 4-row micro-batches round differently from one 32-row gradient.
  if (mode == AmpMode::none) expect_close(weights_of(*model), ref, 1e-5, 1e-6);
  else expect_close(weights_of(*model), ref, 2e-3, 2e-4);
}

TEST_F(OomStep, PlantedOomInALaterMicroBatchDropsOnlyThatAttempt) {
  planted_oom(AmpMode::none, "forward");
  planted_oom(AmpMode::none, "backward");
  planted_oom(AmpMode::fp16, "backward");
}

TEST_F(OomStep, GivesUpWhenOneRowDoesNotFit) {
  use_device(16 * kMiB);
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  manual_seed(2);
  std::shared_ptr<nn::Sequential> model = nn::make_mlp({kIn, 16, kOut});
  AmpTrainer trainer(*model, {optim::ParamGroup{model->parameters()}}, sgd_momentum(), AmpMode::none);
  const Data data(4);
  const std::vector<float> before = weights_of(*model);
  train::OomResilientStep step(*model, trainer);
  const int64_t allocated = alloc.stats().allocated_bytes;
  const std::string msg = error_message<OutOfMemoryError>([&] {
    step.step({data.x, data.y}, [&](const Batch& b) {
      Tensor loss = mean_ce(*model, b).loss;
      loss.backward();  // leaves gradients behind, as a partial attempt would
      empty({64 * kMiB}, TensorOptions(DType::f32));
      return LossResult{};
    });
  });
  EXPECT_FALSE(msg.empty());
  EXPECT_EQ(step.total_ooms(), 3) << "4 rows, then 2, then 1";
  EXPECT_EQ(weights_of(*model), before) << "nothing stepped";
  for (const Tensor& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
  EXPECT_EQ(alloc.stats().allocated_bytes, allocated);
}

TEST_F(OomStep, RemembersTheSizeAndMayGrowBack) {
  use_device(64 * kMiB);
  manual_seed(2);
  std::shared_ptr<nn::Sequential> model = nn::make_mlp({kIn, 16, kOut});
  AmpTrainer trainer(*model, {optim::ParamGroup{model->parameters()}}, sgd_momentum(), AmpMode::none);
  const Data data(32);
  for (int64_t grow : {0, 1}) {
    SCOPED_TRACE(grow ? "grow_interval 1" : "never grow");
    int64_t calls = 0;
    auto loss_fn = [&](const Batch& b) {
      if (++calls == 1) empty({64 * kMiB}, TensorOptions(DType::f32));  // the first attempt of all OOMs
      return mean_ce(*model, b);
    };
    train::OomStepOptions o;
    o.grow_interval = grow;
    train::OomResilientStep step(*model, trainer, o);
    EXPECT_EQ(step.step({data.x, data.y}, loss_fn).ooms, 1);
    EXPECT_EQ(step.micro_batch_size(), 16);
    const train::StepResult r = step.step({data.x, data.y}, loss_fn);
    EXPECT_EQ(r.micro_batches, 2) << "the second step starts at the remembered size";
    EXPECT_EQ(step.micro_batch_size(), grow ? 0 : 16) << "16 doubled covers the 32 rows: whole batches again";
    EXPECT_EQ(step.step({data.x, data.y}, loss_fn).micro_batches, grow ? 1 : 2);
  }
  EXPECT_THROW(train::OomResilientStep(*model, trainer, {.micro_batch_size = -1}), ValueError);
  // max_grad_norm as GradAccumulator takes it: finite and >= 0 (0: no clipping).
  EXPECT_THROW(train::OomResilientStep(*model, trainer, {.max_grad_norm = -1.0}), ValueError);
  EXPECT_THROW(train::OomResilientStep(*model, trainer, {.max_grad_norm = std::numeric_limits<double>::infinity()}),
               ValueError);
  EXPECT_THROW(train::OomResilientStep(*model, trainer, {.max_grad_norm = std::nan("")}), ValueError);
}

// profile_chain measures each block's backward with the leaves' .grad and hooks set aside and zeros .grad in their
// place (Note [Backward transients]). When one of those zeros does not fit the device, the leaves set aside before
// it get their own .grad and hooks back. `big` is a 1 GiB leaf over one element (its zeros .grad cannot fit a
// 64 MiB device); both orders of the two leaves are tried, since the stash visits them in graph order.
TEST_F(OomStep, CheckpointProfilerThatRunsOutOfMemoryKeepsGradientsAndHooks) {
  use_device(64 * kMiB);
  for (bool big_first : {false, true}) {
    SCOPED_TRACE(big_first ? "big leaf's product first" : "big leaf's product last");
    Tensor p = full({4}, 1.0);
    p.requires_grad_(true);
    Tensor big;
    {
      NoGradGuard no_grad;
      big = ones({1}).expand({int64_t{1} << 28});
      p.set_grad(full({4}, 7.0));
    }
    big.requires_grad_(true);
    int fired = 0;
    autograd::HookHandle hook = autograd::register_hook(p, [&](const Tensor&) {
      ++fired;
      return Tensor();
    });
    const std::vector<autograd::TensorFn> blocks = {[&](const Tensor& x) {
      const Tensor a = mul(x, p), b = mul(x, big.narrow(0, 0, 4));
      return big_first ? add(b, a) : add(a, b);
    }};
    EXPECT_THROW(autograd::profile_chain(blocks, full({4}, 1.0)), OutOfMemoryError);
    ASSERT_TRUE(p.grad().defined()) << "the .grad set aside is back";
    EXPECT_EQ(p.grad().to_vector<float>(), std::vector<float>(4, 7.0f));
    sum(mul(p, 2.0)).backward();
    EXPECT_EQ(fired, 1) << "the hook set aside is back";
    EXPECT_EQ(p.grad().to_vector<float>(), std::vector<float>(4, 9.0f));
    hook.remove();
  }
}

}  // namespace
}  // namespace ember::testing
