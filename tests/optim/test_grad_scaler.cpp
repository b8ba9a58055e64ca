// Tests of GradScaler (torch.amp.GradScaler semantics) with fp32 weights: scaled gradients and the growth / backoff of
// the scale worked out by hand, skipped steps that leave weights and AdamW state byte for byte, unscale_ + clipping and
// gradient accumulation against the same model trained without scaling, several optimizers, the call-order errors, a
// disabled scaler, and the state_dict round trip.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ember/optim/optim.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

namespace F = nn::functional;
using optim::AdamW;
using optim::AdamWOptions;
using optim::GradScaler;
using optim::GradScalerOptions;
using optim::SGD;
using optim::SGDOptions;
using optim::StateDict;

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor leaf(const std::vector<double>& v, DType dtype = DType::f32) {
  Tensor t = from_vector(v, {static_cast<int64_t>(v.size())}).to(dtype);
  t.requires_grad_();
  return t;
}

// The bytes of a CPU tensor, to compare "untouched" exactly (NaN-safe).
std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<unsigned char> out(static_cast<size_t>(c.nbytes()));
  if (!out.empty()) std::memcpy(out.data(), c.raw_data(), out.size());
  return out;
}

// loss = sum(p * x): its gradient is x, so the scaled gradient is scale * x.
Tensor dot_loss(const Tensor& p, const std::vector<double>& x) {
  return ember::sum(ember::mul(p, from_vector(x, {static_cast<int64_t>(x.size())}).to(p.dtype())));
}

TEST(GradScaler, DefaultsArePyTorchs) {
  GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.options().growth_factor, 2.0);
  EXPECT_EQ(scaler.options().backoff_factor, 0.5);
  EXPECT_EQ(scaler.options().growth_interval, 2000);
  EXPECT_TRUE(scaler.is_enabled());
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, ScaledGradientsGrowthAndBackoffByHand) {
  const Tensor p = leaf({1.0, -2.0, 0.5});
  SGD opt({p}, SGDOptions{.lr = 0.25});
  GradScaler scaler(GradScalerOptions{.init_scale = 1024.0, .growth_interval = 3});
  const std::vector<double> x = {0.5, -1.0, 2.0};
  std::vector<double> want = {1.0, -2.0, 0.5};
  // (planted non-finite gradient, scale after update, tracker after update)
  const std::vector<std::tuple<double, double, int64_t>> plan = {
      {0.0, 1024, 1}, {0.0, 1024, 2}, {0.0, 2048, 0},   // growth after 3 clean steps
      {kInf, 1024, 0},                                  // backoff, step skipped
      {0.0, 1024, 1}, {std::nan(""), 512, 0},           // NaN: backoff again, tracker reset
      {-kInf, 256, 0}, {0.0, 256, 1}};
  for (size_t k = 0; k < plan.size(); ++k) {
    const auto [bad, want_scale, want_tracker] = plan[k];
    SCOPED_TRACE(::testing::Message() << "step " << k);
    const double scale = scaler.get_scale();
    const Tensor scaled = scaler.scale(dot_loss(p, x));
    EXPECT_EQ(scaled.dim(), 0);
    scaled.backward();
    EXPECT_TRUE(allclose(p.grad(), from_vector<double>({scale * x[0], scale * x[1], scale * x[2]}, {3}),
                         {0.0, 0.0}));  // a power-of-two scale is exact
    if (bad != 0.0) p.grad().narrow(0, 1, 1).fill_(bad);
    const bool clean = bad == 0.0;
    EXPECT_EQ(scaler.step(opt), clean);
    EXPECT_EQ(scaler.step_skipped(opt), !clean);
    if (clean)
      for (size_t i = 0; i < 3; ++i) want[i] -= 0.25 * x[i];  // p -= lr * unscaled grad
    EXPECT_TRUE(allclose(p, from_vector(want, {3}), {1e-6, 1e-7}));
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), want_scale);
    EXPECT_EQ(scaler.growth_tracker(), want_tracker);
    EXPECT_EQ(scaler.step_skipped(opt), !clean);  // kept across update()
    opt.zero_grad();
  }
}

TEST(GradScaler, SkippedStepLeavesWeightsAndAdamWStateUntouched) {
  const Tensor p = leaf({1.0, -2.0, 0.5, 3.0});
  AdamW opt({p}, AdamWOptions{.lr = 0.1});
  GradScaler scaler(GradScalerOptions{.init_scale = 256.0, .growth_interval = 3});
  const std::vector<double> x = {0.5, -1.0, 2.0, 0.25};
  scaler.scale(dot_loss(p, x)).backward();
  ASSERT_TRUE(scaler.step(opt));  // a clean step first, so that AdamW has state to protect
  scaler.update();
  opt.zero_grad();
  const auto p0 = bytes_of(p), m0 = bytes_of(opt.state(p).get("exp_avg")),
             v0 = bytes_of(opt.state(p).get("exp_avg_sq")), s0 = bytes_of(opt.state(p).get("step"));
  for (double bad : {kInf, std::nan("")}) {
    scaler.scale(dot_loss(p, x)).backward();
    p.grad().narrow(0, 2, 1).fill_(bad);
    EXPECT_FALSE(scaler.step(opt));
    scaler.update();
    opt.zero_grad();
    EXPECT_EQ(bytes_of(p), p0);
    EXPECT_EQ(bytes_of(opt.state(p).get("exp_avg")), m0);
    EXPECT_EQ(bytes_of(opt.state(p).get("exp_avg_sq")), v0);
    EXPECT_EQ(bytes_of(opt.state(p).get("step")), s0);
  }
  EXPECT_EQ(scaler.get_scale(), 64.0);  // 256 -> two backoffs
}

// Two layers with an MSE loss, built twice with the same weights (one copy for the unscaled fp32 reference).
struct TwoLayer {
  nn::Linear l1{5, 4}, l2{4, 3};
  Tensor forward(const Tensor& x) { return l2.forward(ember::relu(l1.forward(x))); }
  std::vector<Tensor> parameters() const {
    return {l1.weight, l1.bias, l2.weight, l2.bias};
  }
  void copy_from(const TwoLayer& o) {
    NoGradGuard no_grad;
    const std::vector<Tensor> mine = parameters(), theirs = o.parameters();
    for (size_t i = 0; i < mine.size(); ++i) Tensor(mine[i]).copy_(theirs[i]);
  }
};

TEST(GradScaler, UnscaleThenClipMatchesUnscaledFp32) {
  manual_seed(3);
  TwoLayer scaled_model, plain_model;
  plain_model.copy_from(scaled_model);
  const Tensor x = rand_input({6, 5}, -2.0, 2.0).to(DType::f32), y = rand_input({6, 3}).to(DType::f32);
  SGD scaled_opt(scaled_model.parameters(), SGDOptions{.lr = 0.1, .momentum = 0.9});
  SGD plain_opt(plain_model.parameters(), SGDOptions{.lr = 0.1, .momentum = 0.9});
  GradScaler scaler(GradScalerOptions{.init_scale = 3000.0});  // not a power of two: unscaling rounds
  for (int step = 0; step < 3; ++step) {
    scaler.scale(F::mse_loss(scaled_model.forward(x), y)).backward();
    scaler.unscale_(scaled_opt);
    const double scaled_norm = optim::clip_grad_norm_(scaled_model.parameters(), 0.05);
    F::mse_loss(plain_model.forward(x), y).backward();
    const double plain_norm = optim::clip_grad_norm_(plain_model.parameters(), 0.05);
    EXPECT_NEAR(scaled_norm, plain_norm, 1e-6 * plain_norm);
    EXPECT_GT(plain_norm, 0.05);  // clipping is active
    const std::vector<Tensor> a = scaled_model.parameters(), b = plain_model.parameters();
    for (size_t i = 0; i < a.size(); ++i)  // f32 gradients within a few roundings of each other
      EXPECT_TRUE(allclose(a[i].grad(), b[i].grad(), {1e-5, 1e-8})) << "param " << i;
    EXPECT_TRUE(scaler.step(scaled_opt));
    scaler.update();
    plain_opt.step();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(allclose(a[i], b[i], {1e-5, 1e-7})) << "param " << i;
    scaled_opt.zero_grad();
    plain_opt.zero_grad();
  }
}

TEST(GradScaler, AccumulationOverMicroBatchesEqualsOneBatchStep) {
  manual_seed(5);
  TwoLayer accum, whole;
  whole.copy_from(accum);
  const Tensor x = rand_input({8, 5}, -2.0, 2.0).to(DType::f32), y = rand_input({8, 3}).to(DType::f32);
  SGD accum_opt(accum.parameters(), SGDOptions{.lr = 0.2});
  SGD whole_opt(whole.parameters(), SGDOptions{.lr = 0.2});
  GradScaler scaler(GradScalerOptions{.init_scale = 4096.0, .growth_interval = 1});
  const double scale = scaler.get_scale();
  for (int64_t m = 0; m < 4; ++m) {  // 4 micro-batches of 2 rows, each loss divided by 4
    const Tensor loss = ember::div(F::mse_loss(accum.forward(x.narrow(0, 2 * m, 2)), y.narrow(0, 2 * m, 2)), 4.0);
    scaler.scale(loss).backward();
    EXPECT_EQ(scaler.get_scale(), scale);  // constant across the micro-batches
  }
  EXPECT_TRUE(scaler.step(accum_opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 2 * scale);  // one update per effective batch (interval 1)
  F::mse_loss(whole.forward(x), y).backward();
  whole_opt.step();
  const std::vector<Tensor> a = accum.parameters(), b = whole.parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(allclose(a[i], b[i], {1e-5, 1e-7})) << "param " << i;
}

TEST(GradScaler, FoundInfSummedOverOptimizers) {
  const Tensor p = leaf({1.0, 2.0}), q = leaf({3.0, 4.0});
  SGD opt_p({p}, SGDOptions{.lr = 0.5}), opt_q({q}, SGDOptions{.lr = 0.5});
  GradScaler scaler(GradScalerOptions{.init_scale = 16.0});
  scaler.scale(ember::add(dot_loss(p, {1.0, 1.0}), dot_loss(q, {1.0, 1.0}))).backward();
  q.grad().narrow(0, 0, 1).fill_(kInf);
  EXPECT_TRUE(scaler.step(opt_p));
  EXPECT_FALSE(scaler.step(opt_q));
  EXPECT_TRUE(allclose(p, from_vector<double>({0.5, 1.5}, {2}), {0.0, 0.0}));
  EXPECT_TRUE(allclose(q, from_vector<double>({3.0, 4.0}, {2}), {0.0, 0.0}));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 8.0);  // one backoff for the whole iteration
  EXPECT_FALSE(scaler.step_skipped(opt_p));
  EXPECT_TRUE(scaler.step_skipped(opt_q));
}

TEST(GradScaler, CallOrderErrors) {
  const Tensor p = leaf({1.0, 2.0});
  SGD opt({p}, SGDOptions{.lr = 0.5});
  GradScaler scaler(GradScalerOptions{.init_scale = 8.0});
  error_message<ValueError>([&] { scaler.unscale_(opt); });  // no scale() yet
  error_message<ValueError>([&] { scaler.update(); });
  scaler.scale(dot_loss(p, {1.0, 1.0})).backward();
  scaler.unscale_(opt);
  EXPECT_TRUE(allclose(p.grad(), from_vector<double>({1.0, 1.0}, {2}), {0.0, 0.0}));
  EXPECT_NE(error_message<ValueError>([&] { scaler.unscale_(opt); }).find("already"), std::string::npos);
  EXPECT_TRUE(scaler.step(opt));  // step after unscale_ does not unscale again
  EXPECT_TRUE(allclose(p, from_vector<double>({0.5, 1.5}, {2}), {0.0, 0.0}));
  error_message<ValueError>([&] { scaler.unscale_(opt); });  // after step()
  error_message<ValueError>([&] { scaler.step(opt); });      // twice
  scaler.update();
  // update() reset the per-optimizer state: a new iteration may unscale and step again.
  opt.zero_grad();
  scaler.scale(dot_loss(p, {1.0, 1.0})).backward();
  scaler.unscale_(opt);
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_EQ(scaler.growth_tracker(), 1);  // one clean update() so far
  scaler.update(32.0);  // new_scale sets the scale directly; the tracker is left alone
  EXPECT_EQ(scaler.get_scale(), 32.0);
  EXPECT_EQ(scaler.growth_tracker(), 1);
  error_message<ValueError>([&] { scaler.update(0.0); });
  error_message<ValueError>([&] { scaler.update(); });  // nothing recorded since the last update
  error_message<ValueError>([&] { scaler.scale(zeros({2}, DType::i32)); });
  // Bad options.
  error_message<ValueError>([] { GradScaler s(GradScalerOptions{.init_scale = 0.0}); });
  error_message<ValueError>([] { GradScaler s(GradScalerOptions{.growth_factor = 1.0}); });
  error_message<ValueError>([] { GradScaler s(GradScalerOptions{.backoff_factor = 1.0}); });
  error_message<ValueError>([] { GradScaler s(GradScalerOptions{.growth_interval = 0}); });
  // The scale is an f32 tensor and the tracker i32: values they cannot hold are refused, not turned into inf or 0
  // (an inf or zero scale would skip every step without an error).
  error_message<ValueError>([] { GradScaler s(GradScalerOptions{.init_scale = 1e39}); });
  error_message<ValueError>([] { GradScaler s(GradScalerOptions{.init_scale = 1e-50}); });
  error_message<ValueError>([] { GradScaler s(GradScalerOptions{.growth_interval = int64_t{1} << 40}); });
  error_message<ValueError>([&] { scaler.update(1e39); });
  EXPECT_EQ(scaler.get_scale(), 32.0);
}

TEST(GradScaler, StepWithoutAnyGradientIsRefused) {
  // PyTorch: "No inf checks were recorded for this optimizer." Without the check, update() would count the step as
  // clean and grow the scale.
  const Tensor p = leaf({1.0, 2.0}), q = leaf({3.0});
  SGD opt({q}, SGDOptions{.lr = 0.5});
  GradScaler scaler(GradScalerOptions{.init_scale = 8.0, .growth_interval = 1});
  scaler.scale(dot_loss(p, {1.0, 1.0})).backward();  // q gets no gradient
  EXPECT_NE(error_message<ValueError>([&] { scaler.step(opt); }).find("gradient"), std::string::npos);
  EXPECT_EQ(scaler.get_scale(), 8.0);
}

TEST(GradScaler, RefusesF16GradientsButUnscalesBF16) {
  const Tensor h = leaf({1.0, 2.0}, DType::f16);
  SGD opt_h({h}, SGDOptions{.lr = 0.5});
  GradScaler scaler(GradScalerOptions{.init_scale = 8.0});
  scaler.scale(dot_loss(h, {1.0, 1.0})).backward();
  EXPECT_NE(error_message<DTypeError>([&] { scaler.unscale_(opt_h); }).find("f16"), std::string::npos);
  EXPECT_TRUE(allclose(h.grad(), from_vector<double>({8.0, 8.0}, {2}), {0.0, 0.0}));  // untouched

  const Tensor b = leaf({1.0, 2.0}, DType::bf16);
  SGD opt_b({b}, SGDOptions{.lr = 0.5});
  scaler.scale(dot_loss(b, {1.0, -3.0})).backward();
  EXPECT_TRUE(scaler.step(opt_b));
  EXPECT_TRUE(allclose(b, from_vector<double>({0.5, 3.5}, {2}), {0.0, 0.0}));
}

TEST(GradScaler, DisabledIsAPassThrough) {
  const Tensor p = leaf({1.0, 2.0});
  SGD opt({p}, SGDOptions{.lr = 0.5});
  GradScaler scaler(GradScalerOptions{.init_scale = 8.0, .enabled = false});
  const Tensor loss = dot_loss(p, {1.0, -1.0});
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  EXPECT_EQ(scaler.get_scale(), 1.0);
  loss.backward();
  scaler.unscale_(opt);
  scaler.unscale_(opt);  // no bookkeeping, no error
  EXPECT_TRUE(allclose(p.grad(), from_vector<double>({1.0, -1.0}, {2}), {0.0, 0.0}));
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_TRUE(allclose(p, from_vector<double>({0.5, 2.5}, {2}), {0.0, 0.0}));
  EXPECT_TRUE(scaler.state_dict().empty());
  error_message<ValueError>([&] { scaler.load_state_dict(GradScaler().state_dict()); });
}

TEST(GradScaler, StateDictRoundTrip) {
  const Tensor p = leaf({1.0, 2.0});
  SGD opt({p}, SGDOptions{.lr = 0.5});
  GradScaler scaler(GradScalerOptions{.init_scale = 64.0, .growth_factor = 4.0, .backoff_factor = 0.25,
                                      .growth_interval = 2});
  auto iteration = [&](GradScaler& s, bool plant_inf) {
    s.scale(dot_loss(p, {1.0, 1.0})).backward();
    if (plant_inf) p.grad().fill_(kInf);
    s.step(opt);
    s.update();
    opt.zero_grad();
  };
  iteration(scaler, false);
  iteration(scaler, false);  // x4 -> 256
  iteration(scaler, true);   // x0.25 -> 64
  iteration(scaler, false);  // tracker 1
  const StateDict sd = scaler.state_dict();
  const std::vector<std::pair<std::string, double>> want = {
      {"scale", 64.0}, {"growth_factor", 4.0}, {"backoff_factor", 0.25}, {"growth_interval", 2.0},
      {"growth_tracker", 1.0}};
  ASSERT_EQ(sd.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(sd[i].first, want[i].first);
    EXPECT_EQ(sd[i].second.dtype(), DType::f64);
    EXPECT_EQ(sd[i].second.dim(), 0);
    EXPECT_EQ(sd[i].second.item_double(), want[i].second);
  }
  // A default scaler takes everything over before its first scale() and continues as the original.
  GradScaler loaded;
  loaded.load_state_dict(sd);
  EXPECT_EQ(loaded.get_scale(), 64.0);
  EXPECT_EQ(loaded.growth_tracker(), 1);
  EXPECT_EQ(loaded.options().growth_factor, 4.0);
  iteration(loaded, false);
  iteration(scaler, false);
  EXPECT_EQ(loaded.get_scale(), 256.0);
  EXPECT_EQ(scaler.get_scale(), 256.0);
  EXPECT_EQ(loaded.growth_tracker(), scaler.growth_tracker());
  // After scale(): loading writes the live scale. Invalid lists change nothing.
  loaded.load_state_dict(sd);
  EXPECT_EQ(loaded.get_scale(), 64.0);
  StateDict missing(sd.begin(), sd.end() - 1), unknown = sd, bad = sd;
  unknown.emplace_back("_growth_tracker", scalar_tensor(0.0, DType::f64));
  bad[1].second = scalar_tensor(0.5, DType::f64);  // growth_factor must be > 1
  for (const StateDict* d : {&missing, &unknown, &bad}) error_message<ValueError>([&] { loaded.load_state_dict(*d); });
  EXPECT_EQ(loaded.get_scale(), 64.0);
  EXPECT_EQ(loaded.options().growth_factor, 4.0);
}

}  // namespace
}  // namespace ember::testing
