// Gradient accumulation: batch splitting, 4 micro-batches against one batch of 4x the rows (fp32, fp16 mixed precision
// and autocast-fp16 AmpTrainers: one step, one loss-scale update), token-weighted losses with ignore_index targets
// spread unevenly (and a micro-batch with none counted) against a float64 gradient computed with loops, clipping, the
// DDP hook's final flags.
#include <gtest/gtest.h>

#include <cmath>

#include "ember/ember.h"
#include "ember/nn/functional.h"
#include "ember/nn/layers.h"
#include "ember/nn/models.h"
#include "ember/optim/adam.h"
#include "ember/optim/clip_grad.h"
#include "ember/optim/sgd.h"
#include "ember/train/grad_accum.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

namespace F = nn::functional;
using train::AmpMode;
using train::AmpTrainer;
using train::Batch;
using train::LossResult;

optim::OptimizerFactory sgd(double lr) {
  return [lr](std::vector<optim::ParamGroup> g) {
    return std::make_unique<optim::SGD>(std::move(g), optim::SGDOptions{.lr = lr});
  };
}

// Class labels in [0, classes) fixed by `seed` (rand_indices draws a fresh seed per call).
Tensor labels(int64_t n, int64_t classes, uint64_t seed) {
  std::vector<int64_t> v;
  for (double u : rand_input_seeded({n}, seed, 0.0, static_cast<double>(classes)).to_vector<double>())
    v.push_back(static_cast<int64_t>(u));
  return from_vector(v, {n});
}

// The fp32 values the optimizer updates (the masters for fp16 weights), flattened.
std::vector<double> optimizer_values(AmpTrainer& trainer) {
  std::vector<double> out;
  for (const Tensor& p : trainer.optimizer().parameters())
    for (double v : p.to(DType::f64).to_vector<double>()) out.push_back(v);
  return out;
}

TEST(GradAccum, SplitsABatchAlongDimZero) {
  const Tensor x = rand_input_seeded({10, 3}, 1), y = rand_indices({10}, 4);
  EXPECT_EQ(train::batch_rows({x, y}), 10);
  const std::vector<Batch> parts = train::split_batch({x, y}, 4);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0][0].size(0), 4);
  EXPECT_EQ(parts[2][0].size(0), 2) << "the last micro-batch may be smaller";
  EXPECT_EQ(parts[2][1].to_vector<int64_t>(), y.slice(0, 8, 10).to_vector<int64_t>());
  EXPECT_DOUBLE_EQ(parts[1][0].to_vector<double>()[0], x.to_vector<double>()[12]) << "row 4, column 0";
  EXPECT_THROW(train::batch_rows({x, rand_indices({9}, 4)}), ShapeError);
  EXPECT_THROW(train::batch_rows({}), ShapeError);
  EXPECT_THROW(train::batch_rows({scalar_tensor(1.0)}), ShapeError);
  EXPECT_THROW(train::split_batch({x}, 0), ValueError);
  EXPECT_THROW(train::slice_batch({x}, 4, 11), IndexError);
}

struct MlpRun {
  std::vector<double> before, after;
  double loss = 0, loss_scale = 0, grad_norm = 0;
  int64_t micro_batches = 0;
  std::vector<bool> finals;
};

// One SGD step of a 16-32-32-5 MLP on 32 rows: accumulated over `micro` micro-batches, or (micro = 0) one plain
// forward/backward/step on all rows through the trainer (the big-batch reference).
MlpRun mlp_step(AmpMode mode, int64_t micro, double max_grad_norm = 0.0) {
  manual_seed(7);
  std::shared_ptr<nn::Sequential> model = nn::make_mlp({16, 32, 32, 5});
  const Tensor x = rand_input_seeded({32, 16}, 21).to(DType::f32);
  const Tensor y = labels(32, 5, 22);
  optim::GradScalerOptions scaler;
  scaler.growth_interval = 1;  // every clean update doubles the scale: counts the updates
  AmpTrainer trainer(*model, {optim::ParamGroup{model->parameters()}}, sgd(0.5), mode, scaler);
  MlpRun run;
  run.before = optimizer_values(trainer);
  if (micro == 0) {
    Tensor loss;
    {
      AutocastGuard region = trainer.autocast();
      loss = F::cross_entropy(model->forward(x), y);
    }
    trainer.backward(loss);
    if (max_grad_norm > 0) run.grad_norm = trainer.clip_grad_norm_(max_grad_norm);
    EXPECT_TRUE(trainer.step());
    trainer.zero_grad();
    run.loss = loss.item_double();
    run.micro_batches = 1;
  } else {
    train::AccumulationOptions o;
    o.micro_batches = micro;
    o.max_grad_norm = max_grad_norm;
    o.on_micro_batch = [&](bool final) { run.finals.push_back(final); };
    train::GradAccumulator accum(*model, trainer, o);
    const train::StepResult r = accum.step({x, y}, [&](const Batch& b) {
      return LossResult{F::cross_entropy(model->forward(b[0]), b[1]), b[0].size(0)};
    });
    EXPECT_TRUE(r.stepped);
    EXPECT_EQ(r.count, 32);
    EXPECT_EQ(r.samples, 32);
    run.loss = r.loss;
    run.grad_norm = r.grad_norm;
    run.micro_batches = r.micro_batches;
  }
  for (const Tensor& p : model->parameters()) EXPECT_FALSE(p.grad().defined()) << "gradients cleared after the step";
  run.after = optimizer_values(trainer);
  run.loss_scale = trainer.loss_scale();
  return run;
}

// |delta_a - delta_b| <= tol * max |delta_b| elementwise, on the updates (after - before).
void expect_same_update(const MlpRun& a, const MlpRun& b, double tol) {
  ASSERT_EQ(a.before, b.before) << "both runs start from the same weights";
  ASSERT_EQ(a.after.size(), b.after.size());
  double scale = 0;
  for (size_t i = 0; i < b.after.size(); ++i) scale = std::max(scale, std::abs(b.after[i] - b.before[i]));
  ASSERT_GT(scale, 1e-4) << "the step must move the weights";
  double worst = 0;
  for (size_t i = 0; i < a.after.size(); ++i)
    worst = std::max(worst, std::abs((a.after[i] - a.before[i]) - (b.after[i] - b.before[i])));
  EXPECT_LE(worst, tol * scale) << "largest update difference " << worst << " (largest update " << scale << ")";
}

TEST(GradAccum, FourMicroBatchesEqualOneBatchOfFourTimesTheRows) {
  for (AmpMode mode : {AmpMode::none, AmpMode::fp16, AmpMode::autocast_fp16}) {
    SCOPED_TRACE(train::amp_mode_name(mode));
    const MlpRun big = mlp_step(mode, 0);
    const MlpRun accum = mlp_step(mode, 4);
    EXPECT_EQ(accum.micro_batches, 4);
    EXPECT_EQ(accum.finals, (std::vector<bool>{false, false, false, true})) << "no_sync on all but the last";
    // f32: summation order only. fp16: each micro-batch's gradient is rounded to f16 on its own.
    expect_same_update(accum, big, mode == AmpMode::none ? 1e-5 : 1e-2);
    EXPECT_NEAR(accum.loss, big.loss, mode == AmpMode::none ? 1e-6 : 5e-3);
    // One scaler update per effective batch: growth_interval 1 doubles the scale once, not four times.
    const double init = optim::GradScalerOptions{}.init_scale;
    EXPECT_EQ(accum.loss_scale, mode == AmpMode::none ? 1.0 : 2 * init);
    EXPECT_EQ(accum.loss_scale, big.loss_scale);
  }
}

TEST(GradAccum, UnevenMicroBatchesAndClippingSeeTheWholeBatch) {
  // 32 rows in 3 micro-batches: 11 + 11 + 10 (weights 11/32 and 10/32, not 1/3).
  const MlpRun big = mlp_step(AmpMode::none, 0, 0.05);
  const MlpRun accum = mlp_step(AmpMode::none, 3, 0.05);
  EXPECT_EQ(accum.micro_batches, 3);
  expect_same_update(accum, big, 1e-5);
  EXPECT_NEAR(accum.grad_norm, big.grad_norm, 1e-5 * big.grad_norm) << "clipping sees the summed gradient";
  EXPECT_GT(big.grad_norm, 0.05) << "the clip is active";
}

TEST(GradAccum, OneMicroBatchIsBitwiseAPlainStep) {
  const MlpRun big = mlp_step(AmpMode::none, 0);
  const MlpRun one = mlp_step(AmpMode::none, 1);
  EXPECT_EQ(one.after, big.after);
}

TEST(GradAccum, AdamStepsOncePerEffectiveBatch) {
  manual_seed(3);
  std::shared_ptr<nn::Sequential> model = nn::make_mlp({4, 8, 2});
  AmpTrainer trainer(*model, {optim::ParamGroup{model->parameters()}},
                     [](std::vector<optim::ParamGroup> g) { return std::make_unique<optim::AdamW>(std::move(g)); },
                     AmpMode::none);
  train::GradAccumulator accum(*model, trainer, {.micro_batches = 4});
  const Tensor x = rand_input_seeded({12, 4}, 5).to(DType::f32), y = rand_indices({12}, 2);
  auto loss_fn = [&](const Batch& b) {
    return LossResult{F::cross_entropy(model->forward(b[0]), b[1]), b[0].size(0)};
  };
  accum.step({x, y}, loss_fn);
  accum.step({x, y}, loss_fn);
  for (const Tensor& p : model->parameters())
    EXPECT_EQ(trainer.optimizer().state(p).get("step").item_double(), 2.0) << "two effective batches, two steps";
}

// Token loss: a linear classifier over tokens, sequences of 6 tokens, some targets ignored.
constexpr int64_t kSeqs = 8, kTokens = 6, kDim = 5, kClasses = 4, kIgnore = -100;

struct TokenRef {
  std::vector<double> grad_w, grad_b;  // d(mean CE over counted tokens)/d(W, b), float64
  double loss = 0;
  int64_t count = 0;
};

TokenRef token_reference(const std::vector<double>& w, const std::vector<double>& b, const std::vector<double>& x,
                         const std::vector<int64_t>& y) {
  TokenRef r;
  r.grad_w.assign(w.size(), 0.0);
  r.grad_b.assign(b.size(), 0.0);
  for (int64_t n = 0; n < kSeqs * kTokens; ++n)
    if (y[n] != kIgnore) ++r.count;
  for (int64_t n = 0; n < kSeqs * kTokens; ++n) {
    if (y[n] == kIgnore) continue;
    double logits[kClasses], mx = -1e300, z = 0;
    for (int64_t c = 0; c < kClasses; ++c) {
      logits[c] = b[c];
      for (int64_t d = 0; d < kDim; ++d) logits[c] += w[c * kDim + d] * x[n * kDim + d];
      mx = std::max(mx, logits[c]);
    }
    for (int64_t c = 0; c < kClasses; ++c) z += std::exp(logits[c] - mx);
    r.loss += (std::log(z) + mx - logits[y[n]]) / static_cast<double>(r.count);
    for (int64_t c = 0; c < kClasses; ++c) {
      const double dlogit = (std::exp(logits[c] - mx) / z - (c == y[n] ? 1.0 : 0.0)) / static_cast<double>(r.count);
      r.grad_b[c] += dlogit;
      for (int64_t d = 0; d < kDim; ++d) r.grad_w[c * kDim + d] += dlogit * x[n * kDim + d];
    }
  }
  return r;
}

void check_token_weighting(bool first_micro_all_ignored) {
  SCOPED_TRACE(first_micro_all_ignored ? "first micro-batch counts nothing" : "uneven counts");
  manual_seed(11);
  nn::Linear model(kDim, kClasses);
  const Tensor x = rand_input_seeded({kSeqs, kTokens, kDim}, 31).to(DType::f32);
  // Ignored targets spread unevenly: sequence s ignores its first (s * 5) % 7 tokens (at most all 6).
  std::vector<int64_t> yv(kSeqs * kTokens);
  const std::vector<int64_t> labels = rand_indices({kSeqs * kTokens}, kClasses).to_vector<int64_t>();
  for (int64_t s = 0; s < kSeqs; ++s)
    for (int64_t t = 0; t < kTokens; ++t) {
      const int64_t ignored = first_micro_all_ignored && s < 2 ? kTokens : (s * 5) % 7;
      yv[s * kTokens + t] = t < ignored ? kIgnore : labels[s * kTokens + t];
    }
  const Tensor y = from_vector(yv, {kSeqs, kTokens});
  const std::vector<double> w = model.weight.to(DType::f64).to_vector<double>();
  const std::vector<double> b = model.bias.to(DType::f64).to_vector<double>();
  const TokenRef ref = token_reference(w, b, x.to(DType::f64).to_vector<double>(), yv);

  AmpTrainer trainer(model, {optim::ParamGroup{model.parameters()}}, sgd(1.0), AmpMode::none);
  train::GradAccumulator accum(model, trainer, {.micro_batches = 4});
  std::vector<int64_t> counts;
  const train::StepResult r = accum.step({x, y}, [&](const Batch& mb) {
    const Tensor logits = model.forward(mb[0].reshape({-1, kDim}));
    const Tensor targets = mb[1].reshape({-1});
    int64_t count = 0;
    for (int64_t v : targets.to_vector<int64_t>()) count += v != kIgnore;
    counts.push_back(count);
    return LossResult{F::cross_entropy(logits, targets, kIgnore), count};
  });
  ASSERT_EQ(counts.size(), 4u);
  if (first_micro_all_ignored) EXPECT_EQ(counts[0], 0);
  EXPECT_NE(counts[1], counts[3]) << "the test needs uneven counts";
  EXPECT_EQ(r.count, ref.count);
  EXPECT_NEAR(r.loss, ref.loss, 1e-6 * std::abs(ref.loss));
  // SGD with lr 1: the update is minus the gradient.
  const std::vector<double> w_after = model.weight.to(DType::f64).to_vector<double>();
  const std::vector<double> b_after = model.bias.to(DType::f64).to_vector<double>();
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i] - w_after[i], ref.grad_w[i], 2e-6) << "weight " << i;
  for (size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(b[i] - b_after[i], ref.grad_b[i], 2e-6) << "bias " << i;
  // The same step weighted 1/N per micro-batch would be measurably off: the test can tell the two apart.
  double naive_gap = 0;
  for (size_t m = 0; m < counts.size(); ++m)
    naive_gap = std::max(naive_gap, std::abs(0.25 - static_cast<double>(counts[m]) / static_cast<double>(ref.count)));
  EXPECT_GT(naive_gap, 0.02);
}

TEST(GradAccum, TokenLossesAreWeightedByTheirCounts) {
  check_token_weighting(false);
  check_token_weighting(true);
}

TEST(GradAccum, RejectsBadLossResultsAndOptions) {
  manual_seed(1);
  nn::Linear model(3, 2);
  AmpTrainer trainer(model, {optim::ParamGroup{model.parameters()}}, sgd(0.1), AmpMode::none);
  EXPECT_THROW(train::GradAccumulator(model, trainer, {.micro_batches = 0}), ValueError);
  train::GradAccumulator accum(model, trainer, {.micro_batches = 2});
  const Tensor x = rand_input_seeded({4, 3}, 2).to(DType::f32);
  EXPECT_THROW(accum.step({x}, [&](const Batch& b) { return LossResult{model.forward(b[0]), 2}; }), ValueError)
      << "a loss of more than one element";
  EXPECT_THROW(accum.step({x}, [&](const Batch& b) { return LossResult{sum(model.forward(b[0])), -1}; }),
               ValueError);
  // Nothing counted anywhere: no step, NaN loss, no gradient left behind.
  const std::vector<float> before = model.weight.to_vector<float>();
  const train::StepResult r = accum.step({x}, [&](const Batch& b) { return LossResult{sum(model.forward(b[0])), 0}; });
  EXPECT_FALSE(r.stepped);
  EXPECT_TRUE(std::isnan(r.loss));
  EXPECT_EQ(model.weight.to_vector<float>(), before);
  EXPECT_FALSE(model.weight.grad().defined());
}

}  // namespace
}  // namespace ember::testing
