// Grad mode, inference mode and the requires_grad flag: what is recorded under NoGradGuard / AutoGradMode /
// InferenceMode (and what is restored after), the rules for inference tensors, and detach().
#include "tests/autograd/engine_test_util.h"

namespace ember::testing {
namespace {

Tensor leaf(const std::vector<double>& v) {
  Tensor t = vals(v);
  t.requires_grad_();
  return t;
}

TEST(GradMode, NoGradGuardBuildsNoGraph) {
  Tensor x = leaf({1, 2});
  ASSERT_TRUE(GradMode::is_enabled());
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(GradMode::is_enabled());
    Tensor y = x * x + 1.0;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());
    EXPECT_EQ(y.grad_fn_name(), "");
    EXPECT_TRUE(values_near(y, {2, 5}));
    Tensor v = x.view({2, 1}).transpose(0, 1).clone();  // views and copies are not recorded either
    EXPECT_FALSE(v.requires_grad());
    EXPECT_TRUE(v.is_leaf());
    EXPECT_THROW(y.backward(vals({1, 1})), ValueError);
  }
  EXPECT_TRUE(GradMode::is_enabled());
  Tensor y = x * x;
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_EQ(y.grad_fn_name(), "MulBackward");
}

TEST(GradMode, NestedGuardsRestoreThePreviousState) {
  Tensor x = leaf({3});
  {
    NoGradGuard outer;
    {
      AutoGradMode enable(true);
      EXPECT_TRUE(GradMode::is_enabled());
      Tensor y = x * x;
      EXPECT_TRUE(y.requires_grad()) << "AutoGradMode(true) inside NoGradGuard records again";
      y.backward();
      EXPECT_TRUE(values_near(x.grad(), {6}));
      {
        NoGradGuard inner;
        EXPECT_FALSE((x * x).requires_grad());
      }
      EXPECT_TRUE(GradMode::is_enabled());
    }
    EXPECT_FALSE(GradMode::is_enabled());
    EXPECT_FALSE((x * x).requires_grad());
    {
      AutoGradMode disable(false);
      EXPECT_FALSE(GradMode::is_enabled());
    }
    EXPECT_FALSE(GradMode::is_enabled());
  }
  EXPECT_TRUE(GradMode::is_enabled());
  {
    AutoGradMode disable(false);
    EXPECT_FALSE((x * x).requires_grad());
  }
  EXPECT_TRUE((x * x).requires_grad());
}

TEST(GradMode, BackwardRunsWhateverTheCurrentMode) {
  // A graph built with grad mode on can be differentiated inside NoGradGuard (an optimizer step's surroundings).
  Tensor x = leaf({2});
  Tensor y = x * x;
  {
    NoGradGuard no_grad;
    y.backward();
  }
  EXPECT_TRUE(values_near(x.grad(), {4}));
  EXPECT_FALSE(x.grad().requires_grad());
}

TEST(GradMode, InferenceModeMakesInferenceTensors) {
  Tensor x = leaf({1, 2});
  Tensor t, view;
  {
    InferenceMode guard;
    EXPECT_TRUE(InferenceMode::is_enabled());
    EXPECT_FALSE(GradMode::is_enabled());
    t = x * 2.0;
    EXPECT_TRUE(t.is_inference());
    EXPECT_FALSE(t.requires_grad());
    view = t.view({2, 1});
    EXPECT_TRUE(view.is_inference()) << "views keep their base's kind";
    t.fill_(3.0);  // in-place writes are fine inside inference mode
    EXPECT_TRUE(ones({2}).is_inference());
  }
  EXPECT_FALSE(InferenceMode::is_enabled());
  EXPECT_TRUE(GradMode::is_enabled());
  EXPECT_FALSE(x.is_inference());
  EXPECT_FALSE(ones({2}).is_inference());
  EXPECT_TRUE(values_near(view, {3, 3}));

  // requires_grad_ on an inference tensor raises.
  const std::string rg = error_message<ValueError>([&] { t.requires_grad_(); });
  EXPECT_TRUE(contains(rg, "inference")) << rg;
  // Saving it for backward raises: mul saves the other operand to differentiate x.
  const std::string save = error_message<ValueError>([&] { (void)(x * t); });
  EXPECT_TRUE(contains(save, "inference")) << save;
  // Without a tensor to save it is only a constant: allowed.
  EXPECT_TRUE((x + t).requires_grad());
  // In-place writes outside inference mode raise (copy_ and fill_, through a view too).
  const std::string cp = error_message<ValueError>([&] { t.copy_(vals({5, 6})); });
  EXPECT_TRUE(contains(cp, "inference")) << cp;
  EXPECT_THROW(t.fill_(1.0), ValueError);
  EXPECT_THROW(view.copy_(vals({5, 6}, {2, 1})), ValueError);
  EXPECT_TRUE(values_near(t, {3, 3}));
  // A clone made outside inference mode is a normal tensor.
  Tensor c = t.clone();
  EXPECT_FALSE(c.is_inference());
  c.requires_grad_();
  (x * c).backward(vals({1, 1}));
  EXPECT_TRUE(values_near(x.grad(), {3, 3}));
}

TEST(GradMode, NestedInferenceModeRestores) {
  {
    InferenceMode outer;
    {
      InferenceMode off(false);
      EXPECT_FALSE(InferenceMode::is_enabled());
      EXPECT_FALSE(ones({1}).is_inference());
    }
    EXPECT_TRUE(InferenceMode::is_enabled());
    EXPECT_FALSE(GradMode::is_enabled());
  }
  {
    NoGradGuard no_grad;
    { InferenceMode guard; }
    EXPECT_FALSE(GradMode::is_enabled()) << "leaving inference mode restores the grad mode it found";
  }
  EXPECT_TRUE(GradMode::is_enabled());
  EXPECT_FALSE(InferenceMode::is_enabled());
}

TEST(GradMode, RequiresGradOnlyForFloatingLeaves) {
  Tensor i = arange(0, 4, 1);
  ASSERT_EQ(i.dtype(), DType::i64);
  const std::string msg = error_message<DTypeError>([&] { i.requires_grad_(); });
  EXPECT_TRUE(contains(msg, "i64")) << msg;
  EXPECT_THROW(ones({2}, DType::i32).requires_grad_(), DTypeError);
  EXPECT_THROW(ones({2}, DType::b8).requires_grad_(), DTypeError);
  EXPECT_NO_THROW(ones({2}, DType::f16).requires_grad_());
  EXPECT_NO_THROW(ones({2}, DType::bf16).requires_grad_());

  Tensor x = leaf({1, 2});
  Tensor y = x * x;
  const std::string nl = error_message<ValueError>([&] { y.requires_grad_(); });
  EXPECT_TRUE(contains(nl, "not a leaf")) << nl;
  EXPECT_THROW(y.requires_grad_(false), ValueError);

  // requires_grad_(false) on a leaf turns it back into a constant.
  Tensor z = leaf({1});
  z.requires_grad_(false);
  EXPECT_FALSE(z.requires_grad());
  EXPECT_FALSE((z * z).requires_grad());
  // A fresh tensor does not require grad; requires_grad_(false) on it changes nothing.
  Tensor f = vals({1});
  EXPECT_FALSE(f.requires_grad());
  f.requires_grad_(false);
  EXPECT_FALSE(f.requires_grad());
  EXPECT_TRUE(f.is_leaf());
}

TEST(GradMode, DetachSharesStorageAndHasNoGrad) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = x * 2.0;
  Tensor d = y.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_EQ(d.grad_fn_name(), "");
  EXPECT_FALSE(d.grad().defined());
  EXPECT_EQ(d.raw_data(), y.raw_data());
  EXPECT_EQ(d.storage(), y.storage());
  const int64_t v0 = y.version();
  d.fill_(7.0);  // no autograd state on d: allowed, visible through y, and bumps the shared version
  EXPECT_TRUE(values_near(y, {7, 7, 7}));
  EXPECT_EQ(y.version(), v0 + 1);
  Tensor dx = x.detach();
  EXPECT_FALSE(dx.requires_grad());
  EXPECT_EQ(dx.raw_data(), x.raw_data());
  (x * 2.0).backward(vals({1, 1, 1}));
  EXPECT_FALSE(dx.grad().defined()) << "a detached alias does not see the leaf's .grad";
  EXPECT_TRUE(values_near(x.grad(), {2, 2, 2}));
  // Operations on the detached tensor build no graph.
  EXPECT_FALSE((dx * dx).requires_grad());
}

}  // namespace
}  // namespace ember::testing
