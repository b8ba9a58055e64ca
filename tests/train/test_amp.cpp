// AmpTrainer: mode parsing, each precision recipe trains a small regression to the fp32 result, the byte breakdown by
// role against hand-counted bytes, clipping sees unscaled gradients, and a planted NaN skips the step in every mode.
#include <gtest/gtest.h>

#include "ember/ember.h"
#include "ember/nn/functional.h"
#include "ember/nn/layers.h"
#include "ember/optim/adam.h"
#include "ember/train/amp.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

namespace F = nn::functional;
using train::AmpMode;
using train::AmpTrainer;

optim::OptimizerFactory adamw(double lr) {
  return [lr](std::vector<optim::ParamGroup> g) {
    return std::make_unique<optim::AdamW>(std::move(g), optim::AdamWOptions{.lr = lr, .weight_decay = 0.0});
  };
}

TEST(AmpMode, ParsesEveryModeAndRejectsOthers) {
  for (AmpMode m : {AmpMode::none, AmpMode::fp16, AmpMode::bf16, AmpMode::autocast_fp16, AmpMode::autocast_bf16})
    EXPECT_EQ(train::parse_amp_mode(train::amp_mode_name(m)), m);
  EXPECT_EQ(train::parse_amp_mode("fp32"), AmpMode::none);
  EXPECT_EQ(train::amp_weight_dtype(AmpMode::fp16), DType::f16);
  EXPECT_EQ(train::amp_weight_dtype(AmpMode::autocast_fp16), DType::f32);
  EXPECT_EQ(train::amp_autocast_dtype(AmpMode::autocast_bf16), DType::bf16);
  const std::string msg = error_message<ConfigError>([] { train::parse_amp_mode("fp8"); });
  EXPECT_NE(msg.find("fp8"), std::string::npos);
  EXPECT_NE(msg.find("autocast-bf16"), std::string::npos) << msg;
}

// y = x @ w_true^T + noise-free: a linear regression every recipe should fit to about the same loss as fp32.
struct Regression {
  Tensor x, y;
  Regression() {
    const Tensor w_true = rand_input_seeded({3, 8}, 11).to(DType::f32);
    x = rand_input_seeded({64, 8}, 12).to(DType::f32);
    y = matmul(x, w_true.t());
  }
};

double train_loss(AmpMode mode, int64_t steps, int64_t* skipped = nullptr) {
  const Regression data;
  manual_seed(3);
  nn::Linear model(8, 3);
  AmpTrainer trainer(model, {optim::ParamGroup{model.parameters()}}, adamw(3e-2), mode);
  double last = 0;
  for (int64_t i = 0; i < steps; ++i) {
    Tensor loss;
    {
      AutocastGuard region = trainer.autocast();
      loss = F::mse_loss(model.forward(data.x), data.y);
      EXPECT_EQ(loss.dtype(), DType::f32) << "losses run in fp32 under autocast";
    }
    trainer.backward(loss);
    trainer.clip_grad_norm_(10.0);
    trainer.step();
    trainer.zero_grad();
    last = loss.item_double();
  }
  if (skipped) *skipped = trainer.steps_skipped();
  return last;
}

TEST(AmpTrainer, EveryModeFitsARegressionLikeFp32) {
  const double ref = train_loss(AmpMode::none, 150);
  ASSERT_LT(ref, 2e-3) << "the fp32 recipe itself must fit";
  for (AmpMode m : {AmpMode::fp16, AmpMode::bf16, AmpMode::autocast_fp16, AmpMode::autocast_bf16}) {
    int64_t skipped = -1;
    const double loss = train_loss(m, 150, &skipped);
    // bf16 keeps 8 mantissa bits: its weights and products limit the fit more than f16's 11.
    const bool bf = m == AmpMode::bf16 || m == AmpMode::autocast_bf16;
    EXPECT_LT(loss, bf ? 2e-2 : 5e-3) << train::amp_mode_name(m);
    EXPECT_LE(skipped, 1) << train::amp_mode_name(m) << ": at most the first, overflowing step is skipped";
  }
}

TEST(AmpTrainer, MemoryBreakdownCountsBytesByRole) {
  // Linear(8, 3): weight 24 + bias 3 = 27 parameters in two tensors.
  manual_seed(1);
  const Regression data;
  for (AmpMode m : {AmpMode::none, AmpMode::fp16}) {
    nn::Linear model(8, 3);
    AmpTrainer trainer(model, {optim::ParamGroup{model.parameters()}}, adamw(1e-3), m);
    Tensor loss;
    {
      AutocastGuard region = trainer.autocast();
      loss = F::mse_loss(model.forward(data.x), data.y);
    }
    trainer.backward(loss);
    const int64_t wbytes = m == AmpMode::fp16 ? 2 : 4;
    train::MemoryBreakdown b = trainer.memory();
    EXPECT_EQ(b.weights, 27 * wbytes);
    EXPECT_EQ(b.grads, 27 * wbytes);
    EXPECT_EQ(b.master_weights, m == AmpMode::fp16 ? 27 * 4 : 0);
    EXPECT_EQ(b.optimizer_state, 0) << "state is made by the first step";
    ASSERT_TRUE(trainer.step());
    b = trainer.memory();
    // AdamW: exp_avg and exp_avg_sq in f32 per parameter, and a 0-d f64 step counter per tensor.
    EXPECT_EQ(b.optimizer_state, 27 * 8 + 2 * 8);
    if (m == AmpMode::fp16) {
      EXPECT_EQ(b.grads, 0) << "the f16 gradients were consumed by the unscale";
      EXPECT_EQ(b.master_grads, 27 * 4);
      // Note [Mixed-precision memory]: 2 + 4 + 8 steady bytes per parameter, plus the f16 gradient in backward.
      EXPECT_EQ(b.weights + b.master_weights + b.optimizer_state - 2 * 8, 27 * 14);
    }
    trainer.zero_grad();
    EXPECT_EQ(trainer.memory().grads + trainer.memory().master_grads, 0);
    EXPECT_FALSE(trainer.memory().to_string().empty());
  }
}

TEST(AmpTrainer, ClippingSeesUnscaledGradientsAndANaNSkipsTheStep) {
  const Regression data;
  for (AmpMode m : {AmpMode::none, AmpMode::fp16, AmpMode::autocast_fp16}) {
    SCOPED_TRACE(train::amp_mode_name(m));
    manual_seed(5);
    nn::Linear ref_model(8, 3);
    manual_seed(5);
    nn::Linear model(8, 3);
    // The fp32 gradient norm of the same model on the same batch (f16 rounding of the weights aside).
    F::mse_loss(ref_model.forward(data.x), data.y).backward();
    const double ref_norm = optim::grad_norm(ref_model.parameters());
    AmpTrainer trainer(model, {optim::ParamGroup{model.parameters()}}, adamw(1e-3), m);
    Tensor loss;
    {
      AutocastGuard region = trainer.autocast();
      loss = F::mse_loss(model.forward(data.x), data.y);
    }
    trainer.backward(loss);
    EXPECT_NEAR(trainer.clip_grad_norm_(1e9), ref_norm, 2e-2 * ref_norm);
    EXPECT_TRUE(trainer.step());
    trainer.zero_grad();

    // A NaN input makes every gradient NaN: the step is skipped and the weights stay.
    const std::vector<float> before = model.weight.to(DType::f32).to_vector<float>();
    Tensor bad = data.x.clone();
    bad.fill_(std::numeric_limits<double>::quiet_NaN());
    {
      AutocastGuard region = trainer.autocast();
      loss = F::mse_loss(model.forward(bad), data.y);
    }
    trainer.backward(loss);
    if (m == AmpMode::none) {
      trainer.step();  // plain fp32 has no check: the NaN goes into the weights, as in PyTorch without a scaler
      EXPECT_EQ(trainer.steps_skipped(), 0);
    } else {
      EXPECT_FALSE(trainer.step());
      EXPECT_EQ(trainer.steps_skipped(), 1);
      EXPECT_EQ(model.weight.to(DType::f32).to_vector<float>(), before);
    }
  }
}

// state_dict / load_state_dict: 2 steps, save (deep copies of the model's and the trainer's state), 3 more steps;
// then load the saved state and run the same 3 steps again — the weights and the loss scale come out bitwise equal.
TEST(AmpTrainer, StateDictRoundTripRepeatsTheSameSteps) {
  const Regression data;
  for (AmpMode mode : {AmpMode::none, AmpMode::fp16, AmpMode::bf16, AmpMode::autocast_fp16, AmpMode::autocast_bf16}) {
    SCOPED_TRACE(train::amp_mode_name(mode));
    manual_seed(3);
    nn::Linear model(8, 3);
    AmpTrainer trainer(model, {optim::ParamGroup{model.parameters()}}, adamw(3e-2), mode);
    auto step = [&] {
      Tensor loss;
      {
        AutocastGuard region = trainer.autocast();
        loss = F::mse_loss(model.forward(data.x), data.y);
      }
      trainer.backward(loss);
      trainer.step();
      trainer.zero_grad();
    };
    auto deep = [](const optim::StateDict& d) {
      optim::StateDict out;
      for (const auto& [name, t] : d) out.emplace_back(name, t.detach().clone());
      return out;
    };
    step();
    step();
    const optim::StateDict saved_trainer = deep(trainer.state_dict());
    const optim::StateDict saved_model = deep(model.state_dict());
    for (int i = 0; i < 3; ++i) step();
    const std::vector<double> want = model.weight.to(DType::f64).to_vector<double>();
    const double want_scale = trainer.loss_scale();
    model.load_state_dict(saved_model);
    trainer.load_state_dict(saved_trainer);
    for (int i = 0; i < 3; ++i) step();
    EXPECT_EQ(model.weight.to(DType::f64).to_vector<double>(), want);
    EXPECT_EQ(trainer.loss_scale(), want_scale);
  }
  // A dict of another mode is refused before anything changes.
  manual_seed(3);
  nn::Linear a(8, 3), b(8, 3);
  AmpTrainer plain(a, {optim::ParamGroup{a.parameters()}}, adamw(3e-2), AmpMode::none);
  AmpTrainer scaled(b, {optim::ParamGroup{b.parameters()}}, adamw(3e-2), AmpMode::autocast_fp16);
  EXPECT_THROW(scaled.load_state_dict(plain.state_dict()), ValueError);
  EXPECT_THROW(plain.load_state_dict(scaled.state_dict()), ValueError);
}

// A step abandoned after clip_grad_norm_ (the gradients unscaled, then an OOM, then zero_grad) must not leave the
// trainer believing the next step's gradients are already unscaled: the next step equals a fresh trainer's.
TEST(AmpTrainer, AStepAbandonedAfterClippingDoesNotLeakIntoTheNext) {
  const Regression data;
  for (AmpMode mode : {AmpMode::fp16, AmpMode::autocast_fp16, AmpMode::bf16, AmpMode::none}) {
    SCOPED_TRACE(train::amp_mode_name(mode));
    auto run = [&](bool abandon_first) {
      manual_seed(3);
      nn::Linear model(8, 3);
      AmpTrainer trainer(model, {optim::ParamGroup{model.parameters()}}, adamw(3e-2), mode);
      auto loss_of = [&] {
        AutocastGuard region = trainer.autocast();
        return F::mse_loss(model.forward(data.x), data.y);
      };
      if (abandon_first) {
        trainer.backward(loss_of());
        trainer.clip_grad_norm_(1.0);
        trainer.zero_grad();  // the step is given up
      }
      trainer.backward(loss_of());
      const double norm = trainer.clip_grad_norm_(1e9);
      EXPECT_TRUE(trainer.step());
      return std::make_pair(norm, model.weight.to(DType::f64).to_vector<double>());
    };
    const auto fresh = run(false), after = run(true);
    EXPECT_DOUBLE_EQ(after.first, fresh.first) << "the clip saw scaled (or zeroed) gradients";
    EXPECT_EQ(after.second, fresh.second);
  }
}

}  // namespace
}  // namespace ember::testing
