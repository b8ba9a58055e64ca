// Tests of the fused optimizer kernels (ops::sgd_step_, ops::adam_step_) against naive float64 loops of torch.optim's
// formulas written here, for f32/f16/bf16/f64 parameters (state in f32, f64 for f64), every option branch, the
// first momentum step over an uninitialised (NaN-poisoned) buffer, version counters, and the front end's errors.
#include <cmath>
#include <vector>

#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

// Naive SGD on doubles (torch.optim.SGD, single tensor): p, buf updated in place.
void ref_sgd(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& buf, const SgdParams& o) {
  for (size_t i = 0; i < p.size(); ++i) {
    double d = g[i];
    if (o.weight_decay != 0.0) d += o.weight_decay * p[i];
    if (o.momentum != 0.0) {
      buf[i] = o.first_step ? d : o.momentum * buf[i] + (1.0 - o.dampening) * d;
      d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
    }
    p[i] -= o.lr * d;
  }
}

// Naive Adam / AdamW on doubles: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
void ref_adam(std::vector<double>& p, const std::vector<double>& g_in, std::vector<double>& m, std::vector<double>& v,
              const AdamParams& o) {
  const double t = static_cast<double>(o.step);
  const double bc1 = 1.0 - std::pow(o.beta1, t), bc2 = 1.0 - std::pow(o.beta2, t);
  for (size_t i = 0; i < p.size(); ++i) {
    double g = g_in[i];
    if (o.weight_decay != 0.0) {
      if (o.decoupled)
        p[i] *= 1.0 - o.lr * o.weight_decay;
      else
        g += o.weight_decay * p[i];
    }
    m[i] = o.beta1 * m[i] + (1.0 - o.beta1) * g;
    v[i] = o.beta2 * v[i] + (1.0 - o.beta2) * g * g;
    p[i] -= o.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + o.eps);
  }
}

DType state_dtype(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }

// Parameter tolerance: one rounding to the parameter's dtype plus the f32 math (a unit in the last place).
Tolerance param_tolerance(DType d) {
  switch (d) {
    case DType::f64: return {1e-12, 1e-14};
    case DType::f32: return {2e-6, 1e-7};
    case DType::f16: return {1.0 / 1024, 1e-6};
    default: return {1.0 / 128, 1e-6};  // bf16
  }
}
Tolerance state_tolerance(DType param_dtype) {
  return param_dtype == DType::f64 ? Tolerance{1e-12, 1e-14} : Tolerance{2e-6, 1e-7};
}

// A value rounded to `dtype` and returned as f64, so the reference sees exactly what the kernel sees.
std::vector<double> rounded(const Tensor& f64, DType dtype) { return f64.to(dtype).to_vector<double>(); }

const std::vector<DType> kDTypes = {DType::f32, DType::f64, DType::f16, DType::bf16};

class OptimKernelTest : public DeviceTest {};

TEST_P(OptimKernelTest, SgdMatchesNaiveLoop) {
  EMBER_REQUIRE_KERNEL(sgd_step_stub);
  const Shape shape{5, 7};
  const std::vector<SgdParams> cases = {
      {0.1, 0.0, 0.0, 0.0, false, false},   // plain
      {0.05, 0.0, 0.0, 0.01, false, false},  // weight decay
      {0.1, 0.9, 0.0, 0.0, false, true},    // first momentum step (buffer uninitialised)
      {0.1, 0.9, 0.3, 0.01, false, false},  // momentum with dampening
      {0.1, 0.9, 0.0, 0.01, true, false},   // nesterov
      {0.1, 0.8, 0.0, 0.02, true, true},    // nesterov, first step
  };
  for (DType dt : kDTypes)
    for (size_t c = 0; c < cases.size(); ++c) {
      const SgdParams& o = cases[c];
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " case " << c);
      const Tensor p64 = rand_input(shape, -2.0, 2.0), g64 = rand_input(shape), b64 = rand_input(shape);
      std::vector<double> p = rounded(p64, dt), g = rounded(g64, dt), buf = rounded(b64, state_dtype(dt));
      const Tensor param = p64.to(device(), dt), grad = g64.to(device(), dt);
      const bool momentum = o.momentum != 0.0;
      Tensor mbuf;
      if (momentum)
        mbuf = o.first_step ? empty(shape, TensorOptions(state_dtype(dt), device()))  // NaN-poisoned, never read
                            : b64.to(device(), state_dtype(dt));
      const int64_t v0 = param.version();
      ops::sgd_step_(param, grad, mbuf, o);
      EXPECT_GT(param.version(), v0);
      ref_sgd(p, g, buf, o);
      EXPECT_TRUE(allclose(param, from_vector(p, shape), param_tolerance(dt)));
      if (momentum) EXPECT_TRUE(allclose(mbuf, from_vector(buf, shape), state_tolerance(dt)));
    }
}

TEST_P(OptimKernelTest, AdamMatchesNaiveLoop) {
  EMBER_REQUIRE_KERNEL(adam_step_stub);
  const Shape shape{3, 11};
  for (DType dt : kDTypes)
    for (bool decoupled : {false, true})
      for (double wd : {0.0, 0.1})
        for (int64_t step : {1, 4}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << (decoupled ? " AdamW" : " Adam") << " wd " << wd
                                            << " step " << step);
          const AdamParams o{1e-2, 0.9, 0.99, 1e-8, wd, decoupled, step};
          const Tensor p64 = rand_input(shape, -2.0, 2.0), g64 = rand_input(shape);
          // Moments as after step - 1 steps (zero before the first).
          const Tensor m64 = step == 1 ? zeros(shape, DType::f64) : rand_input(shape, -0.5, 0.5);
          const Tensor v64 = step == 1 ? zeros(shape, DType::f64) : rand_input(shape, 0.0, 0.5);
          std::vector<double> p = rounded(p64, dt), g = rounded(g64, dt);
          std::vector<double> m = rounded(m64, state_dtype(dt)), v = rounded(v64, state_dtype(dt));
          const Tensor param = p64.to(device(), dt), grad = g64.to(device(), dt);
          const Tensor exp_avg = m64.to(device(), state_dtype(dt)), exp_avg_sq = v64.to(device(), state_dtype(dt));
          const int64_t vm = exp_avg.version(), vv = exp_avg_sq.version();
          ops::adam_step_(param, grad, exp_avg, exp_avg_sq, o);
          EXPECT_GT(exp_avg.version(), vm);
          EXPECT_GT(exp_avg_sq.version(), vv);
          ref_adam(p, g, m, v, o);
          EXPECT_TRUE(allclose(param, from_vector(p, shape), param_tolerance(dt)));
          EXPECT_TRUE(allclose(exp_avg, from_vector(m, shape), state_tolerance(dt)));
          EXPECT_TRUE(allclose(exp_avg_sq, from_vector(v, shape), state_tolerance(dt)));
        }
}

// The first Adam step moves every element by lr * g / (|g| + eps): m/(1-b1) = g and sqrt(v/(1-b2)) = |g|.
TEST_P(OptimKernelTest, AdamFirstStepIsSignStep) {
  EMBER_REQUIRE_KERNEL(adam_step_stub);
  const Tensor param = from_vector<double>({1.0, -2.0, 0.5}, {3}).to(device());
  const Tensor grad = from_vector<double>({0.5, 0.25, -1.0}, {3}).to(device());
  const Tensor m = zeros({3}, TensorOptions(DType::f64, device())), v = zeros({3}, TensorOptions(DType::f64, device()));
  ops::adam_step_(param, grad, m, v, AdamParams{0.1, 0.9, 0.999, 1e-8, 0.0, false, 1});
  const Tensor expected =
      from_vector<double>({1.0 - 0.1 * 0.5 / (0.5 + 1e-8), -2.0 - 0.1 * 0.25 / (0.25 + 1e-8), 0.5 + 0.1 / (1.0 + 1e-8)},
                          {3});
  EXPECT_TRUE(allclose(param, expected, {1e-14, 1e-15}));
  EXPECT_TRUE(allclose(m, from_vector<double>({0.05, 0.025, -0.1}, {3}), {1e-14, 1e-16}));
  EXPECT_TRUE(allclose(v, from_vector<double>({0.00025, 0.0000625, 0.001}, {3}), {1e-12, 1e-18}));
}

// adam_step_multi_ (Note [Multi-tensor Adam] in ember/kernels/ops_optim.cpp): 60 entries (more than one launch's
// table on CUDA) of mixed sizes, empty ones and two large ones among them, with per-entry learning rates and step counts, and two dtypes
// in one call: every entry ends bitwise equal to its own adam_step_ on copies of the same operands.
TEST_P(OptimKernelTest, MultiTensorAdamEqualsOneStepPerTensor) {
  EMBER_REQUIRE_KERNEL(adam_step_stub);
  std::vector<AdamStepEntry> multi, single;
  for (int i = 0; i < 60; ++i) {
    const DType dt = i % 7 == 3 ? DType::f64 : (i % 5 == 1 ? DType::bf16 : DType::f32);
    // Two entries above the CUDA table's 256 Ki-element limit (kMultiMaxEntryNumel), which run alone there.
    const int64_t n = i == 17 ? 300000 : i == 42 ? 262145 : (i % 11 == 0 ? 0 : (i * 37) % 1500 + 1);
    const Shape shape{n};
    const AdamParams o{1e-3 * (1 + i % 3), 0.9, 0.999, 1e-8, 0.01 * (i % 2), i % 4 != 0, 1 + i % 5};
    const Tensor p64 = rand_input(shape), g64 = rand_input(shape), m64 = rand_input(shape, -0.1, 0.1);
    const Tensor v64 = rand_input(shape, 0.0, 0.1);
    auto entry = [&] {
      return AdamStepEntry{p64.to(device(), dt), g64.to(device(), dt), m64.to(device(), state_dtype(dt)),
                           v64.to(device(), state_dtype(dt)), o};
    };
    multi.push_back(entry());
    single.push_back(entry());
  }
  ops::adam_step_multi_(multi);
  for (const AdamStepEntry& e : single) ops::adam_step_(e.param, e.grad, e.exp_avg, e.exp_avg_sq, e.p);
  for (size_t i = 0; i < multi.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(allclose(multi[i].param, single[i].param, {0.0, 0.0}));
    EXPECT_TRUE(allclose(multi[i].exp_avg, single[i].exp_avg, {0.0, 0.0}));
    EXPECT_TRUE(allclose(multi[i].exp_avg_sq, single[i].exp_avg_sq, {0.0, 0.0}));
  }
  // A bad entry is found before any entry is updated.
  const TensorOptions f32(DType::f32, device());
  const Tensor p = ones({4}, f32);
  std::vector<AdamStepEntry> bad = {{p, ones({4}, f32), zeros({4}, f32), zeros({4}, f32), AdamParams{}},
                                    {ones({3}, f32), ones({3}, f32), zeros({2}, f32), zeros({3}, f32), AdamParams{}}};
  EXPECT_THROW(ops::adam_step_multi_(bad), ShapeError);
  EXPECT_TRUE(allclose(p, ones({4}, DType::f64), {0.0, 0.0}));
}

TEST_P(OptimKernelTest, EmptyTensorsAreANoOp) {
  EMBER_REQUIRE_KERNEL(adam_step_stub);
  const TensorOptions f32(DType::f32, device());
  ops::adam_step_(empty({0, 3}, f32), empty({0, 3}, f32), empty({0, 3}, f32), empty({0, 3}, f32), AdamParams{});
  ops::sgd_step_(empty({0}, f32), empty({0}, f32), Tensor(), SgdParams{});
}

TEST_P(OptimKernelTest, FrontEndErrors) {
  EMBER_REQUIRE_KERNEL(sgd_step_stub);
  const TensorOptions f32(DType::f32, device());
  const Tensor p = zeros({4, 6}, f32), g = zeros({4, 6}, f32), m = zeros({4, 6}, f32), v = zeros({4, 6}, f32);
  const SgdParams momentum{0.1, 0.9, 0.0, 0.0, false, false};
  // Non-contiguous parameter / grad / state.
  const Tensor pt = zeros({6, 4}, f32).t();
  EXPECT_THROW(ops::sgd_step_(pt, g, Tensor(), SgdParams{}), ValueError);
  EXPECT_THROW(ops::sgd_step_(p, zeros({6, 4}, f32).t(), Tensor(), SgdParams{}), ValueError);
  EXPECT_THROW(ops::adam_step_(pt, g, m, v, AdamParams{}), ValueError);
  EXPECT_THROW(ops::adam_step_(p, g, zeros({6, 4}, f32).t(), v, AdamParams{}), ValueError);
  // Shapes and dtypes.
  EXPECT_THROW(ops::sgd_step_(p, zeros({24}, f32), Tensor(), SgdParams{}), ShapeError);
  EXPECT_THROW(ops::sgd_step_(p, zeros({4, 6}, TensorOptions(DType::f64, device())), Tensor(), SgdParams{}),
               DTypeError);
  EXPECT_THROW(ops::adam_step_(p, g, zeros({4, 5}, f32), v, AdamParams{}), ShapeError);
  const TensorOptions f16(DType::f16, device());
  EXPECT_THROW(ops::adam_step_(zeros({2}, f16), zeros({2}, f16), zeros({2}, f16), zeros({2}, f16), AdamParams{}),
               DTypeError);  // state of a f16 parameter is f32
  const TensorOptions i32(DType::i32, device());
  EXPECT_THROW(ops::sgd_step_(zeros({2}, i32), zeros({2}, i32), Tensor(), SgdParams{}), DTypeError);
  // Missing or aliasing state, bad step, bad nesterov.
  EXPECT_THROW(ops::sgd_step_(p, g, Tensor(), momentum), ValueError);
  EXPECT_THROW(ops::sgd_step_(p, p, Tensor(), SgdParams{}), ValueError);
  EXPECT_THROW(ops::adam_step_(p, g, m, m, AdamParams{}), ValueError);
  EXPECT_THROW(ops::adam_step_(p, g, m, v, AdamParams{1e-3, 0.9, 0.999, 1e-8, 0.0, false, 0}), ValueError);
  EXPECT_THROW(ops::sgd_step_(p, g, m, SgdParams{0.1, 0.9, 0.5, 0.0, true, false}), ValueError);
  EXPECT_THROW(ops::sgd_step_(p, Tensor(), Tensor(), SgdParams{}), ValueError);
  // A parameter that requires grad can only be updated with grad mode off.
  const Tensor leaf = zeros({4, 6}, f32);
  leaf.requires_grad_();
  EXPECT_THROW(ops::sgd_step_(leaf, g, Tensor(), SgdParams{}), ValueError);
  {
    NoGradGuard no_grad;
    EXPECT_NO_THROW(ops::sgd_step_(leaf, g, Tensor(), SgdParams{}));
  }
  if (device().is_cpu()) return;
  EXPECT_THROW(ops::sgd_step_(p, g.cpu(), Tensor(), SgdParams{}), DeviceError);
}

EMBER_INSTANTIATE_DEVICE_TESTS(OptimKernelTest);

}  // namespace
}  // namespace ember::testing
