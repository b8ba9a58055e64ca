// Training plans under a budget: candidates are consistent (micro-batch x accumulation = batch, fits = predicted
// peak within the budget or a constrained dry run that completes), ranked (the best is the cheapest that fits), the
// cost model is the documented formula, and the best plan of a tight budget really fits when the step is run.
#include <gtest/gtest.h>

#include <cmath>

#include "ember/base/error.h"
#include "ember/train/estimate.h"
#include "ember/train/memory_plan.h"

namespace ember::train {
namespace {

// A plan for a CUDA device predicts with the CUDA kernels' workspace (Note [Dry-run targets]): its candidates' peaks
// are those of estimate_step with a CUDA target, under the same policy.
TEST(MemoryPlan, ACudaPlanPredictsWithTheCudaTarget) {
  PlanOptions o;
  o.model = "gpt";
  o.batch = 8;
  o.budget_bytes = int64_t{1} << 40;
  o.amps = {"autocast-bf16"};
  o.checkpoints = {"none"};
  o.max_grad_accum = 1;
  o.device = DeviceType::CUDA;
  o.allocator = memory::AllocatorConfig{};
  const TrainingPlan plan = plan_training(o);
  ASSERT_EQ(plan.candidates.size(), 1u);
  EstimateOptions e;
  e.model = "gpt";
  e.batch = 8;
  e.amp = "autocast-bf16";
  e.allocator = memory::AllocatorConfig{};
  e.target = MetaTarget::cuda();
  EXPECT_EQ(plan.candidates[0].predicted_peak_allocated, estimate_step(e).peak_allocated_bytes);
  e.target = MetaTarget::cpu();
  EXPECT_LT(plan.candidates[0].predicted_peak_allocated, estimate_step(e).peak_allocated_bytes);
}

TEST(MemoryPlan, RanksCandidatesAndTheBestFitsWhenRun) {
  // The unconstrained fp32 step of the gpt config at batch 24, then a budget of 60% of its reserved peak (its
  // activations are most of the step's memory, so accumulation and checkpointing can bring it under).
  EstimateOptions full;
  full.model = "gpt";
  full.batch = 24;
  const MemoryEstimate whole = estimate_step(full);
  PlanOptions o;
  o.model = "gpt";
  o.batch = 24;
  o.budget_bytes = whole.peak_reserved_bytes * 6 / 10;
  o.amps = {"none", "bf16"};
  o.checkpoints = {"none", "sqrt"};
  const TrainingPlan plan = plan_training(o);
  std::printf("%s", plan.to_string().c_str());
  ASSERT_FALSE(plan.candidates.empty());
  bool seen_unfit = false;
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    const PlanCandidate& c = plan.candidates[i];
    EXPECT_EQ(c.micro_batch * c.grad_accum, 24);
    if (c.fits) {
      EXPECT_FALSE(seen_unfit) << "fitting candidates come first";
      if (i > 0) EXPECT_GE(c.relative_cost, plan.candidates[i - 1].relative_cost);
    } else {
      seen_unfit = true;
      EXPECT_GT(c.predicted_peak_reserved, o.budget_bytes);
    }
    // Note [Plan cost model], recomputed by hand.
    const double precision = c.amp == "bf16" ? 1.06 : 1.0;
    EXPECT_NEAR(c.relative_cost, precision * (1 + c.recompute_fraction / 3) * (1 + 0.02 * double(c.grad_accum - 1)),
                1e-12);
  }
  const PlanCandidate* best = plan.best();
  ASSERT_NE(best, nullptr) << "a plan with accumulation fits 60% of the full step";
  EXPECT_FALSE(best->amp == "none" && best->checkpoint == "none" && best->grad_accum == 1);
  // Run it for real: the measured peak reserved stays within the budget (5% for the estimator's tolerance).
  EstimateOptions run;
  run.model = "gpt";
  run.batch = 24;
  run.amp = best->amp;
  run.checkpoint = best->checkpoint;
  run.grad_accum = best->grad_accum;
  const MemoryEstimate measured = measure_step(run);
  EXPECT_LE(double(measured.peak_reserved_bytes), 1.05 * double(o.budget_bytes)) << measured.to_string();
  EXPECT_NE(plan.to_json().find("\"candidates\""), std::string::npos);
}

TEST(MemoryPlan, NothingFitsATinyBudget) {
  PlanOptions o;
  o.model = "mlp";
  o.batch = 8;
  o.budget_bytes = 1 << 20;  // the mlp's weights alone are 7 MiB
  o.amps = {"none"};
  o.checkpoints = {"none"};
  o.max_grad_accum = 8;
  const TrainingPlan plan = plan_training(o);
  EXPECT_EQ(plan.best(), nullptr);
  ASSERT_EQ(plan.candidates.size(), 4u);  // accumulation 1, 2, 4, 8, none fitting
  EXPECT_NE(plan.to_string().find("nothing fits"), std::string::npos);
  o.amps = {"none", "fp32", "none"};  // one precision under two spellings, and a repeat
  o.checkpoints = {"none", "none"};
  EXPECT_EQ(plan_training(o).candidates.size(), 4u) << "each combination planned once";
}

TEST(MemoryPlan, ConfigsWithoutABlockChainPlanWithoutCheckpointing) {
  // The default policies are none and sqrt; the cnn config has no block chain, so only none applies to it (as
  // `ember plan --model cnn` with its default --checkpoint list needs).
  PlanOptions o;
  o.model = "cnn";
  o.batch = 8;
  o.budget_bytes = int64_t{1} << 30;
  o.amps = {"none"};
  o.max_grad_accum = 1;
  const TrainingPlan plan = plan_training(o);
  ASSERT_EQ(plan.candidates.size(), 1u);
  EXPECT_EQ(plan.candidates[0].checkpoint, "none");
  EXPECT_NE(plan.best(), nullptr);
  o.checkpoints = {"sqrt"};  // asked for checkpointing only: nothing to plan
  EXPECT_THROW(plan_training(o), ValueError);
}

TEST(MemoryPlan, RejectsBadOptions) {
  PlanOptions o;
  o.model = "mlp";
  EXPECT_THROW(plan_training(o), ValueError);  // no budget
  o.budget_bytes = 1 << 30;
  o.amps = {"fp8"};
  EXPECT_THROW(plan_training(o), ConfigError);
  o.amps = {"none"};
  o.checkpoints = {"every-other"};
  EXPECT_THROW(plan_training(o), ConfigError);
  o.checkpoints = {};
  EXPECT_THROW(plan_training(o), ValueError);
  o.checkpoints = {"none"};
  o.batch = -4;  // not the config's default
  EXPECT_THROW(plan_training(o), ValueError);
  o.batch = 0;
  o.precision_factors = {{"fp16", -1.0}};  // an override is checked whether or not its precision is planned
  EXPECT_THROW(plan_training(o), ValueError);
  o.precision_factors = {{"fp8", 1.0}};
  EXPECT_THROW(plan_training(o), ConfigError);
}

}  // namespace
}  // namespace ember::train
