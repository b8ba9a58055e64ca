// Module::remove_parameter / remove_buffer, PruneAmount, and the packed-weight path of Linear and Conv2d, driven by a
// test format that stores the weight transposed (so a forward that still used the dense weight would be caught).
#include <gtest/gtest.h>

#include "ember/ember.h"
#include "ember/nn/layers.h"
#include "ember/nn/packed_weight.h"
#include "ember/nn/prune_amount.h"
#include "tests/harness/op_harness.h"

namespace ember::nn {
namespace {

using ::ember::testing::allclose;

TEST(ModuleRemove, ParameterAndBufferLeaveStateDict) {
  Linear lin(3, 2);
  const Tensor w = lin.remove_parameter("weight");
  EXPECT_EQ(w.sizes(), (Shape{2, 3}));
  EXPECT_EQ(lin.named_parameters().size(), 1u);
  EXPECT_EQ(lin.state_dict().size(), 1u);
  lin.register_buffer("weight_t", w.t().contiguous());
  EXPECT_EQ(lin.state_dict().back().first, "weight_t");
  lin.register_buffer("scratch", zeros({4}), /*persistent=*/false);
  EXPECT_EQ(lin.remove_buffer("scratch").numel(), 4);
  EXPECT_EQ(lin.named_buffers().size(), 1u);
  // The name is free again, and the non-persistent flag went with it.
  lin.register_buffer("scratch", zeros({1}));
  EXPECT_EQ(lin.state_dict().size(), 3u);
  EXPECT_THROW(lin.remove_parameter("weight"), ValueError);
  EXPECT_THROW(lin.remove_buffer("nothing"), ValueError);
}

TEST(PruneAmount, ResolvesFractionsAndCounts) {
  EXPECT_EQ(PruneAmount::fraction(0.5).resolve(10), 5);
  EXPECT_EQ(PruneAmount::fraction(0.25).resolve(10), 2);  // 2.5 rounds half to even
  EXPECT_EQ(PruneAmount::fraction(0.35).resolve(10), 4);  // 0.35 * 10 rounds to exactly 3.5 -> 4 (even)
  EXPECT_EQ(PruneAmount::fraction(0.45).resolve(10), 4);  // 4.5 -> 4, as Python's round(0.45 * 10)
  EXPECT_EQ(PruneAmount::fraction(0.15).resolve(10), 2);  // 1.5 -> 2
  EXPECT_EQ(PruneAmount::fraction(1.0).resolve(7), 7);
  EXPECT_EQ(PruneAmount::fraction(0.0).resolve(7), 0);
  EXPECT_EQ(PruneAmount::count(3).resolve(3), 3);
  EXPECT_THROW(PruneAmount::count(4).resolve(3), ValueError);
  EXPECT_THROW(PruneAmount::fraction(1.5), ValueError);
  EXPECT_THROW(PruneAmount::fraction(-0.1), ValueError);
  EXPECT_THROW(PruneAmount::fraction(std::nan("")), ValueError);
  EXPECT_THROW(PruneAmount::count(-1), ValueError);
  EXPECT_EQ(PruneAmount::count(12).str(), "12 elements");
}

// Holds W^T; linear and conv2d rebuild W from it, so only this path can produce the right answer once the layer's
// dense weight is gone.
class TransposedWeight : public PackedWeight {
 public:
  explicit TransposedWeight(Tensor wt, Shape shape) : wt_(std::move(wt)), shape_(std::move(shape)) {}
  std::string format() const override { return "transposed"; }
  Tensor linear(const Tensor& x, const Tensor& bias) const override {
    Tensor y = matmul(x, wt_);
    return bias.defined() ? add(y, bias) : y;
  }
  Tensor dense() const override { return wt_.t().contiguous().reshape(shape_); }
  int64_t nbytes() const override { return wt_.nbytes(); }

 private:
  Tensor wt_;
  Shape shape_;
};

TEST(PackedWeight, LinearForwardUsesThePackedForm) {
  manual_seed(3);
  Linear lin(4, 3);
  const Tensor x = randn({2, 4});
  Tensor want;
  {
    NoGradGuard g;
    want = lin.forward(x);
  }
  const Tensor w = lin.remove_parameter("weight");
  const Tensor wt = lin.register_buffer("weight_t", w.detach().t().contiguous());
  lin.weight = Tensor();
  lin.packed_weight = std::make_shared<TransposedWeight>(wt, w.sizes());
  {
    NoGradGuard g;
    EXPECT_TRUE(allclose(lin.forward(x), want, {1e-6, 1e-6}));
  }
  // Grad mode on with a bias that requires grad: refused, with the way out in the message.
  try {
    lin.forward(x);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("NoGradGuard"), std::string::npos) << e.what();
  }
  // A format without conv2d says so.
  Conv2d conv(1, 2, 3);
  conv.packed_weight = lin.packed_weight;
  NoGradGuard g;
  EXPECT_THROW(conv.forward(randn({1, 1, 5, 5})), ValueError);
}

TEST(Conv2dOptions, ChannelSetters) {
  Conv2dOptions o(3, 8, 3);
  o.in_channels(2).out_channels(5);
  EXPECT_EQ(o.in_channels(), 2);
  EXPECT_EQ(o.out_channels(), 5);
}

}  // namespace
}  // namespace ember::nn
