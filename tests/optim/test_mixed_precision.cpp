// Tests of MixedPrecisionOptimizer on a two-layer f16 / bf16 model with an MSE loss: fp32 masters, weights equal to
// their masters rounded after each step, master gradients equal to model gradients / scale, training against the same
// model in fp32, gradient accumulation against one whole-batch step, skipped steps (weights, masters and AdamW state
// byte for byte), the dynamic scale, bf16 without scaling, memory_use() counted by hand, the state_dict round trip,
// and errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "ember/optim/optim.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

namespace F = nn::functional;
using optim::AdamW;
using optim::AdamWOptions;
using optim::GradScalerOptions;
using optim::MixedPrecisionOptimizer;
using optim::MixedPrecisionOptions;
using optim::Optimizer;
using optim::ParamGroup;
using optim::SGD;
using optim::SGDOptions;
using optim::StateDict;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<unsigned char> out(static_cast<size_t>(c.nbytes()));
  if (!out.empty()) std::memcpy(out.data(), c.raw_data(), out.size());
  return out;
}

optim::OptimizerFactory adamw(double lr) {
  return [lr](std::vector<ParamGroup> g) { return std::make_unique<AdamW>(std::move(g), AdamWOptions{.lr = lr}); };
}
optim::OptimizerFactory sgd(double lr) {
  return [lr](std::vector<ParamGroup> g) { return std::make_unique<SGD>(std::move(g), SGDOptions{.lr = lr}); };
}

MixedPrecisionOptions f16_options(double init_scale, int64_t growth_interval = 2000) {
  return {DType::f16, GradScalerOptions{.init_scale = init_scale, .growth_interval = growth_interval}};
}

// Linear(8, 16) -> relu -> Linear(16, 4): 8*16 + 16 + 16*4 + 4 = 212 parameters in 4 tensors.
struct TwoLayer {
  nn::Linear l1{8, 16}, l2{16, 4};
  static constexpr int64_t kNumel = 212;
  Tensor forward(const Tensor& x) { return l2.forward(ember::relu(l1.forward(x))); }
  std::vector<Tensor> parameters() const { return {l1.weight, l1.bias, l2.weight, l2.bias}; }
  void to(DType d) {
    l1.to(d);
    l2.to(d);
  }
  void copy_from(const TwoLayer& o) {  // values cast to this model's dtype
    NoGradGuard no_grad;
    const std::vector<Tensor> mine = parameters(), theirs = o.parameters();
    for (size_t i = 0; i < mine.size(); ++i) Tensor(mine[i]).copy_(theirs[i]);
  }
};

struct Batch {
  Tensor x, y;  // f64 values; each test casts them
};
Batch make_batch(int64_t rows) { return {rand_input({rows, 8}, -2.0, 2.0), rand_input({rows, 4})}; }

Tensor loss_of(TwoLayer& m, const Batch& b, DType dt) { return F::mse_loss(m.forward(b.x.to(dt)), b.y.to(dt)); }

void expect_weights_are_rounded_masters(const MixedPrecisionOptimizer& opt) {
  for (const Tensor& p : opt.model_parameters())
    EXPECT_EQ(bytes_of(p), bytes_of(opt.master_of(p).to(p.dtype())));
}

TEST(MixedPrecision, MastersAreFp32Copies) {
  manual_seed(1);
  TwoLayer model;
  model.to(DType::f16);
  MixedPrecisionOptimizer opt(model.parameters(), adamw(1e-3));
  ASSERT_EQ(opt.master_parameters().size(), 4u);
  for (const Tensor& p : model.parameters()) {
    const Tensor& m = opt.master_of(p);
    EXPECT_EQ(m.dtype(), DType::f32);
    EXPECT_EQ(m.sizes(), p.sizes());
    EXPECT_NE(m.storage().get(), p.storage().get());
    EXPECT_TRUE(m.requires_grad());
    EXPECT_TRUE(allclose(m, p.to(DType::f64), {0.0, 0.0}));  // f16 -> f32 is exact
  }
  EXPECT_EQ(opt.inner().num_parameters(), 4);
  EXPECT_EQ(opt.loss_scale(), 65536.0);
}

// Master gradients are the model gradients divided by the scale (checked in f64 here), and the model gradients are
// freed by unscale_ (Note [Mixed-precision memory]).
TEST(MixedPrecision, UnscaleWritesMasterGradientsAndFreesModelGradients) {
  manual_seed(2);
  TwoLayer model;
  model.to(DType::f16);
  MixedPrecisionOptimizer opt(model.parameters(), adamw(1e-3), f16_options(1000.0));
  const Batch b = make_batch(6);
  opt.backward(loss_of(model, b, DType::f16));
  std::vector<std::vector<double>> scaled;
  for (const Tensor& p : model.parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().dtype(), DType::f16);
    scaled.push_back(p.grad().to_vector<double>());
  }
  opt.unscale_();
  const std::vector<Tensor> params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_FALSE(params[i].grad().defined());
    const Tensor mg = opt.master_of(params[i]).grad();
    ASSERT_TRUE(mg.defined());
    EXPECT_EQ(mg.dtype(), DType::f32);
    std::vector<double> want = scaled[i];
    for (double& v : want) v /= 1000.0;
    // f32 product with the f32 reciprocal of 1000: two roundings.
    EXPECT_TRUE(allclose(mg, from_vector(want, mg.sizes()), {3e-7, 1e-12})) << "param " << i;
  }
  EXPECT_NE(error_message<ValueError>([&] { opt.unscale_(); }).find("unscale_"), std::string::npos);
  EXPECT_TRUE(opt.step());
  expect_weights_are_rounded_masters(opt);
}

// The same model trained in fp32 (from the same, 16-bit representable, initial weights) and in f16 / bf16 with fp32
// masters, 8 AdamW steps at lr 1e-3. Tolerances: the 16-bit loss is itself rounded once (relative 2^-11 for f16,
// 2^-8 for bf16) after a forward pass of 16-bit roundings, so it must agree within a few of those roundings: 2e-3
// (f16) and 1e-2 (bf16) relative. AdamW moves each weight by up to lr per step (8e-3 over the run); the 16-bit
// gradients only perturb the normalised update of elements whose gradient is small, so the masters must agree within
// 1e-3 (f16) and 2e-3 (bf16), an eighth and a quarter of the largest movement (observed: 2e-4 and 4e-4).
TEST(MixedPrecision, F16AndBF16TrainingFollowFp32AdamW) {
  for (DType dt : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    manual_seed(7);
    TwoLayer model, reference;
    model.to(dt);
    reference.copy_from(model);  // fp32 reference starts at the rounded weights
    const double lr = 1e-3;
    MixedPrecisionOptimizer opt(model.parameters(), adamw(lr), {dt, GradScalerOptions{.init_scale = 1024.0}});
    AdamW ref_opt(reference.parameters(), AdamWOptions{.lr = lr});
    const Batch b = make_batch(16);
    const double loss_tol = dt == DType::f16 ? 2e-3 : 1e-2;
    const double weight_tol = dt == DType::f16 ? 1e-3 : 2e-3;
    for (int step = 0; step < 8; ++step) {
      SCOPED_TRACE(::testing::Message() << "step " << step);
      const Tensor loss = loss_of(model, b, dt);
      const Tensor ref_loss = loss_of(reference, b, DType::f32);
      EXPECT_NEAR(loss.item_double(), ref_loss.item_double(), loss_tol * ref_loss.item_double());
      opt.backward(loss);
      ASSERT_TRUE(opt.step());
      ref_loss.backward();
      ref_opt.step();
      opt.zero_grad();
      ref_opt.zero_grad();
      expect_weights_are_rounded_masters(opt);
      const std::vector<Tensor> a = opt.master_parameters(), r = reference.parameters();
      for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(allclose(a[i], r[i], {0.0, weight_tol})) << "param " << i;
    }
  }
}

TEST(MixedPrecision, AccumulationOverFourMicroBatchesEqualsOneBatchStep) {
  for (DType dt : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    manual_seed(11);
    TwoLayer accum, whole;
    accum.to(dt);
    whole.to(dt);
    whole.copy_from(accum);
    const MixedPrecisionOptions o{dt, GradScalerOptions{.init_scale = 512.0, .growth_interval = 1}};
    MixedPrecisionOptimizer accum_opt(accum.parameters(), sgd(0.5), o);
    MixedPrecisionOptimizer whole_opt(whole.parameters(), sgd(0.5), o);
    const Batch b = make_batch(8);
    const double scale = accum_opt.loss_scale();
    for (int64_t m = 0; m < 4; ++m) {
      const Batch part{b.x.narrow(0, 2 * m, 2), b.y.narrow(0, 2 * m, 2)};
      accum_opt.backward(ember::div(loss_of(accum, part, dt), 4.0));
      EXPECT_EQ(accum_opt.loss_scale(), scale);  // constant across micro-batches
    }
    whole_opt.backward(loss_of(whole, b, dt));
    EXPECT_TRUE(accum_opt.step());
    EXPECT_TRUE(whole_opt.step());
    // Both steps' gradients differ by the 16-bit rounding of 4 accumulated partial sums (relative 2^-11 for f16,
    // 2^-8 for bf16, a few times); times lr 0.5 and gradients of size ~1 that is well below these bounds.
    const double tol = dt == DType::f16 ? 2e-3 : 2e-2;
    const std::vector<Tensor> a = accum_opt.master_parameters(), w = whole_opt.master_parameters();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(allclose(a[i], w[i], {0.0, tol})) << "param " << i;
    EXPECT_EQ(accum_opt.loss_scale(), dt == DType::f16 ? 2 * scale : 1.0);  // one update per effective batch
  }
}

TEST(MixedPrecision, SkippedStepLeavesWeightsMastersAndAdamWStateUntouched) {
  manual_seed(13);
  TwoLayer model;
  model.to(DType::f16);
  MixedPrecisionOptimizer opt(model.parameters(), adamw(1e-2), f16_options(256.0, 3));
  const Batch b = make_batch(4);
  opt.backward(loss_of(model, b, DType::f16));
  ASSERT_TRUE(opt.step());
  opt.zero_grad();
  const std::vector<Tensor> params = model.parameters();
  auto snapshot = [&] {
    std::vector<std::vector<unsigned char>> s;
    for (const Tensor& p : params) {
      const Tensor& m = opt.master_of(p);
      s.push_back(bytes_of(p));
      s.push_back(bytes_of(m));
      for (const auto& [key, t] : opt.inner().state(m).entries()) s.push_back(bytes_of(t));
    }
    return s;
  };
  const auto before = snapshot();
  ASSERT_EQ(before.size(), 4u * 5u);  // weight, master, step, exp_avg, exp_avg_sq
  double scale = 256.0;
  for (double bad : {kInf, -kInf, std::nan("")}) {
    opt.backward(loss_of(model, b, DType::f16));
    params[2].grad().narrow(0, 1, 1).fill_(bad);  // one element of l2.weight's gradient
    EXPECT_FALSE(opt.step());
    EXPECT_TRUE(opt.last_step_skipped());
    opt.zero_grad();
    EXPECT_EQ(snapshot(), before);
    scale /= 2;
    EXPECT_EQ(opt.loss_scale(), scale);
  }
  EXPECT_EQ(opt.steps_skipped(), 3);
  // Growth after 3 clean steps (interval 3).
  for (int k = 0; k < 3; ++k) {
    opt.backward(loss_of(model, b, DType::f16));
    EXPECT_TRUE(opt.step());
    EXPECT_FALSE(opt.last_step_skipped());
    opt.zero_grad();
  }
  EXPECT_EQ(opt.loss_scale(), 2 * scale);
  EXPECT_NE(snapshot(), before);
}

// PyTorch's default init_scale 2^16 overflows f16 gradients of a pure-f16 model on the first step: the dynamic scale
// backs off until the gradients fit, skipping those steps, then training proceeds.
TEST(MixedPrecision, DefaultScaleCalibratesItself) {
  manual_seed(17);
  TwoLayer model;
  model.to(DType::f16);
  MixedPrecisionOptimizer opt(model.parameters(), adamw(1e-3));
  const Batch b = make_batch(4);
  int clean = 0;
  for (int k = 0; k < 12 && clean < 2; ++k) {
    opt.backward(loss_of(model, b, DType::f16));
    clean += opt.step() ? 1 : 0;
    opt.zero_grad();
  }
  EXPECT_EQ(clean, 2);
  EXPECT_GE(opt.steps_skipped(), 1);
  EXPECT_EQ(opt.loss_scale(), 65536.0 / std::pow(2.0, static_cast<double>(opt.steps_skipped())));
}

TEST(MixedPrecision, BF16HasNoScalingButStillSkipsInf) {
  manual_seed(19);
  TwoLayer model;
  model.to(DType::bf16);
  MixedPrecisionOptimizer opt(model.parameters(), adamw(1e-2),
                              {DType::bf16, GradScalerOptions{.init_scale = 1024.0, .growth_interval = 1}});
  EXPECT_EQ(opt.loss_scale(), 1.0);
  const Batch b = make_batch(4);
  const Tensor loss = loss_of(model, b, DType::bf16);
  EXPECT_TRUE(opt.scale_loss(loss).is_same(loss));
  opt.backward(loss);
  ASSERT_TRUE(opt.step());
  EXPECT_EQ(opt.loss_scale(), 1.0);  // no growth either
  opt.zero_grad();
  const std::vector<unsigned char> w0 = bytes_of(model.l1.weight);
  opt.backward(loss_of(model, b, DType::bf16));
  model.l1.bias.grad().narrow(0, 0, 1).fill_(kInf);
  EXPECT_FALSE(opt.step());
  EXPECT_EQ(bytes_of(model.l1.weight), w0);
  EXPECT_EQ(opt.loss_scale(), 1.0);
  const StateDict sd = opt.state_dict();
  for (const auto& [name, t] : sd)
    if (name == "scaler.scale") EXPECT_EQ(t.item_double(), 1.0);
}

// Note [Mixed-precision memory], counted by hand for 212 parameters in 4 tensors with AdamW: 2 bytes of f16 weight,
// 2 of f16 gradient (until unscale_), 4 of fp32 master, 4 of master gradient (after unscale_, until zero_grad) and
// 8 of exp_avg + exp_avg_sq; AdamW's "step" is one 0-d f64 (8 bytes) per tensor.
TEST(MixedPrecision, MemoryUseByHand) {
  TwoLayer model;
  model.to(DType::f16);
  MixedPrecisionOptimizer opt(model.parameters(), adamw(1e-3), f16_options(256.0));
  const int64_t n = TwoLayer::kNumel, tensors = 4;
  auto check = [&](int64_t w, int64_t g, int64_t m, int64_t mg, int64_t s) {
    const auto u = opt.memory_use();
    EXPECT_EQ(u.weights, w);
    EXPECT_EQ(u.grads, g);
    EXPECT_EQ(u.master_weights, m);
    EXPECT_EQ(u.master_grads, mg);
    EXPECT_EQ(u.optimizer_state, s);
  };
  check(2 * n, 0, 4 * n, 0, 0);  // before any backward
  const Batch b = make_batch(4);
  opt.backward(loss_of(model, b, DType::f16));
  check(2 * n, 2 * n, 4 * n, 0, 0);
  opt.unscale_();
  check(2 * n, 0, 4 * n, 4 * n, 0);  // the f16 gradients are freed by the unscale
  ASSERT_TRUE(opt.step());
  check(2 * n, 0, 4 * n, 4 * n, 8 * n + 8 * tensors);
  opt.zero_grad();
  opt.backward(loss_of(model, b, DType::f16));
  // Steady state with gradients: 2 + 2 + 4 + 8 = 16 bytes per parameter (plus the step counters).
  const auto u = opt.memory_use();
  EXPECT_EQ(u.weights + u.grads + u.master_weights + u.master_grads + u.optimizer_state, 16 * n + 8 * tensors);
}

TEST(MixedPrecision, StateDictRoundTripContinuesIdentically) {
  manual_seed(23);
  TwoLayer a, b;
  a.to(DType::f16);
  b.to(DType::f16);  // other initial weights: load_state_dict must bring the masters and round them into b
  MixedPrecisionOptimizer opt_a(a.parameters(), adamw(1e-2), f16_options(512.0, 2));
  MixedPrecisionOptimizer opt_b(b.parameters(), adamw(1e-2), f16_options(64.0, 7));
  const Batch batch = make_batch(4);
  auto train = [&](TwoLayer& m, MixedPrecisionOptimizer& opt, bool plant_inf) {
    opt.backward(loss_of(m, batch, DType::f16));
    if (plant_inf) m.l2.bias.grad().fill_(kInf);
    opt.step();
    opt.zero_grad();
  };
  train(a, opt_a, false);
  train(a, opt_a, true);
  train(a, opt_a, false);  // scale 512 -> 256, tracker 1
  const StateDict sd = opt_a.state_dict();
  std::vector<std::string> names;
  for (const auto& [name, t] : sd) names.push_back(name);
  for (const char* want : {"state.0.exp_avg", "param_groups.0.lr", "master.0", "master.3", "scaler.scale",
                           "scaler.growth_tracker", "scaler.growth_interval"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  opt_b.load_state_dict(sd);
  EXPECT_EQ(opt_b.loss_scale(), 256.0);
  EXPECT_EQ(opt_b.options().scaler.growth_interval, 2);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(bytes_of(opt_b.master_parameters()[i]), bytes_of(opt_a.master_parameters()[i]));
    EXPECT_EQ(bytes_of(b.parameters()[i]), bytes_of(a.parameters()[i]));
  }
  for (int k = 0; k < 3; ++k) {
    train(a, opt_a, false);
    train(b, opt_b, false);
  }
  EXPECT_EQ(opt_b.loss_scale(), opt_a.loss_scale());
  EXPECT_EQ(opt_a.loss_scale(), 1024.0);  // 256, tracker 1; then 3 clean steps at interval 2: x2 twice
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(bytes_of(opt_b.master_parameters()[i]), bytes_of(opt_a.master_parameters()[i])) << "param " << i;
    EXPECT_EQ(bytes_of(b.parameters()[i]), bytes_of(a.parameters()[i])) << "param " << i;
  }
  // Invalid lists are refused before anything changes.
  const std::vector<unsigned char> w0 = bytes_of(b.l1.weight);
  StateDict no_master, bad_scaler, bad_shape;
  for (const auto& e : opt_a.state_dict()) {
    if (e.first != "master.1") no_master.push_back(e);
    bad_scaler.push_back(e.first == "scaler.backoff_factor" ? std::make_pair(e.first, scalar_tensor(2.0, DType::f64))
                                                            : e);
    bad_shape.push_back(e.first == "master.0" ? std::make_pair(e.first, zeros({3}, DType::f32)) : e);
  }
  for (const StateDict* d : {&no_master, &bad_scaler, &bad_shape})
    error_message<ValueError>([&] { opt_b.load_state_dict(*d); });
  EXPECT_EQ(bytes_of(b.l1.weight), w0);
}

TEST(MixedPrecision, Errors) {
  TwoLayer model;  // f32
  EXPECT_NE(error_message<DTypeError>([&] { MixedPrecisionOptimizer o(model.parameters(), adamw(1e-3)); })
                .find("MixedPrecisionOptimizer"),
            std::string::npos);
  error_message<ValueError>([&] { MixedPrecisionOptimizer o(std::vector<Tensor>{}, adamw(1e-3)); });
  model.to(DType::f16);
  error_message<ValueError>(
      [&] { MixedPrecisionOptimizer o(model.parameters(), adamw(1e-3), {DType::f32, GradScalerOptions{}}); });
  error_message<DTypeError>(  // f16 weights, optimizer set up for bf16
      [&] { MixedPrecisionOptimizer o(model.parameters(), adamw(1e-3), {DType::bf16, GradScalerOptions{}}); });
  error_message<ValueError>([&] {
    MixedPrecisionOptimizer o(model.parameters(), [](std::vector<ParamGroup>) { return std::unique_ptr<Optimizer>(); });
  });
  error_message<ValueError>([&] {
    MixedPrecisionOptimizer o(model.parameters(), adamw(1e-3), f16_options(-1.0));
  });
  const std::vector<Tensor> twice = {model.l1.weight, model.l1.weight};
  error_message<ValueError>([&] { MixedPrecisionOptimizer o(twice, adamw(1e-3)); });
  MixedPrecisionOptimizer opt(model.parameters(), adamw(1e-3), f16_options(64.0));
  error_message<ValueError>([&] { opt.master_of(zeros({2}, DType::f16)); });
  opt.backward(loss_of(model, make_batch(2), DType::f16));
  opt.unscale_();
  error_message<ValueError>([&] { opt.unscale_(); });
  EXPECT_TRUE(opt.step());  // step after unscale_ uses the unscaled gradients
}

// An inner optimizer that throws once: the exception reaches the caller, and the next iteration unscales its own
// gradients and steps normally (the flag that says "unscaled" does not outlive the failed step).
TEST(MixedPrecision, AThrowingInnerStepLeavesTheNextStepWorking) {
  struct FlakySGD : SGD {
    using SGD::SGD;
    bool fail = true;
    void step() override {
      if (fail) {
        fail = false;
        EMBER_THROW(ValueError, "inner step failed");
      }
      SGD::step();
    }
  };
  Tensor p = from_vector<double>({1.0}, {1}).to(DType::f16);
  p.requires_grad_();
  MixedPrecisionOptimizer opt({p}, [](std::vector<ParamGroup> g) {
    return std::make_unique<FlakySGD>(std::move(g), SGDOptions{.lr = 0.25});
  }, f16_options(4.0));
  auto loss = [&] { return ember::sum(ember::mul(p, from_vector<double>({1.0}, {1}).to(DType::f16))); };
  opt.backward(loss());
  EXPECT_THROW(opt.step(), ValueError);
  opt.zero_grad();
  opt.backward(loss());
  EXPECT_TRUE(opt.step());
  EXPECT_EQ(p.to(DType::f64).item_double(), 0.75) << "one SGD step with gradient 1 and lr 0.25";
  EXPECT_FALSE(p.grad().defined()) << "the new f16 gradient was consumed";
}

// Parameter groups carry their options into the inner optimizer (e.g. no weight decay on biases).
TEST(MixedPrecision, GroupsKeepTheirOptions) {
  TwoLayer model;
  model.to(DType::bf16);
  MixedPrecisionOptimizer opt({ParamGroup{{model.l1.weight, model.l2.weight}, {{"weight_decay", 0.1}}},
                               ParamGroup{{model.l1.bias, model.l2.bias}, {{"weight_decay", 0.0}}}},
                              adamw(1e-3), {DType::bf16, GradScalerOptions{}});
  ASSERT_EQ(opt.inner().param_groups().size(), 2u);
  EXPECT_EQ(opt.inner().param_groups()[0].options.get("weight_decay"), 0.1);
  EXPECT_EQ(opt.inner().param_groups()[1].options.get("weight_decay"), 0.0);
  EXPECT_TRUE(opt.inner().param_groups()[1].params[0].is_same(opt.master_of(model.l1.bias)));
}

}  // namespace
}  // namespace ember::testing
