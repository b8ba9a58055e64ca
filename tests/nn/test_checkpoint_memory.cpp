// Activation checkpointing plans, measured: the CPU allocator's statistics over forward + backward of a 32-block MLP
// and an 8-block GPT under none / sqrt / budget plans (Note [Measuring activation memory]); gradients with a plan
// bit-identical to those without (dropout included); and plans composed with AmpTrainer in fp16 with gradient
// accumulation — the same losses and weights as without a plan.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "ember/autograd/checkpoint_plan.h"
#include "ember/ember.h"
#include "ember/train/amp.h"

namespace ember::nn {
namespace {

using autograd::CheckpointPlan;
using autograd::CheckpointPolicy;

// Note [Measuring activation memory]
// The parameters' gradients are made to exist first (one backward, then zero_grad(set_to_none = false)), so nothing
// the step allocates for good is counted: the peak of forward + backward above the allocated bytes before the
// forward is the activations (saved tensors, the checkpointed regions' inputs, recomputed tensors) plus what backward
// holds transiently (gradients flowing between ops, each op's fresh weight gradient before it is added into .grad).
// "One block's worth" is what a forward without checkpointing leaves allocated, divided by the number of blocks.
struct Measured {
  int64_t forward = 0;  // allocated after the forward, above the level before it
  int64_t peak = 0;     // peak allocated during forward + backward, above the level before the forward
};

Measured measure(Module& model, const std::function<Tensor()>& loss_fn) {
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  {
    Tensor warm = loss_fn();
    warm.backward();
  }
  model.zero_grad(/*set_to_none=*/false);
  Measured m;
  const int64_t before = alloc.stats().allocated_bytes;
  alloc.reset_peak_stats();
  {
    Tensor loss = loss_fn();
    m.forward = alloc.stats().allocated_bytes - before;
    loss.backward();
  }
  m.peak = alloc.stats().peak_allocated_bytes - before;
  model.zero_grad(/*set_to_none=*/false);
  return m;
}

std::string mib(int64_t bytes) { return memory::format_bytes(bytes); }

// Note [Backward transients, measured]
// Backward holds, for a moment, the gradient flowing into an op, the one flowing out, and each weight's fresh
// gradient before it is added into .grad — whatever the plan. In the MLP a block's activation is [128, 256] f32
// (128 KiB) while a Linear(256, 256) weight gradient is 256 KiB, two blocks by itself. The planner profiles these
// transients per block (BlockProfile::backward_bytes) and counts them against the budget, so a budget is a bound on
// the whole peak above the level before the forward:
//     budget(B):  peak <= B + one block
// (the extra block covers what the model leaves out: the output of a recomputed segment that the next kept block
// saves as its input, when the segment's last block counts it as its own saved output — ReLU — and so no held
// bytes do; Note [Hand-off tensors]). sqrt's bound is on activation memory, so it is checked
// as peak - transient <= 2 sqrt(N) blocks, with the transient what the no-checkpoint backward needs beyond its
// forward's bytes (peak - forward).
struct Acceptance {
  std::string name;
  Module* model;
  int64_t blocks;
  std::function<Tensor()> loss;
  std::function<CheckpointPlan(const CheckpointPolicy&)> plan;  // plans and installs
  std::function<void()> uninstall;
};

void check_acceptance(const Acceptance& a) {
  const double n = double(a.blocks);
  const Measured none = measure(*a.model, a.loss);
  const double block = double(none.forward) / n;
  const double transient = double(none.peak - none.forward);
  std::printf("%s: one block's worth %s; none: forward %s, peak %s (%.1f blocks, transient %.1f blocks)\n",
              a.name.c_str(), mib(int64_t(block)).c_str(), mib(none.forward).c_str(), mib(none.peak).c_str(),
              none.peak / block, transient / block);

  const CheckpointPlan sqrt = a.plan(CheckpointPolicy::parse("sqrt"));
  const Measured sq = measure(*a.model, a.loss);
  std::printf("%s: predicted without checkpointing %s, measured %s\n", a.name.c_str(),
              mib(sqrt.no_checkpoint_bytes).c_str(), mib(none.peak).c_str());
  EXPECT_GE(double(sqrt.no_checkpoint_bytes) + block, double(none.peak));  // the model does not lose tensors
  std::printf("%s sqrt: forward %s, peak %s (%.1f blocks); predicted %s\n%s\n", a.name.c_str(), mib(sq.forward).c_str(),
              mib(sq.peak).c_str(), sq.peak / block, mib(sqrt.predicted_peak_bytes).c_str(),
              sqrt.to_string().c_str());
  EXPECT_LE(double(sq.peak), 2.0 * std::sqrt(n) * block + transient);
  EXPECT_LT(sq.peak, none.peak);

  for (int k = 1; k <= 4; ++k) {
    const int64_t budget = sq.peak + (none.peak - sq.peak) * k / 5;
    const CheckpointPlan plan = a.plan(CheckpointPolicy{CheckpointPolicy::Kind::budget, budget});
    const Measured b = measure(*a.model, a.loss);
    std::printf("%s budget %s: peak %s (%.1f blocks); predicted %s, extra compute %.0f%% of a forward\n",
                a.name.c_str(), mib(budget).c_str(), mib(b.peak).c_str(), b.peak / block,
                mib(plan.predicted_peak_bytes).c_str(), 100.0 * plan.extra_cost / plan.forward_cost);
    EXPECT_TRUE(plan.fits) << plan.to_string();
    EXPECT_LE(double(b.peak), double(budget) + block) << plan.to_string();
  }
  a.uninstall();
}

// ---- a 32-block MLP and an 8-block GPT ---------------------------------------------------------------------------

std::shared_ptr<Sequential> make_deep_mlp(int64_t blocks, int64_t width, bool gelu = false) {
  auto net = std::make_shared<Sequential>();
  for (int64_t i = 0; i < blocks; ++i) {
    std::shared_ptr<Module> act = gelu ? std::shared_ptr<Module>(std::make_shared<GELU>())
                                       : std::shared_ptr<Module>(std::make_shared<ReLU>());
    net->push_back(std::make_shared<Sequential>(std::make_shared<Linear>(width, width), act));
  }
  return net;
}

TEST(CheckpointMemory, DeepMlpSqrtAndBudgets) {
  manual_seed(3);
  auto net = make_deep_mlp(32, 256);
  const Tensor x = randn({128, 256});
  Sequential* seq = net.get();
  check_acceptance({"mlp", seq, 32, [seq, x] { return mean(seq->forward(x)); },
                    [seq, x](const CheckpointPolicy& p) { return seq->plan_checkpointing(x, p); },
                    [seq] { seq->set_checkpoint_plan({}); }});
}

// GELU saves its input, not its output: the tensor between two blocks is saved only by the next block's Linear
// (Note [Hand-off tensors] in autograd/checkpoint_plan.h), which the plans must count.
TEST(CheckpointMemory, DeepGeluMlpSqrtAndBudgets) {
  manual_seed(4);
  auto net = make_deep_mlp(16, 256, /*gelu=*/true);
  const Tensor x = randn({128, 256});
  Sequential* seq = net.get();
  check_acceptance({"gelu mlp", seq, 16, [seq, x] { return mean(seq->forward(x)); },
                    [seq, x](const CheckpointPolicy& p) { return seq->plan_checkpointing(x, p); },
                    [seq] { seq->set_checkpoint_plan({}); }});
}

GPTConfig small_gpt(int64_t n_layer, double dropout) {
  GPTConfig c;
  c.n_layer = n_layer;
  c.n_embd = 64;
  c.n_head = 4;
  c.block_size = 64;
  c.dropout = dropout;
  return c;
}

Tensor tokens(int64_t batch, int64_t t, int64_t vocab) {
  return (rand({batch, t}) * double(vocab)).to(DType::i64);
}

TEST(CheckpointMemory, GptSqrtAndBudgets) {
  manual_seed(5);
  auto gpt = std::make_shared<GPT>(small_gpt(8, 0.0));
  const Tensor idx = tokens(8, 64, 65), targets = tokens(8, 64, 65);
  GPT* m = gpt.get();
  check_acceptance({"gpt", m, 8, [m, idx, targets] { return m->forward(idx, targets).loss; },
                    [m, idx](const CheckpointPolicy& p) { return m->plan_checkpointing(idx, p); },
                    [m] { m->set_checkpoint_plan({}); }});
}

// ---- gradients --------------------------------------------------------------------------------------------------

::testing::AssertionResult bit_identical(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return ::testing::AssertionFailure() << "undefined tensor";
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype())
    return ::testing::AssertionFailure() << a.description() << " vs " << b.description();
  const std::vector<float> va = a.detach().to_vector<float>(), vb = b.detach().to_vector<float>();
  for (size_t i = 0; i < va.size(); ++i)
    if (std::memcmp(&va[i], &vb[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << va[i] << " vs " << vb[i];
  return ::testing::AssertionSuccess();
}

// Loss and parameter gradients of one forward + backward with the default generator at `seed`.
struct Grads {
  Tensor loss;
  std::vector<Tensor> grads;
};
Grads run_grads(Module& model, const std::function<Tensor()>& loss_fn, uint64_t seed) {
  model.zero_grad(/*set_to_none=*/true);
  manual_seed(seed);
  Grads g;
  g.loss = loss_fn();
  g.loss.backward();
  for (const Tensor& p : model.parameters()) g.grads.push_back(p.grad().clone());
  return g;
}

void expect_same(const Grads& want, const Grads& got, const std::string& what) {
  EXPECT_TRUE(bit_identical(want.loss, got.loss)) << what << ": loss";
  ASSERT_EQ(want.grads.size(), got.grads.size());
  for (size_t i = 0; i < want.grads.size(); ++i) EXPECT_TRUE(bit_identical(want.grads[i], got.grads[i])) << what << ": grad " << i;
}

TEST(CheckpointPlans, GptGradientsBitIdenticalWithDropout) {
  manual_seed(11);
  auto gpt = std::make_shared<GPT>(small_gpt(6, 0.1));
  gpt->train();
  const Tensor idx = tokens(4, 32, 65), targets = tokens(4, 32, 65);
  auto loss_fn = [&] { return gpt->forward(idx, targets).loss; };
  const Grads reference = run_grads(*gpt, loss_fn, 99);
  for (const char* policy : {"sqrt", "budget:0"}) {
    const CheckpointPlan plan = gpt->plan_checkpointing(idx, CheckpointPolicy::parse(policy));
    ASSERT_TRUE(plan.recomputes(0)) << plan.to_string();
    autograd::reset_checkpoint_stats();
    expect_same(reference, run_grads(*gpt, loss_fn, 99), plan.to_string());
    EXPECT_GT(autograd::checkpoint_stats().recomputations, 0) << "the plan must really recompute";
  }
  // A budget between sqrt's prediction and none's: a mix of kept and recomputed segments.
  const CheckpointPlan sqrt = gpt->plan_checkpointing(idx, CheckpointPolicy::parse("sqrt"));
  const CheckpointPlan mixed = gpt->plan_checkpointing(
      idx, CheckpointPolicy{CheckpointPolicy::Kind::budget,
                            (sqrt.predicted_peak_bytes + sqrt.no_checkpoint_bytes) / 2});
  bool kept = false, recomputed = false;
  for (const auto& seg : mixed.segments) (seg.recompute ? recomputed : kept) = true;
  ASSERT_TRUE(kept && recomputed) << "expected a mix of kept and recomputed segments: " << mixed.to_string();
  autograd::reset_checkpoint_stats();
  expect_same(reference, run_grads(*gpt, loss_fn, 99), mixed.to_string());
  EXPECT_GT(autograd::checkpoint_stats().recomputations, 0);
  gpt->set_checkpoint_plan({});
  expect_same(reference, run_grads(*gpt, loss_fn, 99), "uninstalled");
}

TEST(CheckpointPlans, SequentialGradientsBitIdentical) {
  manual_seed(12);
  auto net = std::make_shared<Sequential>();
  for (int i = 0; i < 9; ++i) {
    net->push_back(std::make_shared<Linear>(24, 24));
    net->push_back(i % 2 ? std::shared_ptr<Module>(std::make_shared<GELU>()) : std::make_shared<Dropout>(0.2));
  }
  Tensor x = randn({16, 24});
  x.requires_grad_();
  auto loss_fn = [&] { return mean(net->forward(x) * net->forward(x)); };  // two passes: a chain used twice
  const Grads reference = run_grads(*net, loss_fn, 7);
  x.set_grad(Tensor());
  // sqrt, and a hand-made plan that recomputes two runs and keeps the rest (on blocks this small a budget plan
  // keeps everything: recomputing would hold as many input bytes as it frees).
  CheckpointPlan by_hand;
  by_hand.segments = {{0, 5, true}, {5, 11, false}, {11, 16, true}, {16, 18, false}};
  for (const char* policy : {"sqrt", "by hand"}) {
    const CheckpointPlan plan = std::string(policy) == "sqrt"
                                    ? net->plan_checkpointing(x, CheckpointPolicy::parse(policy))
                                    : (net->set_checkpoint_plan(by_hand), by_hand);
    EXPECT_EQ(plan.num_blocks(), 18);
    ASSERT_TRUE(plan.recomputes(0)) << plan.to_string();
    autograd::reset_checkpoint_stats();
    expect_same(reference, run_grads(*net, loss_fn, 7), plan.to_string());
    EXPECT_GT(autograd::checkpoint_stats().recomputations, 0) << "the plan must really recompute";
  }
}

TEST(CheckpointPlans, PlanMustMatchTheBlockCount) {
  manual_seed(13);
  auto gpt = std::make_shared<GPT>(small_gpt(3, 0.0));
  const CheckpointPlan four = autograd::plan_checkpoints(std::vector<autograd::BlockProfile>(4, {1, 1, 1.0}),
                                                         CheckpointPolicy::parse("sqrt"));
  EXPECT_THROW(gpt->set_checkpoint_plan(four), ValueError);
  auto net = make_deep_mlp(3, 4);
  EXPECT_THROW(net->set_checkpoint_plan(four), ValueError);
  CheckpointPlan gap;  // three blocks whose segments leave a gap
  gap.segments = {{0, 1, true}, {2, 3, false}};
  EXPECT_THROW(gpt->set_checkpoint_plan(gap), ValueError);
  // A plan made for the Sequential, which then grows: its forward refuses the stale plan.
  net->plan_checkpointing(randn({2, 4}), CheckpointPolicy::parse("sqrt"));
  net->push_back(std::make_shared<ReLU>());
  EXPECT_THROW(net->forward(randn({2, 4})), ValueError);
  // Uninstalling with an empty plan.
  net->set_checkpoint_plan({});
  EXPECT_TRUE(net->checkpoint_plan().segments.empty());
  EXPECT_NO_THROW(net->forward(randn({2, 4})));
}

// ---- mixed precision and gradient accumulation --------------------------------------------------------------------

struct AmpRun {
  std::vector<double> losses;
  std::vector<Tensor> params;
};

// Three AdamW steps of a GPT in fp16 (f16 weights, fp32 masters, loss scaling), each over two micro-batches whose
// gradients accumulate; with `policy` the plan is made once, under the trainer's autocast, before the first step.
AmpRun amp_run(const char* policy) {
  manual_seed(21);
  auto gpt = std::make_shared<GPT>(small_gpt(4, 0.1));
  std::vector<Tensor> idx, tgt;
  for (int i = 0; i < 2; ++i) {
    idx.push_back(tokens(4, 32, 65));
    tgt.push_back(tokens(4, 32, 65));
  }
  train::AmpTrainer trainer(*gpt, {optim::ParamGroup{gpt->parameters()}},
                            [](std::vector<optim::ParamGroup> g) {
                              return std::make_unique<optim::AdamW>(std::move(g), optim::AdamWOptions{.lr = 1e-2});
                            },
                            train::AmpMode::fp16);
  if (policy) {
    AutocastGuard region = trainer.autocast();
    const CheckpointPlan plan = gpt->plan_checkpointing(idx[0], CheckpointPolicy::parse(policy));
    EXPECT_GT(plan.extra_cost, 0.0) << plan.to_string();
  }
  AmpRun r;
  for (int step = 0; step < 3; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      Tensor loss;
      {
        AutocastGuard region = trainer.autocast();
        loss = gpt->forward(idx[micro], tgt[micro]).loss;
      }
      r.losses.push_back(loss.item_double());
      trainer.backward(loss * 0.5);
    }
    EXPECT_TRUE(trainer.step());
    trainer.zero_grad();
  }
  for (const Tensor& p : gpt->parameters()) r.params.push_back(p.detach().to(DType::f32));
  return r;
}

TEST(CheckpointPlans, ComposesWithAmpFp16AndAccumulation) {
  const AmpRun reference = amp_run(nullptr);
  for (const char* policy : {"sqrt", "budget:0"}) {
    const AmpRun r = amp_run(policy);
    ASSERT_EQ(r.losses.size(), reference.losses.size());
    for (size_t i = 0; i < r.losses.size(); ++i) EXPECT_EQ(r.losses[i], reference.losses[i]) << policy << " loss " << i;
    ASSERT_EQ(r.params.size(), reference.params.size());
    for (size_t i = 0; i < r.params.size(); ++i)
      EXPECT_TRUE(bit_identical(reference.params[i], r.params[i])) << policy << " parameter " << i;
  }
}

}  // namespace
}  // namespace ember::nn
