// Unstructured pruning (nn/prune.h) and the bit-packed masks under it (ops_sparse.h): packing against the bit layout
// written out by hand, masks against hand-computed magnitude orders (ties, counts, fractions, iterative and global
// pruning), typed errors, gradient masking, pruned weights staying exactly zero through SGD-momentum and AdamW
// fine-tuning (also with an optimizer whose state predates the pruning), and remove().
#include <gtest/gtest.h>

#include <vector>

#include "ember/ember.h"
#include "ember/kernels/ops_sparse.h"
#include "ember/nn/functional.h"
#include "ember/nn/layers.h"
#include "ember/nn/prune.h"
#include "ember/optim/adam.h"
#include "ember/optim/sgd.h"
#include "tests/harness/op_harness.h"

namespace ember::nn {
namespace {

using ::ember::testing::allclose;
using ::ember::testing::error_message;
using ::ember::testing::rand_input_seeded;

void set_values(Tensor t, const std::vector<float>& v) {
  NoGradGuard no_grad;
  t.copy_(from_vector<float>(v, t.sizes()));
}

std::vector<bool> bools(const Tensor& t) {
  std::vector<bool> out;
  for (int64_t v : t.to(DType::i64).to_vector<int64_t>()) out.push_back(v != 0);
  return out;
}

// Indices (row-major) whose value is exactly 0.
std::vector<int64_t> zero_positions(const Tensor& t) {
  std::vector<int64_t> out;
  const std::vector<double> v = t.to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == 0.0) out.push_back(static_cast<int64_t>(i));
  return out;
}

// "1011" -> {true, false, true, true}.
std::vector<bool> keep(const std::string& bits) {
  std::vector<bool> out;
  for (char c : bits) out.push_back(c == '1');
  return out;
}

bool has_key(const NamedTensors& named, const std::string& key) {
  for (const auto& [k, t] : named)
    if (k == key) return true;
  return false;
}

// ---- bit-packed masks ---------------------------------------------------------------------------------------------

TEST(BitMask, PackMatchesTheBitLayoutAndRoundTrips) {
  for (int64_t n : {1, 7, 8, 9, 1000}) {
    const std::vector<double> r = rand_input_seeded({n}, 40 + static_cast<uint64_t>(n)).to_vector<double>();
    Tensor mask = empty({n}, {DType::b8});
    for (int64_t i = 0; i < n; ++i) mask.data<bool>()[i] = r[static_cast<size_t>(i)] > 0.0;
    const Tensor packed = ops::pack_mask(mask);
    ASSERT_EQ(packed.dtype(), DType::u8);
    ASSERT_EQ(packed.numel(), (n + 7) / 8) << n;
    // Bit i is bit i % 8 of byte i / 8; the padding bits of the last byte are 0.
    const std::vector<int64_t> bytes = packed.to_vector<int64_t>();
    for (int64_t i = 0; i < 8 * packed.numel(); ++i) {
      const bool bit = (bytes[static_cast<size_t>(i / 8)] >> (i % 8)) & 1;
      EXPECT_EQ(bit, i < n && mask.data<bool>()[i]) << "n=" << n << " bit " << i;
    }
    EXPECT_EQ(bools(ops::unpack_mask(packed, {n})), bools(mask)) << n;
    int64_t kept = 0;
    for (bool b : bools(mask)) kept += b;
    EXPECT_EQ(ops::mask_count(packed, n), kept);
  }
  // A 2-d mask packs in row-major order: [[1, 0, 0], [1, 1, 0]] -> bits 0, 3, 4 -> 0b00011001.
  Tensor m2 = from_vector<int32_t>({1, 0, 0, 1, 1, 0}, {2, 3}).to(DType::b8);
  EXPECT_EQ(ops::pack_mask(m2).to_vector<int64_t>(), (std::vector<int64_t>{0x19}));
  EXPECT_EQ(bools(ops::unpack_mask(ops::pack_mask(m2), {2, 3})), bools(m2));
  EXPECT_EQ(ops::pack_mask(empty({0}, {DType::b8})).numel(), 0);
  error_message<DTypeError>([] { ops::pack_mask(ones({3})); });
  error_message<ShapeError>([] { ops::unpack_mask(zeros({2}, {DType::u8}), {7}); });
  error_message<DTypeError>([] { ops::unpack_mask(zeros({1}, {DType::i32}), {7}); });
}

TEST(BitMask, MaskedZeroKeepsSetBitsInEveryFloatingDtype) {
  // Keep bits 0, 2, 9 of 11 elements: bytes 0b00000101, 0b00000010.
  const Tensor packed = from_vector<int32_t>({0x05, 0x02}, {2}).to(DType::u8);
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    Tensor t = from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {11}).to(dt);
    ops::masked_zero_(t, packed);
    EXPECT_EQ(t.to_vector<double>(), (std::vector<double>{1, 0, 3, 0, 0, 0, 0, 0, 0, 10, 0})) << dtype_name(dt);
  }
  Tensor p = ones({11}).requires_grad_();
  EXPECT_NE(error_message<ValueError>([&] { ops::masked_zero_(p, packed); }).find("NoGradGuard"), std::string::npos);
  error_message<ValueError>([&] { ops::masked_zero_(ones({4, 4}).t(), zeros({2}, {DType::u8})); });
  error_message<ShapeError>([&] { ops::masked_zero_(ones({17}), packed); });
  error_message<DTypeError>([&] { ops::masked_zero_(ones({11}, {DType::i32}), packed); });
}

// ---- masks against hand-computed orders ---------------------------------------------------------------------------

TEST(L1Unstructured, PrunesSmallestMagnitudesWithTiesByIndex) {
  // |w| = 0.5 0.1 0.3 / 0.2 0.1 0.9: the two 0.1 tie; index 1 goes before index 4.
  const std::vector<float> w0 = {0.5f, -0.1f, 0.3f, -0.2f, 0.1f, 0.9f};
  Linear one(3, 2);
  set_values(one.weight, w0);
  l1_unstructured(one, "weight", PruneAmount::count(1));
  EXPECT_EQ(zero_positions(one.weight), (std::vector<int64_t>{1}));
  EXPECT_EQ(bools(prune_mask(one, "weight")), keep("101111"));
  EXPECT_EQ(prune_mask(one, "weight").sizes(), (Shape{2, 3}));

  Linear two(3, 2);
  set_values(two.weight, w0);
  l1_unstructured(two, "weight", PruneAmount::count(2));
  EXPECT_EQ(zero_positions(two.weight), (std::vector<int64_t>{1, 4}));

  Linear half(3, 2);
  set_values(half.weight, w0);
  l1_unstructured(half, "weight", PruneAmount::fraction(0.5));  // round(3.0) = 3: 0.1, 0.1, 0.2
  EXPECT_EQ(zero_positions(half.weight), (std::vector<int64_t>{1, 3, 4}));
  // The kept values are untouched.
  EXPECT_EQ(half.weight.to_vector<float>(), (std::vector<float>{0.5f, 0, 0.3f, 0, 0, 0.9f}));
  // The mask: a persistent u8 buffer of ceil(6/8) = 1 byte, in the state_dict; the bias is not pruned.
  EXPECT_TRUE(is_pruned(half, "weight"));
  EXPECT_FALSE(is_pruned(half, "bias"));
  EXPECT_TRUE(has_key(half.state_dict(), "weight_mask"));
  for (const auto& [k, t] : half.named_buffers())
    if (k == "weight_mask") {
      EXPECT_EQ(t.nbytes(), 1);
    }
  EXPECT_DOUBLE_EQ(sparsity(half.weight), 0.5);
}

TEST(L1Unstructured, FractionRoundsHalfToEvenAndZeroPrunesNothing) {
  Linear l(5, 2, /*bias=*/false);
  set_values(l.weight, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  l1_unstructured(l, "weight", PruneAmount::fraction(0.25));  // 2.5 -> 2
  EXPECT_EQ(zero_positions(l.weight), (std::vector<int64_t>{0, 1}));
  Linear z(5, 2, false);
  l1_unstructured(z, "weight", PruneAmount::fraction(0.0));
  EXPECT_TRUE(is_pruned(z, "weight"));
  EXPECT_EQ(ops::mask_count(z.named_buffers()[0].second, 10), 10);
  Linear all(5, 2, false);
  l1_unstructured(all, "weight", PruneAmount::fraction(1.0));
  EXPECT_DOUBLE_EQ(sparsity(all.weight), 1.0);
}

TEST(L1Unstructured, IterativePruningAppliesToTheRemainingElements) {
  Linear l(4, 2, false);
  set_values(l.weight, {8, -1, 6, 3, -7, 2, 5, 4});
  l1_unstructured(l, "weight", PruneAmount::fraction(0.5));  // 1, 2, 3, 4 at 1, 5, 3, 7
  EXPECT_EQ(zero_positions(l.weight), (std::vector<int64_t>{1, 3, 5, 7}));
  l1_unstructured(l, "weight", PruneAmount::fraction(0.5));  // half of the 4 left: 5, 6 at 6, 2
  EXPECT_EQ(zero_positions(l.weight), (std::vector<int64_t>{1, 2, 3, 5, 6, 7}));
  EXPECT_EQ(bools(prune_mask(l, "weight")), keep("10001000"));
  l1_unstructured(l, "weight", PruneAmount::count(1));  // 7 at 4 (|8| stays)
  EXPECT_EQ(bools(prune_mask(l, "weight")), keep("10000000"));
  // Only one element is left: a count of 2 is more than there is.
  EXPECT_NE(error_message<ValueError>([&] { l1_unstructured(l, "weight", PruneAmount::count(2)); }).find("2"),
            std::string::npos);
  // A single buffer all along.
  EXPECT_EQ(l.named_buffers().size(), 1u);
}

TEST(GlobalUnstructured, OneThresholdOverAllTensors) {
  auto a = std::make_shared<Linear>(2, 2, false), b = std::make_shared<Linear>(2, 2, false);
  set_values(a->weight, {0.1f, 0.2f, 0.3f, 0.4f});
  set_values(b->weight, {1, 2, 3, 0.05f});
  global_unstructured({{a, "weight"}, {b, "weight"}}, PruneAmount::count(3));  // 0.05 (b), 0.1, 0.2 (a)
  EXPECT_EQ(zero_positions(a->weight), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(zero_positions(b->weight), (std::vector<int64_t>{3}));
  // Per layer the same count gives another mask.
  auto c = std::make_shared<Linear>(2, 2, false);
  set_values(c->weight, {1, 2, 3, 0.05f});
  l1_unstructured(*c, "weight", PruneAmount::count(3));
  EXPECT_EQ(zero_positions(c->weight), (std::vector<int64_t>{0, 1, 3}));
  // Again, over the 5 elements left: round(0.4 * 5) = 2 -> 0.3, 0.4 (a).
  global_unstructured({{a, "weight"}, {b, "weight"}}, PruneAmount::fraction(0.4));
  EXPECT_EQ(zero_positions(a->weight), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(zero_positions(b->weight), (std::vector<int64_t>{3}));

  // Ties across tensors: the earlier tensor of the list goes first.
  auto d = std::make_shared<Linear>(2, 1, false), e = std::make_shared<Linear>(2, 1, false);
  set_values(d->weight, {1, 2});
  set_values(e->weight, {1, 2});
  global_unstructured({{e, "weight"}, {d, "weight"}}, PruneAmount::count(1));
  EXPECT_EQ(zero_positions(e->weight), (std::vector<int64_t>{0}));
  EXPECT_TRUE(zero_positions(d->weight).empty());
}

TEST(PruneErrors, BadAmountsAndNamesRaise) {
  EXPECT_THROW(PruneAmount::fraction(1.5), ValueError);
  EXPECT_THROW(PruneAmount::fraction(-0.1), ValueError);
  EXPECT_THROW(PruneAmount::count(-1), ValueError);
  Linear l(3, 2);
  error_message<ValueError>([&] { l1_unstructured(l, "weight", PruneAmount::count(7)); });
  const std::string msg = error_message<ValueError>([&] { l1_unstructured(l, "wieght", PruneAmount::count(1)); });
  EXPECT_NE(msg.find("Linear"), std::string::npos) << msg;
  EXPECT_NE(msg.find("wieght"), std::string::npos) << msg;
  struct Holder : Module {
    Holder() : Module("Holder") { register_parameter("index", zeros({3}, {DType::i64}), /*requires_grad=*/false); }
  } h;
  EXPECT_NE(error_message<ValueError>([&] { l1_unstructured(h, "index", PruneAmount::count(1)); }).find("floating"),
            std::string::npos);
  error_message<ValueError>([] { global_unstructured({}, PruneAmount::count(1)); });
  auto s = std::make_shared<Linear>(2, 2);
  error_message<ValueError>([&] { global_unstructured({{s, "weight"}, {s, "weight"}}, PruneAmount::count(1)); });
  error_message<ValueError>([&] { global_unstructured({{nullptr, "weight"}}, PruneAmount::count(1)); });
  // Nothing was pruned by the failed calls.
  EXPECT_FALSE(is_pruned(l, "weight"));
  EXPECT_FALSE(is_pruned(*s, "weight"));
  error_message<ValueError>([&] { remove(l, "weight"); });
  error_message<ValueError>([&] { prune_mask(l, "weight"); });
}

// ---- gradients and fine-tuning ------------------------------------------------------------------------------------

TEST(PruneGradients, PrunedGradientsAreZeroBeforeAccumulation) {
  Linear l(3, 2);
  set_values(l.weight, {0.5f, -0.1f, 0.3f, -0.2f, 0.1f, 0.9f});
  l1_unstructured(l, "weight", PruneAmount::count(2));  // indices 1, 4
  const Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  sum(l.forward(x)).backward();
  // d sum(x W^T) / dW[n, k] = sum_b x[b, k] = 5, 7, 9 for every n; pruned entries 0.
  EXPECT_EQ(l.weight.grad().to_vector<float>(), (std::vector<float>{5, 0, 9, 5, 0, 9}));
  EXPECT_EQ(l.bias.grad().to_vector<float>(), (std::vector<float>{2, 2}));
  // The hook follows the module to another dtype (the mask buffer stays u8 and is the same handle).
  l.to(DType::f64);
  l.zero_grad();
  sum(l.forward(x.to(DType::f64))).backward();
  EXPECT_EQ(l.weight.grad().to_vector<double>(), (std::vector<double>{5, 0, 9, 5, 0, 9}));
}

std::shared_ptr<Sequential> tiny_model() {
  return std::make_shared<Sequential>(std::make_shared<Conv2d>(1, 3, 3), std::make_shared<ReLU>(),
                                      std::make_shared<Flatten>(), std::make_shared<Linear>(3 * 4 * 4, 4));
}

// One training step on a fixed batch (cross entropy of 4 classes).
template <class Opt>
void train_step(Sequential& model, Opt& opt, uint64_t seed) {
  const Tensor x = rand_input_seeded({2, 1, 6, 6}, seed).to(DType::f32);
  const Tensor target = from_vector<int64_t>({1, 3}, {2});
  opt.zero_grad();
  functional::cross_entropy(model.forward(x), target).backward();
  opt.step();
}

void prune_tiny(Sequential& model) {
  l1_unstructured(*model[0], "weight", PruneAmount::fraction(0.5));
  l1_unstructured(*model[3], "weight", PruneAmount::fraction(0.5));
}

// The pruned positions of every pruned weight are exactly zero.
void expect_pruned_zero(Sequential& model, const std::string& when) {
  for (size_t i : {size_t{0}, size_t{3}}) {
    const Tensor mask = prune_mask(*model[i], "weight");
    const std::vector<bool> keep = bools(mask);
    const std::vector<double> w = model[i]->named_parameters(false)[0].second.to_vector<double>();
    int64_t moved = 0;
    for (size_t j = 0; j < keep.size(); ++j) moved += !keep[j] && w[j] != 0.0;
    EXPECT_EQ(moved, 0) << "layer " << i << " " << when;
  }
}

TEST(PruneFineTuning, PrunedWeightsStayZeroThroughSgdMomentumAndAdamW) {
  auto model = tiny_model();
  prune_tiny(*model);
  optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2});
  for (int s = 0; s < 5; ++s) {
    train_step(*model, sgd, 900 + s);
    expect_pruned_zero(*model, "after SGD step " + std::to_string(s));
  }
  optim::AdamW adamw(model->parameters(), {.lr = 0.05});
  const Tensor w3 = model->named_parameters()[2].second.clone();
  for (int s = 0; s < 5; ++s) {
    train_step(*model, adamw, 950 + s);
    expect_pruned_zero(*model, "after AdamW step " + std::to_string(s));
  }
  EXPECT_FALSE(allclose(model->named_parameters()[2].second, w3, {0, 0})) << "the kept weights did train";
}

TEST(PruneFineTuning, OptimizerStateFromBeforePruningIsMasked) {
  for (bool adam : {false, true}) {
    auto model = tiny_model();
    std::unique_ptr<optim::Optimizer> opt;
    if (adam)
      opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 0.05});
    else
      opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    for (int s = 0; s < 3; ++s) train_step(*model, *opt, 700 + s);  // state everywhere, pruned positions included
    prune_tiny(*model);
    // Without masking the state, the stale momentum / moments move pruned weights off zero ...
    train_step(*model, *opt, 710);
    int64_t moved = 0;
    for (size_t i : {size_t{0}, size_t{3}}) {
      const std::vector<bool> keep = bools(prune_mask(*(*model)[i], "weight"));
      const std::vector<double> w = (*model)[i]->named_parameters(false)[0].second.to_vector<double>();
      for (size_t j = 0; j < keep.size(); ++j) moved += !keep[j] && w[j] != 0.0;
    }
    EXPECT_GT(moved, 0) << (adam ? "AdamW" : "SGD");
    // ... reapply_masks puts them back, and mask_optimizer_state keeps them there from now on.
    reapply_masks(*model);
    expect_pruned_zero(*model, "after reapply_masks");
    mask_optimizer_state(*opt, *model);
    for (int s = 0; s < 5; ++s) {
      train_step(*model, *opt, 720 + s);
      expect_pruned_zero(*model, std::string(adam ? "AdamW" : "SGD") + " step " + std::to_string(s));
    }
  }
}

// ---- remove ---------------------------------------------------------------------------------------------------------

TEST(PruneRemove, KeepsZerosDropsTheMaskAndTheHook) {
  Linear l(3, 2);
  set_values(l.weight, {0.5f, -0.1f, 0.3f, -0.2f, 0.1f, 0.9f});
  l1_unstructured(l, "weight", PruneAmount::count(2));
  remove(l, "weight");
  EXPECT_FALSE(is_pruned(l, "weight"));
  EXPECT_TRUE(l.named_buffers().empty());
  EXPECT_FALSE(has_key(l.state_dict(), "weight_mask"));
  EXPECT_EQ(zero_positions(l.weight), (std::vector<int64_t>{1, 4}));
  // No hook any more: the gradient reaches every element.
  sum(l.forward(from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}))).backward();
  EXPECT_EQ(l.weight.grad().to_vector<float>(), (std::vector<float>{5, 7, 9, 5, 7, 9}));
  error_message<ValueError>([&] { remove(l, "weight"); });
  // Pruning again after remove starts a new mask (and hook) over all elements.
  l1_unstructured(l, "weight", PruneAmount::count(3));  // the two zeros, then |-0.2| at 3
  EXPECT_EQ(zero_positions(l.weight), (std::vector<int64_t>{1, 3, 4}));
  EXPECT_EQ(bools(prune_mask(l, "weight")), keep("101001"));
}

TEST(PruneRemove, AModuleDestroyedWithoutRemoveLeavesNothingDangling) {
  Tensor weight;
  {
    auto l = std::make_shared<Linear>(3, 2, false);
    set_values(l->weight, {0.5f, -0.1f, 0.3f, -0.2f, 0.1f, 0.9f});
    l1_unstructured(*l, "weight", PruneAmount::count(2));
    weight = l->weight;
  }
  // The parameter outlives its module; its hook still masks with the mask it holds.
  sum(matmul(from_vector<float>({1, 1, 1}, {1, 3}), weight.t())).backward();
  EXPECT_EQ(weight.grad().to_vector<float>(), (std::vector<float>{1, 0, 1, 1, 0, 1}));
  // New modules prune and remove as usual.
  for (int i = 0; i < 3; ++i) {
    Linear m(4, 4);
    l1_unstructured(m, "weight", PruneAmount::fraction(0.5));
    remove(m, "weight");
    EXPECT_DOUBLE_EQ(sparsity(m.weight), 0.5);
  }
}

}  // namespace
}  // namespace ember::nn
