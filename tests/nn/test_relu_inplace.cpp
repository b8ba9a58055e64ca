// In-place ReLU (Note [In-place ReLU] in ember/autograd/formulas_elementwise.cpp): relu_ gives relu's values and
// gradients in the input's own storage, takes over its history, refuses the writes autograd cannot represent, and a
// forward through nn::ReLU(inplace) holds one activation fewer at its peak. Device-parameterised where kernels run:
// cuda instances skip without a GPU.
#include <gtest/gtest.h>

#include "ember/autograd/hooks.h"
#include "ember/ember.h"
#include "ember/memory/cpu_allocator.h"
#include "ember/nn/checkpoint_wrapper.h"
#include "ember/nn/functional.h"
#include "ember/nn/layers.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

namespace F = nn::functional;

class ReluInplaceTest : public DeviceTest {};

// Inputs with negatives, positives and exact zeros (relu's gradient there is 0 in both forms).
Tensor mixed_input(Device dev, DType dt) {
  Tensor x = rand_input({6, 37}, -2.0, 2.0);
  x.slice(1, 0, 3).fill_(0.0);
  return x.to(dt).to(dev);
}

TEST_P(ReluInplaceTest, ValuesAndGradientsAreRelus) {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x0 = mixed_input(device(), dt);
    const Tensor w = rand_input({6, 37}).to(dt).to(device());
    const Tensor a = x0.clone().requires_grad_(true), b = x0.clone().requires_grad_(true);
    const Tensor ha = a * 2.0, hb = b * 2.0;  // non-leaves, saved by nothing
    const void* storage = hb.raw_data();
    const int64_t version = hb.version();
    const Tensor ya = relu(ha);
    const Tensor yb = relu_(hb);
    EXPECT_EQ(yb.raw_data(), storage) << "relu_ must write into its input";
    EXPECT_GT(hb.version(), version);
    EXPECT_TRUE(allclose(hb, ya, Tolerance{0.0, 0.0}));
    sum(ya * w).backward();
    sum(yb * w).backward();
    EXPECT_TRUE(allclose(b.grad(), a.grad(), Tolerance{0.0, 0.0}));
  }
}

TEST_P(ReluInplaceTest, ModuleAndFunctional) {
  const Tensor x0 = mixed_input(device(), DType::f32);
  auto inplace = std::make_shared<nn::ReLU>(true);
  EXPECT_EQ(inplace->extra_repr(), "inplace=True");
  EXPECT_EQ(nn::ReLU().extra_repr(), "");
  const Tensor h = x0.clone();
  const Tensor y = inplace->forward(h);
  EXPECT_EQ(y.raw_data(), h.raw_data());
  EXPECT_TRUE(allclose(h, relu(x0), Tolerance{0.0, 0.0}));
  const Tensor g = x0.clone();
  (void)F::relu_(g);
  EXPECT_TRUE(allclose(g, relu(x0), Tolerance{0.0, 0.0}));
}

// The writes autograd cannot represent are refused before anything is written.
TEST_P(ReluInplaceTest, RefusesWritesAutogradCannotRepresent) {
  const Tensor x0 = mixed_input(device(), DType::f32);
  const Tensor leaf = x0.clone().requires_grad_(true);
  EXPECT_NE(error_message<ValueError>([&] { (void)relu_(leaf); }).find("leaf that requires grad"), std::string::npos);
  EXPECT_TRUE(allclose(leaf.detach(), x0, Tolerance{0.0, 0.0})) << "a refused relu_ must not write";

  const Tensor h = leaf * 1.0;
  const Tensor view = h.slice(0, 0, 2);
  EXPECT_NE(error_message<ValueError>([&] { (void)relu_(view); }).find("view"), std::string::npos);

  // exp saves its output: writing into it would change what exp's backward reads.
  const Tensor e = exp(leaf);
  EXPECT_NE(error_message<ValueError>([&] { (void)relu_(e); }).find("share"), std::string::npos);

  // relu_ saves its own output, so a second relu_ on the same tensor is refused likewise.
  const Tensor h2 = leaf * 2.0;
  (void)relu_(h2);
  EXPECT_THROW((void)relu_(h2), ValueError);

  // Without grad mode nothing is tracked, and a leaf can be written (an optimizer-style update).
  {
    NoGradGuard no_grad;
    (void)relu_(leaf);
  }
  EXPECT_TRUE(allclose(leaf.detach(), relu(x0), Tolerance{0.0, 0.0}));
  EXPECT_FALSE(leaf.grad().defined());
}

// A tensor saved by a later op and written again after that op is caught at backward (its version moved).
TEST_P(ReluInplaceTest, LaterWritesAreCaughtAtBackward) {
  const Tensor x = mixed_input(device(), DType::f32).requires_grad_(true);
  const Tensor h = relu_(x * 1.0);
  const Tensor z = h * h;  // mul saves h
  h.detach().fill_(1.0);
  EXPECT_NE(error_message<ValueError>([&] { sum(z).backward(); }).find("modified by an in-place operation"),
            std::string::npos);
}

TEST_P(ReluInplaceTest, KernelOpChecksItsDestination) {
  const Tensor x = mixed_input(device(), DType::f32);
  (void)error_message<ValueError>([&] { ops::relu_(x.transpose(0, 1)); });
  (void)error_message<DTypeError>([&] { ops::relu_(ne(x, 0.0)); });
  const Tensor i = from_vector(std::vector<int64_t>{-3, 0, 4}, {3}).to(device());
  ops::relu_(i);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 4}));
}

// Note [retain_grad across in-place writes]: .grad is the gradient with respect to the tensor's latest value (the
// ReLU's output, unmasked), as in PyTorch; a hook registered before the write still sees the earlier value's.
TEST_P(ReluInplaceTest, RetainedGradientFollowsTheWrite) {
  const Tensor x = mixed_input(device(), DType::f32).requires_grad_(true);
  const Tensor w = rand_input({6, 37}).to(DType::f32).to(device());
  const Tensor h = x * 1.0;
  h.retain_grad();
  Tensor before_write;
  autograd::register_hook(h, [&](const Tensor& g) {
    before_write = g;
    return Tensor();
  });
  (void)relu_(h);
  sum(h * w).backward();
  ASSERT_TRUE(h.grad().defined());
  EXPECT_TRUE(allclose(h.grad(), w, Tolerance{0.0, 0.0}));
  ASSERT_TRUE(before_write.defined());
  EXPECT_TRUE(allclose(before_write, x.grad(), Tolerance{0.0, 0.0}));  // masked: the gradient of h before relu_
  EXPECT_TRUE(allclose(x.grad(), mul(w, gt(x.detach(), 0.0).to(DType::f32)), Tolerance{0.0, 0.0}));
}

// The module writes in place only where nothing else sees the input; elsewhere it computes relu, same values and
// gradients.
TEST_P(ReluInplaceTest, ModuleFallsBackWhereTheInputIsShared) {
  const Tensor x0 = mixed_input(device(), DType::f32);
  nn::ReLU inplace(true);
  const Tensor leaf = x0.clone().requires_grad_(true);
  const Tensor y = inplace.forward(leaf);  // a leaf that requires grad: out of place
  EXPECT_NE(y.raw_data(), leaf.raw_data());
  EXPECT_TRUE(allclose(leaf.detach(), x0, Tolerance{0.0, 0.0}));
  sum(y).backward();
  EXPECT_TRUE(allclose(leaf.grad(), gt(x0, 0.0).to(DType::f32), Tolerance{0.0, 0.0}));

  const Tensor h = x0.clone();
  const Tensor alias = h.detach();  // shares the storage
  EXPECT_FALSE(can_write_in_place(h));
  EXPECT_NE(inplace.forward(h).raw_data(), h.raw_data());
  EXPECT_TRUE(allclose(alias, x0, Tolerance{0.0, 0.0}));
  EXPECT_TRUE(can_write_in_place(x0.clone()));
  EXPECT_FALSE(can_write_in_place(x0.clone().transpose(0, 1)));
}

EMBER_INSTANTIATE_DEVICE_TESTS(ReluInplaceTest);

// A block whose input the checkpoint machinery holds (checkpoint_sequential's saved region input, the planner's
// profiling leaf) runs ReLU(inplace) out of place: same gradients as without checkpointing.
TEST(ReluInplaceCheckpoint, SegmentsAndThePlannerWork) {
  auto make = [] {
    manual_seed(5);
    return std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(16, 32), std::make_shared<nn::ReLU>(true),
                                            std::make_shared<nn::Linear>(32, 32), std::make_shared<nn::ReLU>(true),
                                            std::make_shared<nn::Linear>(32, 4));
  };
  const Tensor x = randn({8, 16});
  auto grads_of = [&](const std::function<Tensor(const nn::Sequential&)>& run) {
    auto net = make();
    sum(run(*net)).backward();
    std::vector<Tensor> g;
    for (const Tensor& p : net->parameters()) g.push_back(p.grad());
    return g;
  };
  const auto plain = grads_of([&](const nn::Sequential& n) { return const_cast<nn::Sequential&>(n).forward(x); });
  const auto segmented = grads_of([&](const nn::Sequential& n) { return nn::checkpoint_sequential(n, 2, x); });
  ASSERT_EQ(plain.size(), segmented.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(allclose(segmented[i], plain[i], Tolerance{0.0, 0.0})) << i;

  auto net = make();
  const autograd::CheckpointPlan plan = net->plan_checkpointing(x, autograd::CheckpointPolicy::parse("sqrt"));
  sum(net->forward(x)).backward();
  std::vector<Tensor> planned;
  for (const Tensor& p : net->parameters()) planned.push_back(p.grad());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(allclose(planned[i], plain[i], Tolerance{0.0, 0.0})) << i;
}

// The point of it: Linear -> ReLU(inplace) peaks where Linear alone does, while Linear -> ReLU() briefly holds the
// linear output and its rectified copy.
TEST(ReluInplaceMemory, ForwardPeakHoldsOneActivationFewer) {
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  // More rows than inputs, so the activation outweighs the CPU GEMM's packed copy of the weight (its workspace).
  const int64_t batch = 1024, in = 128, width = 2048;
  const int64_t activation = batch * width * 4;
  const Tensor x = randn({batch, in});
  auto peak_of = [&](std::shared_ptr<nn::Module> net) {
    alloc.reset_peak_stats();
    const int64_t before = alloc.stats().allocated_bytes;
    const Tensor y = net->forward(x);
    return alloc.stats().peak_allocated_bytes - before;
  };
  auto linear = std::make_shared<nn::Linear>(in, width);
  const int64_t linear_alone = peak_of(linear);
  const int64_t in_place = peak_of(std::make_shared<nn::Sequential>(linear, std::make_shared<nn::ReLU>(true)));
  const int64_t out_of_place = peak_of(std::make_shared<nn::Sequential>(linear, std::make_shared<nn::ReLU>(false)));
  EXPECT_EQ(in_place, linear_alone);
  EXPECT_GE(out_of_place, 2 * activation);
  EXPECT_GT(linear_alone, activation);
  EXPECT_LT(linear_alone, 2 * activation);
}

}  // namespace
}  // namespace ember::testing
