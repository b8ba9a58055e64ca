// Adadelta against torch.optim.Adadelta's formula written out in plain doubles.
#include <cmath>

#include "ember/optim/adadelta.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

TEST(Adadelta, TwoStepsMatchTheFormulaByHand) {
  const double lr = 0.5, rho = 0.9, eps = 1e-6, wd = 0.1;
  Tensor p = from_vector(std::vector<double>{1.0, -2.0}, {2});
  p.requires_grad_();
  optim::Adadelta opt({p}, optim::AdadeltaOptions{.lr = lr, .rho = rho, .eps = eps, .weight_decay = wd});
  double x[2] = {1.0, -2.0}, sa[2] = {0, 0}, ad[2] = {0, 0};
  const double grads[2][2] = {{0.5, 1.0}, {-0.25, 3.0}};
  for (int step = 0; step < 2; ++step) {
    p.set_grad(from_vector(std::vector<double>{grads[step][0], grads[step][1]}, {2}));
    opt.step();
    for (int i = 0; i < 2; ++i) {
      const double g = grads[step][i] + wd * x[i];
      sa[i] = rho * sa[i] + (1 - rho) * g * g;
      const double delta = std::sqrt(ad[i] + eps) / std::sqrt(sa[i] + eps) * g;
      ad[i] = rho * ad[i] + (1 - rho) * delta * delta;
      x[i] -= lr * delta;
    }
    const std::vector<double> got = p.to_vector<double>();
    EXPECT_NEAR(got[0], x[0], 1e-12) << "step " << step;
    EXPECT_NEAR(got[1], x[1], 1e-12) << "step " << step;
  }
  const auto sd = opt.state_dict();
  EXPECT_EQ(sd[0].first, "state.0.square_avg");
  EXPECT_EQ(sd[1].first, "state.0.acc_delta");
  EXPECT_NEAR(sd[0].second.to_vector<double>()[1], sa[1], 1e-12);
}

TEST(Adadelta, F32ParamsKeepF32State) {
  Tensor p = ones({3});
  p.requires_grad_();
  optim::Adadelta opt({p});
  p.set_grad(full({3}, 0.5));
  opt.step();
  EXPECT_EQ(opt.state(p).get("square_avg").dtype(), DType::f32);
  // First step with lr 1: delta = sqrt(eps) / sqrt(0.1 * 0.25 + eps) * 0.5.
  const double delta = std::sqrt(1e-6) / std::sqrt(0.1 * 0.25 + 1e-6) * 0.5;
  EXPECT_NEAR(p.to_vector<double>()[0], 1.0 - delta, 1e-6);
}

TEST(Adadelta, RejectsBadOptions) {
  Tensor p = ones({2});
  p.requires_grad_();
  EXPECT_THROW(optim::Adadelta({p}, optim::AdadeltaOptions{.rho = 1.5}), ValueError);
  EXPECT_THROW(optim::Adadelta({p}, optim::AdadeltaOptions{.lr = -1.0}), ValueError);
}

}  // namespace
}  // namespace ember::testing
