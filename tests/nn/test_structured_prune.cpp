// Structured pruning tests: channel norms and ranking against hand-computed values (ties included), shrunk models
// equal to their masked dense models (a conv-bn-relu chain, MLPs, MnistNet), hand-counted parameter sizes, a training
// step and a state_dict round trip after shrinking, and errors that leave every module unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ember/ember.h"
#include "ember/memory/memory_report.h"
#include "ember/nn/functional.h"
#include "ember/nn/models.h"
#include "ember/nn/structured_prune.h"
#include "ember/optim/sgd.h"
#include "tests/harness/op_harness.h"

namespace ember::nn {
namespace {

using ::ember::testing::allclose;
using ::ember::testing::error_message;
using ::ember::testing::rand_input;

std::vector<double> f64(const Tensor& t) { return t.to(DType::f64).contiguous().to_vector<double>(); }

// A copy of every state tensor (shape and values) to compare against later.
std::vector<std::pair<std::string, Tensor>> snapshot(const Module& m) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : m.state_dict()) out.emplace_back(name, t.clone());
  return out;
}

void expect_unchanged(const Module& m, const std::vector<std::pair<std::string, Tensor>>& before) {
  const NamedTensors now = m.state_dict();
  ASSERT_EQ(now.size(), before.size());
  for (size_t i = 0; i < now.size(); ++i) {
    EXPECT_EQ(now[i].first, before[i].first);
    EXPECT_EQ(now[i].second.sizes(), before[i].second.sizes()) << now[i].first;
    if (now[i].second.sizes() == before[i].second.sizes()) {
      EXPECT_EQ(f64(now[i].second), f64(before[i].second)) << now[i].first;
    }
  }
}

// Copies rand values into every floating state tensor of m (BatchNorm variances positive) so masks are visible.
void randomise(Module& m, uint64_t seed) {
  NoGradGuard no_grad;
  uint64_t s = seed;
  for (const auto& [name, t] : m.state_dict()) {
    if (!is_floating(t.dtype())) continue;
    const bool positive = name.find("running_var") != std::string::npos;
    Tensor dst = t;
    dst.copy_(::ember::testing::rand_input_seeded(t.sizes(), s++, positive ? 0.5 : -1.0, positive ? 1.5 : 1.0));
  }
}

// conv(3->6, 3, pad 1) bn relu conv(6->8, 3) relu flatten linear(128->10) relu linear(10->4); input [N, 3, 6, 6].
std::shared_ptr<Sequential> conv_chain(int64_t c1 = 6, int64_t c2 = 8, int64_t hidden = 10) {
  return std::make_shared<Sequential>(
      std::make_shared<Conv2d>(3, c1, 3, 1, 1), std::make_shared<BatchNorm2d>(c1), std::make_shared<ReLU>(),
      std::make_shared<Conv2d>(c1, c2, 3), std::make_shared<ReLU>(), std::make_shared<Flatten>(),
      std::make_shared<Linear>(c2 * 16, hidden), std::make_shared<ReLU>(), std::make_shared<Linear>(hidden, 4));
}

// ---- ranking ---------------------------------------------------------------------------------------------------

TEST(StructuredPrune, ChannelNormsMatchHandComputed) {
  // Rows a = [1, 1, 1], b = [2, 0, 0], c = [0.5, 0, 0], d = [-1, 1, -1].
  const Tensor w = from_vector<double>({1, 1, 1, 2, 0, 0, 0.5, 0, 0, -1, 1, -1}, {4, 3});
  const std::vector<double> l1 = channel_norms(w, 1), l2 = channel_norms(w, 2),
                            inf = channel_norms(w, std::numeric_limits<double>::infinity()),
                            l3 = channel_norms(w, 3);
  const std::vector<double> l1_ref{3, 2, 0.5, 3}, inf_ref{1, 2, 0.5, 1};
  const std::vector<double> l2_ref{std::sqrt(3.0), 2, 0.5, std::sqrt(3.0)}, l3_ref{std::cbrt(3.0), 2, 0.5, std::cbrt(3.0)};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(l1[i], l1_ref[i], 1e-12);
    EXPECT_NEAR(l2[i], l2_ref[i], 1e-12);
    EXPECT_NEAR(inf[i], inf_ref[i], 1e-12);
    EXPECT_NEAR(l3[i], l3_ref[i], 1e-12);
  }
  // Over every dim but the first of a conv weight [2, 2, 1, 2]: channel 0 = [3, -4, 0, 0], channel 1 = [1, 1, 1, 1].
  const Tensor cw = from_vector<float>({3, -4, 0, 0, 1, 1, 1, 1}, {2, 2, 1, 2});
  EXPECT_NEAR(channel_norms(cw, 2)[0], 5.0, 1e-6);
  EXPECT_NEAR(channel_norms(cw, 2)[1], 2.0, 1e-6);
  EXPECT_NEAR(channel_norms(cw, 1)[0], 7.0, 1e-6);
}

TEST(StructuredPrune, RankingPrunesLowestAndLowerIndexOnTies) {
  const std::vector<double> l1{3, 2, 0.5, 3}, l2{std::sqrt(3.0), 2, 0.5, std::sqrt(3.0)};
  // L1: c (0.5) then b (2) go.   L2: c, then a and d tie at sqrt(3): a (the lower index) goes.
  EXPECT_EQ(channels_to_keep(l1, PruneAmount::fraction(0.5)), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(channels_to_keep(l2, PruneAmount::fraction(0.5)), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(channels_to_keep(l1, PruneAmount::count(3)), (std::vector<int64_t>{3}));  // a, d tie: a goes
  EXPECT_EQ(channels_to_keep(l1, PruneAmount::count(0)), (std::vector<int64_t>{0, 1, 2, 3}));
  // Everything asked: one channel (the largest, the higher index on a tie) stays.
  EXPECT_EQ(channels_to_keep(l1, PruneAmount::fraction(1.0)), (std::vector<int64_t>{3}));
  // round(0.3 * 4) = 1; round(0.625 * 4) = round(2.5) = 2 (half to even).
  EXPECT_EQ(channels_to_keep(l2, PruneAmount::fraction(0.3)), (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(channels_to_keep(l2, PruneAmount::fraction(0.625)), (std::vector<int64_t>{1, 3}));
}

TEST(StructuredPrune, LinearProducerKeepsHandRankedRows) {
  auto net = std::make_shared<Sequential>(std::make_shared<Linear>(3, 4), std::make_shared<Tanh>(),
                                          std::make_shared<Linear>(4, 2));
  auto fc = net->at<Linear>(0), out = net->at<Linear>(2);
  {
    NoGradGuard g;
    fc->weight.copy_(from_vector<float>({1, 1, 1, 2, 0, 0, 0.5, 0, 0, -1, 1, -1}, {4, 3}));
    fc->bias.copy_(from_vector<float>({10, 20, 30, 40}, {4}));
    out->weight.copy_(from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4}));
  }
  const Tensor w_handle = fc->weight;
  const StructuredPruneReport r = ln_structured(channel_groups(*net), PruneAmount::count(2), 2.0);
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(r.groups[0].kept, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(r.groups[0].channels_before, 4);
  EXPECT_EQ(r.groups[0].producer, "Sequential.0");
  EXPECT_TRUE(fc->weight.is_same(w_handle));  // the registered handle is kept
  EXPECT_TRUE(fc->weight.requires_grad());
  EXPECT_EQ(f64(fc->weight), (std::vector<double>{2, 0, 0, -1, 1, -1}));
  EXPECT_EQ(f64(fc->bias), (std::vector<double>{20, 40}));
  EXPECT_EQ(f64(out->weight), (std::vector<double>{2, 4, 6, 8}));
  EXPECT_EQ(fc->out_features, 2);
  EXPECT_EQ(out->in_features, 2);
  // 3*4+4 + 4*2+2 = 26 -> 3*2+2 + 2*2+2 = 14; f32 bytes.
  EXPECT_EQ(r.parameters_before, 26);
  EXPECT_EQ(r.parameters_after, 14);
  EXPECT_EQ(r.parameter_bytes_after, 14 * 4);
  EXPECT_EQ(r.groups[0].parameters_before, 26);
  EXPECT_EQ(r.groups[0].parameters_after, 14);
  EXPECT_NE(r.str().find("4 -> 2 channels"), std::string::npos) << r.str();
}

// ---- shrunk == masked dense --------------------------------------------------------------------------------------

TEST(StructuredPrune, ConvChainEqualsMaskedDenseModel) {
  manual_seed(11);
  auto net = conv_chain();
  auto masked = conv_chain();
  randomise(*net, 100);
  masked->load_state_dict(net->state_dict());

  const auto groups = channel_groups(*net);
  ASSERT_EQ(groups.size(), 3u);
  ASSERT_EQ(groups[0].consumers.size(), 2u);  // bn, conv
  EXPECT_EQ(groups[1].consumers[0].features_per_channel, 16);
  EXPECT_EQ(groups[2].consumers[0].features_per_channel, 1);

  const StructuredPruneReport r = ln_structured(groups, PruneAmount::fraction(0.5));
  // PyTorch's masking: producer rows and BatchNorm affine zeroed, consumers untouched (ReLU maps 0 to 0).
  mask_channels(channel_groups(*masked), r, /*mask_consumer_inputs=*/false);

  // conv1 3*3*9+3, bn 3+3, conv2 3*4*9+4, fc 64*5+5, out 5*4+4 (before: 168 + 12 + 440 + 1290 + 44).
  EXPECT_EQ(net->num_parameters(), 84 + 6 + 112 + 325 + 24);
  EXPECT_EQ(r.parameters_before, 1954);
  EXPECT_EQ(r.parameters_after, 551);
  EXPECT_EQ(net->at<BatchNorm2d>(1)->running_mean.sizes(), (Shape{3}));
  EXPECT_EQ(net->at<Conv2d>(3)->options.in_channels(), 3);

  const Tensor x = rand_input({2, 3, 6, 6}).to(DType::f32);
  for (bool training : {false, true}) {
    net->train(training);
    masked->train(training);
    NoGradGuard g;
    const Tensor y = net->forward(x), ref = masked->forward(x);
    ASSERT_EQ(y.sizes(), (Shape{2, 4}));
    EXPECT_TRUE(allclose(y, ref, {1e-5, 1e-5})) << "training=" << training;
  }
}

TEST(StructuredPrune, MlpEqualsMaskedDenseModelAndSigmoidNeedsConsumerMask) {
  manual_seed(12);
  auto net = make_mlp({8, 16, 12, 3});
  auto masked = make_mlp({8, 16, 12, 3});
  masked->load_state_dict(net->state_dict());
  const StructuredPruneReport r = ln_structured(channel_groups(*net), PruneAmount::count(5), 1.0);
  mask_channels(channel_groups(*masked), r);
  // 8*11+11 + 11*7+7 + 7*3+3
  EXPECT_EQ(net->num_parameters(), 99 + 84 + 24);
  const Tensor x = rand_input({5, 8}).to(DType::f32);
  NoGradGuard g;
  EXPECT_TRUE(allclose(net->forward(x), masked->forward(x), {1e-5, 1e-5}));

  // Sigmoid(0) = 0.5: the masked model equals the shrunk one only with the consumer inputs masked too.
  auto sig = std::make_shared<Sequential>(std::make_shared<Linear>(4, 6), std::make_shared<Sigmoid>(),
                                          std::make_shared<Linear>(6, 2));
  auto sig_masked = std::make_shared<Sequential>(std::make_shared<Linear>(4, 6), std::make_shared<Sigmoid>(),
                                                 std::make_shared<Linear>(6, 2));
  auto sig_producer_only = std::make_shared<Sequential>(std::make_shared<Linear>(4, 6), std::make_shared<Sigmoid>(),
                                                        std::make_shared<Linear>(6, 2));
  sig_masked->load_state_dict(sig->state_dict());
  sig_producer_only->load_state_dict(sig->state_dict());
  const StructuredPruneReport rs = ln_structured(channel_groups(*sig), PruneAmount::fraction(0.5));
  mask_channels(channel_groups(*sig_masked), rs);
  mask_channels(channel_groups(*sig_producer_only), rs, false);
  const Tensor xs = rand_input({3, 4}).to(DType::f32);
  EXPECT_TRUE(allclose(sig->forward(xs), sig_masked->forward(xs), {1e-5, 1e-5}));
  EXPECT_FALSE(allclose(sig->forward(xs), sig_producer_only->forward(xs), {1e-5, 1e-5}));
}

TEST(StructuredPrune, MnistNetEqualsMaskedDenseModel) {
  manual_seed(13);
  auto net = std::make_shared<MnistNet>(/*dropout=*/false);
  auto masked = std::make_shared<MnistNet>(false);
  masked->load_state_dict(net->state_dict());
  const auto groups = channel_groups(*net);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[1].consumers[0].features_per_channel, 144);

  const StructuredPruneReport r = ln_structured(groups, PruneAmount::fraction(0.3));
  mask_channels(channel_groups(*masked), r, false);
  // round(0.3 * 32) = 10, round(0.3 * 64) = 19, round(0.3 * 128) = 38 pruned: 22, 45, 90 channels.
  EXPECT_EQ(net->conv1->options.out_channels(), 22);
  EXPECT_EQ(net->conv2->options.in_channels(), 22);
  EXPECT_EQ(net->conv2->options.out_channels(), 45);
  EXPECT_EQ(net->fc1->in_features, 45 * 144);
  EXPECT_EQ(net->fc1->out_features, 90);
  EXPECT_EQ(net->fc2->in_features, 90);
  // conv1 22*9+22, conv2 45*22*9+45, fc1 90*6480+90, fc2 10*90+10 (before: 1,199,882).
  EXPECT_EQ(net->num_parameters(), 220 + 8955 + 583290 + 910);
  EXPECT_EQ(r.parameters_before, 1199882);
  EXPECT_EQ(r.parameter_bytes_after, 4 * (220 + 8955 + 583290 + 910));
  EXPECT_EQ(r.groups[0].parameters_before, 320 + 18496);
  EXPECT_EQ(r.groups[0].parameters_after, 220 + (64 * 22 * 9 + 64));

  net->eval();
  masked->eval();
  const Tensor x = rand_input({2, 1, 28, 28}).to(DType::f32);
  NoGradGuard g;
  const Tensor y = net->forward(x);
  ASSERT_EQ(y.sizes(), (Shape{2, 10}));
  EXPECT_TRUE(allclose(y, masked->forward(x), {1e-5, 1e-5}));
}

TEST(StructuredPrune, ShrunkTensorsBelongToTheirModulesParameters) {
  auto net = make_mlp({8, 16, 4});
  ln_structured(channel_groups(*net), PruneAmount::count(6));  // 16 -> 10 features
  const memory::MemoryAttribution at = memory::memory_attribution(memory::cpu_allocator());
  auto bytes = [&](const std::string& module) {
    for (const memory::TagBytes& o : at.owners)
      if (o.module == module && o.phase == "parameters") return o.current_bytes;
    return int64_t{0};
  };
  auto block = [](int64_t n) { return (n + memory::kMinBlockSize - 1) / memory::kMinBlockSize * memory::kMinBlockSize; };
  EXPECT_EQ(bytes("Sequential.0"), block(10 * 8 * 4) + block(10 * 4));
  EXPECT_EQ(bytes("Sequential.2"), block(4 * 10 * 4) + block(4 * 4));  // the old blocks are gone
}

// ---- after pruning: training, state_dict -------------------------------------------------------------------------

TEST(StructuredPrune, TrainingStepAfterPruning) {
  manual_seed(14);
  auto net = conv_chain();
  const Tensor x = rand_input({4, 3, 6, 6}).to(DType::f32);
  const Tensor target = from_vector<int64_t>({0, 1, 2, 3}, {4});
  functional::cross_entropy(net->forward(x), target).backward();
  ln_structured(channel_groups(*net), PruneAmount::fraction(0.5));
  // The changed tensors' gradients are dropped; the last layer's bias is unchanged and keeps its gradient.
  for (const auto& [name, p] : net->named_parameters()) EXPECT_EQ(p.grad().defined(), name == "8.bias") << name;

  std::vector<std::vector<double>> before;
  for (const Tensor& p : net->parameters()) before.push_back(f64(p));
  optim::SGD opt(net->parameters(), optim::SGDOptions{0.1, 0.9});  // rebuilt after pruning
  opt.zero_grad();
  const Tensor loss = functional::cross_entropy(net->forward(x), target);
  EXPECT_TRUE(std::isfinite(loss.item_double()));
  loss.backward();
  opt.step();
  // SGD's first step with momentum: p - lr * grad (the buffer starts as the gradient).
  size_t i = 0;
  for (const auto& [name, p] : net->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    ASSERT_EQ(p.grad().sizes(), p.sizes()) << name;
    const std::vector<double> now = f64(p), grad = f64(p.grad()), old = before[i++];
    for (size_t k = 0; k < now.size(); ++k) EXPECT_NEAR(now[k], old[k] - 0.1 * grad[k], 1e-6) << name;
  }
  EXPECT_NE(f64(net->at<Linear>(6)->weight), before[6]);
}

TEST(StructuredPrune, StateDictLoadsIntoSmallerModel) {
  manual_seed(15);
  auto net = conv_chain();
  randomise(*net, 200);
  ln_structured(channel_groups(*net), PruneAmount::fraction(0.5));
  auto fresh = conv_chain(3, 4, 5);
  fresh->load_state_dict(net->state_dict());  // strict: same keys, same shapes
  net->eval();
  fresh->eval();
  const Tensor x = rand_input({2, 3, 6, 6}).to(DType::f32);
  NoGradGuard g;
  EXPECT_EQ(f64(fresh->forward(x)), f64(net->forward(x)));
}

// ---- errors leave the model unchanged ------------------------------------------------------------------------------

struct FakePacked : PackedWeight {
  std::string format() const override { return "fake"; }
  Tensor dense() const override { return Tensor(); }
  int64_t nbytes() const override { return 0; }
};

TEST(StructuredPrune, ErrorsLeaveModelUnchanged) {
  manual_seed(16);
  auto net = conv_chain();
  const auto before = snapshot(*net);
  const auto groups = channel_groups(*net);

  // A count above the channels of the last group (conv1's 6), after two groups it fits (10 and 8 channels).
  const std::vector<ChannelGroup> reordered{groups[2], groups[1], groups[0]};
  EXPECT_NE(error_message<ValueError>([&] { ln_structured(reordered, PruneAmount::count(7)); }).find("cannot prune"),
            std::string::npos);
  EXPECT_THROW(PruneAmount::fraction(1.5), ValueError);
  EXPECT_THROW(ln_structured(groups, PruneAmount::fraction(0.5), 0.0), ValueError);
  EXPECT_THROW(ln_structured(groups, PruneAmount::fraction(0.5), std::nan("")), ValueError);

  // A consumer Linear whose in_features is not channels x features_per_channel.
  auto bad_fpc = groups;
  bad_fpc[1].consumers[0].features_per_channel = 8;
  EXPECT_THROW(ln_structured(bad_fpc, PruneAmount::fraction(0.5)), ShapeError);
  // A BatchNorm2d as producer; a consumer of another channel count; the same producer twice.
  std::vector<ChannelGroup> bad = groups;
  bad.push_back(ChannelGroup{(*net)[1], {}});
  EXPECT_NE(error_message<ValueError>([&] { ln_structured(bad, PruneAmount::fraction(0.5)); }).find("BatchNorm2d"),
            std::string::npos);
  bad = groups;
  bad[2].consumers.push_back({(*net)[1], 1});  // bn(6) after the Linear(10)
  EXPECT_THROW(ln_structured(bad, PruneAmount::fraction(0.5)), ShapeError);
  bad = groups;
  bad.push_back(groups[0]);
  EXPECT_THROW(ln_structured(bad, PruneAmount::fraction(0.5)), ValueError);

  // A packed layer (producer or consumer).
  net->at<Linear>(8)->packed_weight = std::make_shared<FakePacked>();
  EXPECT_NE(error_message<ValueError>([&] { ln_structured(groups, PruneAmount::fraction(0.5)); }).find("packed"),
            std::string::npos);
  net->at<Linear>(8)->packed_weight.reset();
  expect_unchanged(*net, before);

  // A grouped Conv2d consumer.
  auto grouped = std::make_shared<Sequential>(std::make_shared<Conv2d>(2, 4, 1), std::make_shared<Conv2d>(4, 4, 1, 1,
                                                                                                           0, 1, 2));
  const auto grouped_before = snapshot(*grouped);
  EXPECT_NE(error_message<ValueError>([&] { ln_structured(channel_groups(*grouped), PruneAmount::count(1)); })
                .find("grouped"),
            std::string::npos);
  expect_unchanged(*grouped, grouped_before);
}

TEST(StructuredPrune, ChannelGroupsRejectsWhatItCannotFollow) {
  auto ln = std::make_shared<Sequential>(std::make_shared<Linear>(4, 6), std::make_shared<LayerNorm>(6),
                                         std::make_shared<Linear>(6, 2));
  EXPECT_NE(error_message<ValueError>([&] { channel_groups(*ln); }).find("LayerNorm"), std::string::npos);
  auto no_flatten = std::make_shared<Sequential>(std::make_shared<Conv2d>(1, 4, 3), std::make_shared<Linear>(4, 2));
  EXPECT_THROW(channel_groups(*no_flatten), ValueError);
  auto bad_size = std::make_shared<Sequential>(std::make_shared<Conv2d>(1, 4, 3), std::make_shared<Flatten>(),
                                               std::make_shared<Linear>(10, 2));
  EXPECT_THROW(channel_groups(*bad_size), ShapeError);
  // Pass-through layers and one layer: no groups to prune.
  auto single = std::make_shared<Sequential>(std::make_shared<ReLU>(), std::make_shared<Linear>(4, 2));
  EXPECT_TRUE(channel_groups(*single).empty());
}

}  // namespace
}  // namespace ember::nn
