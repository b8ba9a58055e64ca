// In-place writes and autograd: the saved-tensor version check, the refusal to write into leaves that require grad
// (and the optimizer-style update under NoGradGuard), copy_ recording history from a source that requires grad,
// and the refusal of writes autograd cannot represent (partial views, views of tensors with history).
#include "tests/autograd/engine_test_util.h"

namespace ember::testing {
namespace {

Tensor leaf(const std::vector<double>& v, Shape shape = {}, DType dt = DType::f64) {
  Tensor t = vals(v, std::move(shape), dt);
  t.requires_grad_();
  return t;
}

// --- the version check ------------------------------------------------------------------------------------------

TEST(ViewsInplace, ModifiedSavedTensorRaisesAtBackward) {
  Tensor x = leaf({1, 2});
  Tensor w = leaf({3, 4});
  Tensor y = x * w;  // saves w (for dx) and x (for dw)
  w.detach().fill_(2.0);
  const std::string msg = error_message<ValueError>([&] { y.backward(vals({1, 1})); });
  EXPECT_TRUE(contains(msg, "modified by an in-place operation")) << msg;
  EXPECT_TRUE(contains(msg, "MulBackward")) << msg;
  EXPECT_TRUE(contains(msg, "version")) << msg;
}

TEST(ViewsInplace, WriteThroughAViewOfASavedTensorIsDetected) {
  Tensor x = leaf({1, 2, 3, 4});
  Tensor h = x * 2.0;  // non-leaf
  Tensor y = exp(h);   // saves its output y
  y.detach().slice(0, 1, 2).fill_(0.0);  // one element through a detached view
  EXPECT_THROW(y.backward(vals({1, 1, 1, 1})), ValueError);
}

TEST(ViewsInplace, UnrelatedInPlaceWritesDoNotTrip) {
  Tensor x = leaf({1, 2});
  Tensor w = vals({3, 4});
  Tensor y = x * w;        // saves w
  Tensor other = vals({5, 6});
  other.fill_(0.0);        // another storage
  w.clone().fill_(9.0);    // a copy of w
  y.backward(vals({1, 1}));
  EXPECT_TRUE(values_near(x.grad(), {3, 4}));
}

TEST(ViewsInplace, WriteBeforeTheSaveIsFine) {
  Tensor x = leaf({1, 2});
  Tensor w = vals({3, 4});
  w.fill_(5.0);
  Tensor y = x * w;
  y.backward(vals({1, 1}));
  EXPECT_TRUE(values_near(x.grad(), {5, 5}));
}

// --- leaves that require grad -------------------------------------------------------------------------------

TEST(ViewsInplace, LeafThatRequiresGradRefusesInPlaceUnderGradMode) {
  Tensor w = leaf({1, 2});
  const std::string msg = error_message<ValueError>([&] { w.fill_(0.0); });
  EXPECT_TRUE(contains(msg, "leaf")) << msg;
  EXPECT_TRUE(contains(msg, "NoGradGuard")) << msg;
  EXPECT_THROW(w.copy_(vals({3, 4})), ValueError);
  EXPECT_THROW(w.zero_(), ValueError);
  EXPECT_TRUE(values_near(w, {1, 2}));
}

TEST(ViewsInplace, OptimizerStyleUpdateUnderNoGrad) {
  Tensor w = leaf({1, 2});
  const Tensor x = vals({3, 4});
  (w * x).backward(vals({1, 1}));
  ASSERT_TRUE(values_near(w.grad(), {3, 4}));
  {
    NoGradGuard no_grad;
    w.copy_(w - w.grad() * 0.5);  // SGD, lr 0.5
  }
  EXPECT_TRUE(values_near(w, {1 - 1.5, 2 - 2.0}));
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(w.is_leaf());
  {
    NoGradGuard no_grad;
    w.grad().zero_();
  }
  EXPECT_TRUE(values_near(w.grad(), {0, 0}));
  (w * x).backward(vals({1, 1}));
  EXPECT_TRUE(values_near(w.grad(), {3, 4})) << "zeroed .grad accumulates again";
  {
    NoGradGuard no_grad;
    w.fill_(1.0);
  }
  EXPECT_TRUE(values_near(w, {1, 1}));
  EXPECT_TRUE(w.requires_grad());
}

TEST(ViewsInplace, UpdateAfterForwardIsCaughtAtBackward) {
  // A parameter stepped between forward and backward (a classic bug) is caught by the version check.
  Tensor w = leaf({1, 2});
  Tensor x = leaf({3, 4});
  Tensor y = w * x;  // saves w for dx
  {
    NoGradGuard no_grad;
    w.fill_(0.0);
  }
  const std::string msg = error_message<ValueError>([&] { y.backward(vals({1, 1})); });
  EXPECT_TRUE(contains(msg, "modified by an in-place operation")) << msg;
}

// --- copy_ recording history ----------------------------------------------------------------------------------

TEST(ViewsInplace, CopyFromRequiresGradSourceRecordsHistory) {
  // dst (f32 [2,3]) <- src (f64 [3]): broadcast and dtype cast; d/dsrc = column sums of v.
  Tensor src = leaf({1, 2, 3});
  Tensor dst = zeros({2, 3}, DType::f32);
  dst.copy_(src);
  EXPECT_TRUE(dst.requires_grad());
  EXPECT_FALSE(dst.is_leaf());
  EXPECT_EQ(dst.grad_fn_name(), "CopyBackward");
  EXPECT_TRUE(values_near(dst, {1, 2, 3, 1, 2, 3}));
  Tensor z = dst * vals({1, 1, 1, 1, 1, 1}, {2, 3}, DType::f32);
  z.backward(vals({1, 2, 3, 10, 20, 30}, {2, 3}, DType::f32));
  ASSERT_TRUE(src.grad().defined());
  EXPECT_EQ(src.grad().dtype(), DType::f64);
  EXPECT_EQ(src.grad().sizes(), (Shape{3}));
  EXPECT_TRUE(values_near(src.grad(), {11, 22, 33}));
}

TEST(ViewsInplace, CopyFromAConstantMakesANonLeafConstant) {
  Tensor x = leaf({1, 2});
  Tensor h = x * 3.0;
  ASSERT_TRUE(h.requires_grad());
  h.copy_(vals({5, 6}));  // overwritten by values that need no gradient
  EXPECT_FALSE(h.requires_grad());
  EXPECT_TRUE(h.is_leaf());
  Tensor z = h * x;  // dz/dx = h only
  z.backward(vals({1, 1}));
  EXPECT_TRUE(values_near(x.grad(), {5, 6}));
}

TEST(ViewsInplace, FillOfANonLeafMakesItConstant) {
  Tensor x = leaf({1, 2});
  Tensor h = x * 3.0;
  h.fill_(2.0);
  EXPECT_FALSE(h.requires_grad());
  (h * x).backward(vals({1, 1}));
  EXPECT_TRUE(values_near(x.grad(), {2, 2}));
}

TEST(ViewsInplace, CopyIntoAPartialViewRaises) {
  Tensor src = leaf({1, 2});
  Tensor dst = zeros({4});
  const std::string msg = error_message<ValueError>([&] { dst.slice(0, 0, 2).copy_(src); });
  EXPECT_TRUE(contains(msg, "partial view")) << msg;
  EXPECT_THROW(dst.slice(0, 0, 4, 2).copy_(src), ValueError);
  Tensor big = zeros({2, 2});
  EXPECT_THROW(big.select(0, 1).copy_(src), ValueError);
  EXPECT_THROW(big.t().select(0, 0).copy_(src), ValueError);
  // A constant source into a partial view is an ordinary write.
  dst.slice(0, 1, 3).copy_(vals({7, 8}));
  EXPECT_TRUE(values_near(dst, {0, 7, 8, 0}));
  // So is any source under NoGradGuard.
  {
    NoGradGuard no_grad;
    dst.slice(0, 0, 2).copy_(src);
  }
  EXPECT_TRUE(values_near(dst, {1, 2, 8, 0}));
  EXPECT_FALSE(dst.requires_grad());
}

TEST(ViewsInplace, CopyIntoAFullViewOfAnotherTensorRaises) {
  // b.view(...) covers all of b's storage, but b itself would not get the history: b * w would silently give src
  // no gradient. Refused like a partial view.
  Tensor src = leaf({1, 2, 3, 4});
  Tensor w = leaf({1, 1, 1, 1}, {2, 2});
  Tensor b = zeros({2, 2}, DType::f64);
  EXPECT_THROW(b.view({4}).copy_(src), ValueError);
  // The same with b written while a view of it is alive: the view would keep no history.
  Tensor c = zeros({4}, DType::f64);
  Tensor c_view = c.view({2, 2});
  EXPECT_THROW(c.copy_(src), ValueError);
  (void)c_view;
  EXPECT_FALSE(b.requires_grad());
  // Once the view is gone, c is the only tensor on its storage: the copy is recorded.
  c_view = Tensor();
  c.copy_(src);
  (c.view({2, 2}) * w).backward(vals({1, 2, 3, 4}, {2, 2}));
  EXPECT_TRUE(values_near(src.grad(), {1, 2, 3, 4}));
}

TEST(ViewsInplace, InPlaceIntoAViewOfATensorWithHistoryRaises) {
  Tensor x = leaf({1, 2, 3, 4});
  Tensor h = x * 2.0;
  Tensor v = h.slice(0, 0, 2);
  ASSERT_TRUE(v.requires_grad());
  EXPECT_THROW(v.fill_(0.0), ValueError);
  EXPECT_THROW(v.copy_(vals({1, 1})), ValueError);
  EXPECT_THROW(x.view({2, 2}).fill_(0.0), ValueError) << "a view of a leaf that requires grad";
  EXPECT_TRUE(values_near(h, {2, 4, 6, 8}));
}

TEST(ViewsInplace, InPlaceIntoATensorWithHistoryAndLiveViewsRaises) {
  // The view keeps h's old history: writing h in place would leave gradients through v silently wrong.
  Tensor x = leaf({1, 2, 3, 4});
  Tensor h = x * 2.0;
  Tensor v = h.slice(0, 0, 2);
  EXPECT_THROW(h.fill_(0.0), ValueError);
  v = Tensor();
  h.fill_(0.0);  // no other tensor shares the storage now: h simply becomes a constant
  EXPECT_FALSE(h.requires_grad());
}

}  // namespace
}  // namespace ember::testing
