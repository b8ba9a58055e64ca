// Tests of SGD, Adam and AdamW: steps against values worked out by hand (SGD) or a plain-double Adam written here,
// a least-squares problem driven to its closed-form optimum, per-group options, skipped parameters, non-contiguous
// parameters, zero_grad, the state_dict format and a bit-identical continuation after load_state_dict, and errors.
#include <cmath>
#include <vector>

#include "ember/optim/optim.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

using optim::Adam;
using optim::AdamOptions;
using optim::AdamW;
using optim::AdamWOptions;
using optim::ParamGroup;
using optim::SGD;
using optim::SGDOptions;
using optim::StateDict;

Tensor leaf(const std::vector<double>& v, const Shape& shape, DType dtype = DType::f64) {
  Tensor t = from_vector(v, shape).to(dtype);
  t.requires_grad_();
  return t;
}

void set_grad(const Tensor& p, const std::vector<double>& g) { p.set_grad(from_vector(g, p.sizes()).to(p.dtype())); }

Tensor vec(const std::vector<double>& v) { return from_vector(v, {static_cast<int64_t>(v.size())}); }

constexpr Tolerance kExact{1e-14, 1e-15};

// ---- SGD by hand --------------------------------------------------------------------------------------------------
// p = [1, -2, 0.5], g = [0.5, 0.25, -1] at every step.

TEST(SGD, PlainAndWeightDecayByHand) {
  const Tensor p = leaf({1.0, -2.0, 0.5}, {3});
  SGD plain({p}, SGDOptions{.lr = 0.1});
  set_grad(p, {0.5, 0.25, -1.0});
  plain.step();  // p - 0.1 g
  EXPECT_TRUE(allclose(p, vec({0.95, -2.025, 0.6}), kExact));

  const Tensor q = leaf({1.0, -2.0, 0.5}, {3});
  SGD decay({q}, SGDOptions{.lr = 0.1, .weight_decay = 0.5});
  set_grad(q, {0.5, 0.25, -1.0});
  decay.step();  // g + 0.5 q = [1.0, -0.75, -0.75]; q - 0.1 * that
  EXPECT_TRUE(allclose(q, vec({0.9, -1.925, 0.575}), kExact));
  EXPECT_TRUE(decay.state(q).empty());  // no momentum, no state
}

TEST(SGD, MomentumWithDampeningByHand) {
  const Tensor p = leaf({1.0, -2.0, 0.5}, {3});
  SGD opt({p}, SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.5});
  set_grad(p, {0.5, 0.25, -1.0});
  opt.step();  // first step: buf = g (no dampening), p -= 0.1 buf
  EXPECT_TRUE(allclose(p, vec({0.95, -2.025, 0.6}), kExact));
  EXPECT_TRUE(allclose(opt.state(p).get("momentum_buffer"), vec({0.5, 0.25, -1.0}), kExact));
  opt.step();  // buf = 0.9 buf + 0.5 g = [0.7, 0.35, -1.4]; p -= 0.1 buf
  EXPECT_TRUE(allclose(opt.state(p).get("momentum_buffer"), vec({0.7, 0.35, -1.4}), kExact));
  EXPECT_TRUE(allclose(p, vec({0.88, -2.06, 0.74}), kExact));
}

TEST(SGD, NesterovWithWeightDecayByHand) {
  const Tensor p = leaf({1.0, -2.0, 0.5}, {3});
  SGD opt({p}, SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true});
  set_grad(p, {0.5, 0.25, -1.0});
  // Step 1: g' = g + 0.1 p = [0.6, 0.05, -0.95]; buf = g'; d = g' + 0.9 buf = [1.14, 0.095, -1.805];
  //         p -= 0.1 d -> [0.886, -2.0095, 0.6805].
  opt.step();
  EXPECT_TRUE(allclose(p, vec({0.886, -2.0095, 0.6805}), kExact));
  // Step 2: g' = g + 0.1 p = [0.5886, 0.04905, -0.93195]; buf = 0.9 buf + g' = [1.1286, 0.09405, -1.78695];
  //         d = g' + 0.9 buf = [1.60434, 0.133695, -2.540205]; p -= 0.1 d -> [0.725566, -2.0228695, 0.9345205].
  opt.step();
  EXPECT_TRUE(allclose(opt.state(p).get("momentum_buffer"), vec({1.1286, 0.09405, -1.78695}), kExact));
  EXPECT_TRUE(allclose(p, vec({0.725566, -2.0228695, 0.9345205}), kExact));
}

// ---- Adam / AdamW against plain doubles ---------------------------------------------------------------------------

struct RefAdam {
  std::vector<double> p, m, v;
  int step = 0;
  // m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps),
  // after g += wd p (Adam) or p *= 1 - lr wd (AdamW).
  void update(const std::vector<double>& grad, double lr, double b1, double b2, double eps, double wd, bool adamw) {
    if (m.empty()) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0);
    ++step;
    const double bc1 = 1.0 - std::pow(b1, step), bc2 = 1.0 - std::pow(b2, step);
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad[i];
      if (adamw)
        p[i] = p[i] * (1.0 - lr * wd);
      else
        g = g + wd * p[i];
      m[i] = b1 * m[i] + (1.0 - b1) * g;
      v[i] = b2 * v[i] + (1.0 - b2) * g * g;
      p[i] = p[i] - lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
    }
  }
};

constexpr Tolerance kF64{1e-12, 1e-14};

TEST(Adam, TwoStepsMatchFormula) {
  for (bool adamw : {false, true}) {
    SCOPED_TRACE(adamw ? "AdamW" : "Adam");
    const std::vector<double> p0{1.0, -2.0, 0.5}, g1{0.5, 0.25, -1.0}, g2{-0.3, 0.4, 0.1};
    const Tensor p = leaf(p0, {3});
    std::unique_ptr<optim::Optimizer> opt;
    if (adamw)
      opt = std::make_unique<AdamW>(std::vector<Tensor>{p}, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
    else
      opt = std::make_unique<Adam>(std::vector<Tensor>{p}, AdamOptions{.lr = 0.01, .weight_decay = 0.1});
    RefAdam ref{p0};
    set_grad(p, g1);
    opt->step();
    ref.update(g1, 0.01, 0.9, 0.999, 1e-8, 0.1, adamw);
    EXPECT_TRUE(allclose(p, vec(ref.p), kF64));
    set_grad(p, g2);
    opt->step();
    ref.update(g2, 0.01, 0.9, 0.999, 1e-8, 0.1, adamw);
    EXPECT_TRUE(allclose(p, vec(ref.p), kF64));
    const optim::ParamState& st = opt->state(p);
    EXPECT_EQ(st.get("step").item<double>(), 2.0);
    EXPECT_EQ(st.get("step").dtype(), DType::f64);
    EXPECT_TRUE(allclose(st.get("exp_avg"), vec(ref.m), kF64));
    EXPECT_TRUE(allclose(st.get("exp_avg_sq"), vec(ref.v), kF64));
  }
}

TEST(Adam, AdamWDefaultsAndBetas) {
  const Tensor p = leaf({1.0}, {1});
  AdamW w({p});
  EXPECT_EQ(w.defaults().get("weight_decay"), 1e-2);
  EXPECT_EQ(w.defaults().get("lr"), 1e-3);
  EXPECT_TRUE(w.decoupled_weight_decay());
  Adam a({p}, AdamOptions{.betas = {0.8, 0.95}});
  EXPECT_EQ(a.defaults().get("weight_decay"), 0.0);
  EXPECT_EQ(a.param_groups()[0].options.get("beta1"), 0.8);
  EXPECT_EQ(a.param_groups()[0].options.get("beta2"), 0.95);
  EXPECT_EQ(a.param_groups()[0].options.get("eps"), 1e-8);
}

// min_x mean((A x - b)^2) with A = [[1, 0], [0, 1], [1, 1]], b = [1, 2, 4]: the normal equations
// [[2, 1], [1, 2]] x = [5, 6] give x* = [4/3, 7/3].
TEST(Adam, LeastSquaresReachesOptimum) {
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor A = from_vector<double>({1, 0, 0, 1, 1, 1}, {3, 2}).to(dt);
    const Tensor b = from_vector<double>({1, 2, 4}, {3}).to(dt);
    const Tensor x = leaf({0.0, 0.0}, {2}, dt);
    Adam opt({x}, AdamOptions{.lr = 0.05});
    double loss_v = 0.0;
    for (int it = 0; it < 3000; ++it) {
      opt.zero_grad();
      const Tensor r = ember::matmul(A, x) - b;
      const Tensor loss = ember::mean(r * r);
      loss.backward();
      opt.step();
      loss_v = loss.item<double>();
    }
    EXPECT_TRUE(allclose(x, vec({4.0 / 3.0, 7.0 / 3.0}), {0.0, 1e-4}));
    // The residual at x* is [1/3, 1/3, -1/3]: mean square 1/9.
    EXPECT_NEAR(loss_v, 1.0 / 9.0, 1e-6);
  }
}

// nanoGPT's grouping: decoupled weight decay on 2-d parameters only.
TEST(Adam, PerGroupOptions) {
  const std::vector<double> w0{0.5, -1.0, 1.5, 2.0}, b0{0.25, -0.75};
  const std::vector<double> gw{0.1, -0.2, 0.3, 0.05}, gb{-0.4, 0.6};
  const Tensor w = leaf(w0, {2, 2}), bias = leaf(b0, {2});
  AdamW opt({ParamGroup{{w}, {{"weight_decay", 0.1}}}, ParamGroup{{bias}, {{"weight_decay", 0.0}}}},
            AdamWOptions{.lr = 0.02, .betas = {0.9, 0.95}});
  ASSERT_EQ(opt.param_groups().size(), 2u);
  EXPECT_EQ(opt.param_groups()[0].options.get("weight_decay"), 0.1);
  EXPECT_EQ(opt.param_groups()[1].options.get("weight_decay"), 0.0);
  EXPECT_EQ(opt.param_groups()[1].lr(), 0.02);  // from the defaults
  RefAdam rw{w0}, rb{b0};
  for (int s = 0; s < 2; ++s) {
    set_grad(w, gw);
    set_grad(bias, gb);
    opt.step();
    rw.update(gw, 0.02, 0.9, 0.95, 1e-8, 0.1, true);
    rb.update(gb, 0.02, 0.9, 0.95, 1e-8, 0.0, true);
  }
  EXPECT_TRUE(allclose(w, from_vector(rw.p, {2, 2}), kF64));
  EXPECT_TRUE(allclose(bias, vec(rb.p), kF64));
  // Changing a group's lr between steps is honoured (what schedulers do).
  opt.param_groups()[1].set_lr(0.0);
  const std::vector<double> before = bias.to_vector<double>();
  opt.step();
  EXPECT_EQ(bias.to_vector<double>(), before);
}

// ---- behaviour shared by the optimizers ---------------------------------------------------------------------------

TEST(Optimizer, ParamsWithoutGradAreSkipped) {
  const Tensor a = leaf({1.0, 2.0}, {2}), b = leaf({3.0, 4.0}, {2});
  Adam opt({a, b}, AdamOptions{.lr = 0.1});
  set_grad(a, {1.0, -1.0});
  const int64_t vb = b.version();
  opt.step();
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>{3.0, 4.0}));
  EXPECT_EQ(b.version(), vb);
  EXPECT_TRUE(opt.state(b).empty());
  EXPECT_FALSE(opt.state(a).empty());
  // a moved by lr * sign(g) (first Adam step): 1 - 0.1 * 1 / (1 + 1e-8), 2 + 0.1 * 1 / (1 + 1e-8).
  EXPECT_TRUE(allclose(a, vec({1.0 - 0.1 / (1.0 + 1e-8), 2.0 + 0.1 / (1.0 + 1e-8)}), kExact));
}

TEST(Optimizer, NonContiguousParameter) {
  // A transposed leaf: the update runs on a contiguous copy and is written back through the view.
  const Tensor base = from_vector<double>({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {2, 3});
  const Tensor p = base.t();  // [[1, 4], [2, 5], [3, 6]]
  p.requires_grad_();
  ASSERT_FALSE(p.is_contiguous());
  SGD opt({p}, SGDOptions{.lr = 0.5, .momentum = 0.9});
  p.set_grad(from_vector<double>({1, 1, 1, 1, 1, 1}, {3, 2}));
  opt.step();  // p - 0.5
  EXPECT_EQ(p.to_vector<double>(), (std::vector<double>{0.5, 3.5, 1.5, 4.5, 2.5, 5.5}));
  EXPECT_EQ(base.to_vector<double>(), (std::vector<double>{0.5, 1.5, 2.5, 3.5, 4.5, 5.5}));
  EXPECT_TRUE(opt.state(p).get("momentum_buffer").is_contiguous());
}

TEST(Optimizer, ZeroGradBothModes) {
  const Tensor a = leaf({1.0, 2.0}, {2}), b = leaf({3.0}, {1});
  SGD opt({a, b}, SGDOptions{.lr = 0.1});
  set_grad(a, {5.0, 6.0});
  set_grad(b, {7.0});
  const void* storage = a.grad().raw_data();
  opt.zero_grad(false);  // zeros, in the same memory
  ASSERT_TRUE(a.grad().defined());
  EXPECT_EQ(a.grad().raw_data(), storage);
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{0.0}));
  opt.zero_grad();  // set_to_none
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  opt.zero_grad(false);  // no grads: nothing to do
  EXPECT_FALSE(a.grad().defined());
}

TEST(Optimizer, ConstructionErrors) {
  const Tensor p = leaf({1.0}, {1});
  EXPECT_THROW(SGD({p}, SGDOptions{.lr = -0.1}), ValueError);
  EXPECT_THROW(SGD({p}, SGDOptions{.momentum = -0.5}), ValueError);
  EXPECT_THROW(SGD({p}, SGDOptions{.weight_decay = -1.0}), ValueError);
  EXPECT_THROW(SGD({p}, SGDOptions{.nesterov = true}), ValueError);  // no momentum
  EXPECT_THROW(SGD({p}, SGDOptions{.momentum = 0.9, .dampening = 0.1, .nesterov = true}), ValueError);
  EXPECT_NO_THROW(SGD({p}, SGDOptions{.momentum = 0.9, .nesterov = true}));
  EXPECT_THROW(Adam({p}, AdamOptions{.lr = -1.0}), ValueError);
  EXPECT_THROW(Adam({p}, AdamOptions{.betas = {1.0, 0.999}}), ValueError);
  EXPECT_THROW(Adam({p}, AdamOptions{.betas = {0.9, -0.1}}), ValueError);
  EXPECT_THROW(Adam({p}, AdamOptions{.eps = -1e-8}), ValueError);
  EXPECT_THROW(AdamW({p}, AdamWOptions{.weight_decay = -0.1}), ValueError);
  EXPECT_THROW(Adam({p}, AdamOptions{.lr = std::nan("")}), ValueError);

  const Tensor no_grad = from_vector<double>({1.0}, {1});
  EXPECT_THROW(SGD({no_grad}), ValueError);                                      // does not require grad
  EXPECT_THROW(SGD({leaf({1.0}, {1}) * 2.0}), ValueError);                       // not a leaf
  EXPECT_THROW(SGD(std::vector<Tensor>{}), ValueError);                          // empty
  EXPECT_THROW(SGD({p, p}), ValueError);                                         // duplicate
  EXPECT_THROW(SGD({ParamGroup{{p}}, ParamGroup{{p}}}), ValueError);             // in two groups
  EXPECT_THROW(SGD({ParamGroup{{p}, {{"betas", 0.9}}}}), ValueError);            // unknown option
  EXPECT_THROW(SGD({ParamGroup{{p}, {{"lr", -1.0}}}}), ValueError);              // bad group value
  EXPECT_THROW(SGD({Tensor()}), ValueError);                                     // undefined

  SGD opt({p});
  EXPECT_THROW(opt.add_param_group(ParamGroup{{p}}), ValueError);
  const Tensor q = leaf({2.0}, {1});
  opt.add_param_group(ParamGroup{{q}, {{"lr", 0.5}}});
  EXPECT_EQ(opt.param_groups()[1].lr(), 0.5);
  EXPECT_EQ(opt.param_groups()[1].options.get("momentum"), 0.0);
  EXPECT_EQ(opt.num_parameters(), 2);
}

// ---- state_dict ---------------------------------------------------------------------------------------------------

TEST(OptimizerStateDict, Names) {
  const Tensor a = leaf({1.0, 2.0}, {2}), b = leaf({3.0}, {1}), c = leaf({4.0, 5.0, 6.0}, {3});
  SGD opt({ParamGroup{{a, b}}, ParamGroup{{c}, {{"lr", 0.5}}}}, SGDOptions{.lr = 0.1, .momentum = 0.9});
  set_grad(a, {1.0, 1.0});
  set_grad(c, {1.0, 1.0, 1.0});  // b has no grad: no state
  opt.step();
  const StateDict sd = opt.state_dict();
  std::vector<std::string> names;
  for (const auto& [name, t] : sd) names.push_back(name);
  const std::vector<std::string> expected = {
      "state.0.momentum_buffer",  "state.2.momentum_buffer",   "param_groups.0.params",
      "param_groups.0.lr",        "param_groups.0.momentum",   "param_groups.0.dampening",
      "param_groups.0.weight_decay", "param_groups.0.nesterov", "param_groups.1.params",
      "param_groups.1.lr",        "param_groups.1.momentum",   "param_groups.1.dampening",
      "param_groups.1.weight_decay", "param_groups.1.nesterov"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(sd[2].second.to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(sd[8].second.to_vector<int64_t>(), (std::vector<int64_t>{2}));
  EXPECT_EQ(sd[9].second.dim(), 0);
  EXPECT_EQ(sd[9].second.dtype(), DType::f64);
  EXPECT_EQ(sd[9].second.item<double>(), 0.5);
}

// Two parameters of f32, four grads: A takes 3 steps; B (same parameter values) loads A's state; then A's 4th step
// and B's next step must agree bit for bit, in the parameters and in the state.
template <class MakeOpt>
void check_round_trip(MakeOpt make) {
  const Shape s0{2, 3}, s1{4};
  std::vector<std::pair<Tensor, Tensor>> grads;
  for (int k = 0; k < 4; ++k)
    grads.emplace_back(rand_input(s0).to(DType::f32), rand_input(s1).to(DType::f32));
  const Tensor a0 = rand_input(s0).to(DType::f32), a1 = rand_input(s1).to(DType::f32);
  a0.requires_grad_();
  a1.requires_grad_();
  auto opt_a = make(std::vector<Tensor>{a0, a1});
  for (int k = 0; k < 3; ++k) {
    a0.set_grad(grads[static_cast<size_t>(k)].first);
    a1.set_grad(grads[static_cast<size_t>(k)].second);
    opt_a->step();
  }
  const Tensor b0 = a0.detach().clone(), b1 = a1.detach().clone();
  b0.requires_grad_();
  b1.requires_grad_();
  auto opt_b = make(std::vector<Tensor>{b0, b1});
  opt_b->param_groups()[0].set_lr(123.0);  // overwritten by the load
  opt_b->load_state_dict(opt_a->state_dict());
  EXPECT_EQ(opt_b->param_groups()[0].options, opt_a->param_groups()[0].options);
  a0.set_grad(grads[3].first);
  b0.set_grad(grads[3].first);
  a1.set_grad(grads[3].second);
  b1.set_grad(grads[3].second);
  opt_a->step();
  opt_b->step();
  EXPECT_EQ(a0.to_vector<float>(), b0.to_vector<float>());
  EXPECT_EQ(a1.to_vector<float>(), b1.to_vector<float>());
  const StateDict sa = opt_a->state_dict(), sb = opt_b->state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_EQ(sa[i].second.to_vector<double>(), sb[i].second.to_vector<double>()) << sa[i].first;
    if (sa[i].first.rfind("state.", 0) == 0)  // B owns copies, not A's tensors
      EXPECT_NE(sa[i].second.raw_data(), sb[i].second.raw_data()) << sa[i].first;
  }
}

TEST(OptimizerStateDict, RoundTripContinuesBitIdentically) {
  {
    SCOPED_TRACE("AdamW");
    check_round_trip([](std::vector<Tensor> ps) {
      return std::make_unique<AdamW>(std::move(ps), AdamWOptions{.lr = 0.01, .betas = {0.9, 0.95}});
    });
  }
  {
    SCOPED_TRACE("Adam");
    check_round_trip([](std::vector<Tensor> ps) {
      return std::make_unique<Adam>(std::move(ps), AdamOptions{.lr = 0.01, .weight_decay = 0.05});
    });
  }
  {
    SCOPED_TRACE("SGD");
    check_round_trip([](std::vector<Tensor> ps) {
      return std::make_unique<SGD>(std::move(ps), SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
    });
  }
}

TEST(OptimizerStateDict, LoadRejectsMismatches) {
  const Tensor a = leaf({1.0, 2.0}, {2}), b = leaf({3.0, 4.0, 5.0}, {3});
  Adam src({a, b}, AdamOptions{.lr = 0.01});
  set_grad(a, {1.0, 1.0});
  set_grad(b, {1.0, 1.0, 1.0});
  src.step();
  const StateDict good = src.state_dict();

  const Tensor c = leaf({0.0, 0.0}, {2}), d = leaf({0.0, 0.0, 0.0}, {3});
  Adam dst({c, d}, AdamOptions{.lr = 0.5});
  auto with = [&](const std::string& name, const Tensor& t) {
    StateDict sd = good;
    for (auto& [n, v] : sd)
      if (n == name) v = t;
    return sd;
  };
  auto without = [&](const std::string& name) {
    StateDict sd;
    for (const auto& e : good)
      if (e.first != name) sd.push_back(e);
    return sd;
  };
  auto appended = [&](const std::string& name, const Tensor& t) {
    StateDict sd = good;
    sd.emplace_back(name, t);
    return sd;
  };
  EXPECT_THROW(dst.load_state_dict(with("state.1.exp_avg", zeros({2}, DType::f64))), ValueError);  // wrong shape
  EXPECT_THROW(dst.load_state_dict(with("state.0.step", zeros({1, 1}, DType::f64))), ValueError);
  EXPECT_THROW(dst.load_state_dict(without("state.1.exp_avg_sq")), ValueError);  // incomplete state
  EXPECT_THROW(dst.load_state_dict(without("param_groups.0.eps")), ValueError);  // missing option
  EXPECT_THROW(dst.load_state_dict(without("param_groups.0.params")), ValueError);
  EXPECT_THROW(dst.load_state_dict(appended("state.2.exp_avg", zeros({2}))), ValueError);  // no parameter 2
  EXPECT_THROW(dst.load_state_dict(appended("state.0.momentum_buffer", zeros({2}))), ValueError);
  EXPECT_THROW(dst.load_state_dict(appended("param_groups.0.momentum", scalar_tensor(0.9))), ValueError);
  EXPECT_THROW(dst.load_state_dict(appended("param_groups.1.params", from_vector<int64_t>({2}, {1}))), ValueError);
  EXPECT_THROW(dst.load_state_dict(appended("something", zeros({1}))), ValueError);
  EXPECT_THROW(dst.load_state_dict(appended("state.x.step", zeros({}))), ValueError);
  EXPECT_THROW(dst.load_state_dict(with("param_groups.0.params", from_vector<int64_t>({0, 1, 2}, {3}))), ValueError);
  EXPECT_THROW(dst.load_state_dict(with("param_groups.0.lr", scalar_tensor(-1.0))), ValueError);  // invalid value

  // Two groups of sizes [1, 1] vs one group of 2 parameters.
  const Tensor e = leaf({0.0, 0.0}, {2}), f = leaf({0.0, 0.0, 0.0}, {3});
  Adam grouped({ParamGroup{{e}}, ParamGroup{{f}}});
  EXPECT_THROW(grouped.load_state_dict(good), ValueError);

  // Nothing was changed by the failed loads.
  EXPECT_EQ(dst.param_groups()[0].lr(), 0.5);
  EXPECT_TRUE(dst.state(c).empty());
  // The good one loads, and the state dtype follows the parameter (f64 here) even from an f32 copy.
  StateDict as_f32 = good;
  for (auto& [n, t] : as_f32)
    if (n.find("exp_avg") != std::string::npos) t = t.to(DType::f32);
  dst.load_state_dict(as_f32);
  EXPECT_EQ(dst.param_groups()[0].lr(), 0.01);
  EXPECT_EQ(dst.state(d).get("exp_avg").dtype(), DType::f64);
  EXPECT_EQ(dst.state(d).get("step").item<double>(), 1.0);
}

}  // namespace
}  // namespace ember::testing
