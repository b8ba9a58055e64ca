// nanoGPT's GPT: parameter count by the architecture's formula, nanoGPT's state_dict names and tying, init scales,
// logits shape and errors, the causal property, loss at init ~ log(vocab), finite-difference gradients through a
// block, a few plain SGD steps that lower the loss, and sampling.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ember/nn/functional.h"
#include "ember/nn/transformer.h"
#include "tests/harness/grad_check.h"

namespace ember::testing {
namespace {

using nn::GPT;
using nn::GPTConfig;

GPTConfig tiny_config() {
  GPTConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}

class GPTTest : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    EMBER_REQUIRE_KERNEL(embedding_stub);
    EMBER_REQUIRE_KERNEL(embedding_backward_stub);
    EMBER_REQUIRE_KERNEL(layer_norm_stub);
    EMBER_REQUIRE_KERNEL(softmax_stub);
    EMBER_REQUIRE_KERNEL(bmm_stub);
    EMBER_REQUIRE_KERNEL(where_stub);
    EMBER_REQUIRE_KERNEL(reduce_stub);
    EMBER_REQUIRE_KERNEL(unary_backward_stub);
  }
  std::shared_ptr<GPT> make(const GPTConfig& c, uint64_t seed = 1) {
    manual_seed(seed);
    auto m = std::make_shared<GPT>(c);
    m->to(device());
    return m;
  }
  Tensor tokens(const std::vector<int64_t>& v, int64_t B, int64_t T) {
    return from_vector<int64_t>(v, {B, T}).to(device());
  }
};

// Parameters of nanoGPT's GPT, by the architecture: per block two LayerNorms (C weights, + C biases), c_attn
// C x 3C (+ 3C), attn c_proj C x C (+ C), c_fc C x 4C (+ 4C), mlp c_proj 4C x C (+ C); then wte V x C (shared
// with lm_head, counted once), wpe block x C, ln_f C (+ C).
int64_t expected_params(const GPTConfig& c, bool non_embedding) {
  const int64_t C = c.n_embd, b = c.bias ? 1 : 0;
  const int64_t ln = C + b * C;
  const int64_t block = 2 * ln + (C * 3 * C + b * 3 * C) + (C * C + b * C) + (C * 4 * C + b * 4 * C) +
                        (4 * C * C + b * C);
  int64_t n = c.n_layer * block + c.vocab_size * C + c.block_size * C + ln;
  if (non_embedding) n -= c.block_size * C;
  return n;
}

TEST_P(GPTTest, ParameterCountOfTheCharConfig) {
  const GPTConfig c;  // nanoGPT's char-level Shakespeare CPU config: 4 x 128, vocab 65, block 64, no bias
  auto m = make(c);
  // 4 * (12 * 128^2 + 2 * 128) + 65 * 128 + 128 = 795,904 without the position embedding: nanoGPT's "0.80M".
  EXPECT_EQ(expected_params(c, true), 795904);
  EXPECT_EQ(m->get_num_params(), 795904);
  EXPECT_EQ(m->get_num_params(false), 795904 + 64 * 128);
  EXPECT_EQ(m->num_parameters(), 804096);
  EXPECT_NEAR(std::round(m->get_num_params() / 1e4) / 100.0, 0.80, 1e-12);

  GPTConfig with_bias = tiny_config();
  with_bias.bias = true;
  EXPECT_EQ(make(with_bias)->get_num_params(), expected_params(with_bias, true));
  EXPECT_EQ(make(tiny_config())->get_num_params(), expected_params(tiny_config(), true));
}

TEST_P(GPTTest, StateDictNamesMatchNanoGPT) {
  GPTConfig c = tiny_config();
  c.bias = true;
  auto m = make(c);
  // nanoGPT's GPT(...).state_dict().keys() for n_layer = 2, bias = True (the flash-attention model: no mask buffer).
  std::vector<std::string> expected{"transformer.wte.weight", "transformer.wpe.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    for (const char* s : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                          "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                          "mlp.c_proj.weight", "mlp.c_proj.bias"})
      expected.push_back(p + s);
  }
  for (const char* s : {"transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"}) expected.push_back(s);
  std::vector<std::string> names;
  for (const auto& [name, t] : m->state_dict()) names.push_back(name);
  EXPECT_EQ(names, expected);

  // Tied: lm_head.weight is the embedding tensor itself, listed once among the parameters (as nanoGPT's
  // named_parameters()).
  EXPECT_TRUE(m->lm_head->weight.is_same(m->transformer->wte->weight));
  std::vector<std::string> params;
  for (const auto& [name, t] : m->named_parameters()) params.push_back(name);
  expected.pop_back();
  EXPECT_EQ(params, expected);

  // Without biases: nanoGPT's bias=False model has only the weights.
  std::vector<std::string> no_bias;
  for (const auto& [name, t] : make(tiny_config())->state_dict()) no_bias.push_back(name);
  EXPECT_EQ(no_bias.size(), 2u + 2u * 6u + 2u);
  for (const auto& n : no_bias) EXPECT_EQ(n.find(".bias"), std::string::npos) << n;
}

double sample_std(const Tensor& t) {
  const std::vector<double> v = t.to_vector<double>();
  double m = 0.0, s = 0.0;
  for (double x : v) m += x;
  m /= double(v.size());
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size() - 1));
}

TEST_P(GPTTest, InitialisationAsNanoGPT) {
  GPTConfig c;
  c.bias = true;
  auto m = make(c);
  auto& b0 = *m->transformer->h->at<nn::Block>(0);
  // N(0, 0.02) weights; every c_proj.weight N(0, 0.02 / sqrt(2 n_layer)); sample std of >= 16k draws within 3%.
  EXPECT_NEAR(sample_std(m->transformer->wte->weight), 0.02, 0.02 * 0.05);
  EXPECT_NEAR(sample_std(m->transformer->wpe->weight), 0.02, 0.02 * 0.05);
  EXPECT_NEAR(sample_std(b0.attn->c_attn->weight), 0.02, 0.02 * 0.03);
  EXPECT_NEAR(sample_std(b0.mlp->c_fc->weight), 0.02, 0.02 * 0.03);
  const double proj = 0.02 / std::sqrt(8.0);
  EXPECT_NEAR(sample_std(b0.attn->c_proj->weight), proj, proj * 0.03);
  EXPECT_NEAR(sample_std(b0.mlp->c_proj->weight), proj, proj * 0.03);
  EXPECT_TRUE(allclose(b0.attn->c_attn->bias, zeros({3 * 128}, DType::f64), {0, 0}));
  EXPECT_TRUE(allclose(b0.ln_1->weight, ones({128}, DType::f64), {0, 0}));
  EXPECT_TRUE(allclose(b0.ln_1->bias, zeros({128}, DType::f64), {0, 0}));
  // The same seed builds the same model.
  auto again = make(c);
  EXPECT_TRUE(allclose(again->transformer->h->at<nn::Block>(1)->mlp->c_proj->weight,
                       m->transformer->h->at<nn::Block>(1)->mlp->c_proj->weight.to(DType::f64), {0, 0}));
}

TEST_P(GPTTest, LogitsShapeAndErrors) {
  auto m = make(tiny_config());
  const Tensor idx = tokens({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 2, 5);
  const Tensor logits = m->forward(idx);
  EXPECT_EQ(logits.sizes(), (Shape{2, 5, 11}));
  EXPECT_EQ(logits.dtype(), DType::f32);
  EXPECT_EQ((*m)(tokens(std::vector<int64_t>(8, 0), 1, 8)).sizes(), (Shape{1, 8, 11}));
  EXPECT_THROW(m->forward(tokens(std::vector<int64_t>(9, 0), 1, 9)), ValueError);  // T > block_size
  EXPECT_THROW(m->forward(idx.to(DType::i32)), DTypeError);
  EXPECT_THROW(m->forward(tokens({1, 2, 3}, 1, 3).view({3})), ShapeError);
  GPTConfig bad = tiny_config();
  bad.n_head = 3;
  EXPECT_THROW(GPT{bad}, ValueError);
}

TEST_P(GPTTest, CausalLogitsIgnoreLaterTokens) {
  auto m = make(tiny_config());
  std::vector<int64_t> a{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3};
  const Tensor la = m->forward(tokens(a, 2, 8)).cpu();
  for (int64_t t = 0; t + 1 < 8; ++t) {
    std::vector<int64_t> b = a;
    b[t + 1] = (b[t + 1] + 1) % 11;  // sample 0's token t + 1 changes
    b[8 + t + 1] = (b[8 + t + 1] + 5) % 11;
    const Tensor lb = m->forward(tokens(b, 2, 8)).cpu();
    EXPECT_TRUE(allclose(lb.slice(1, 0, t + 1), la.slice(1, 0, t + 1), {0, 1e-6})) << "position " << t;
    // ... while the changed position's own logits do change.
    const Tensor diff = abs(lb.select(1, t + 1) - la.select(1, t + 1));
    EXPECT_GT(amax(diff).item_double(), 1e-4) << "position " << t + 1;
  }
}

TEST_P(GPTTest, LossAtInitIsAboutLogVocab) {
  auto m = make(GPTConfig{});
  std::vector<int64_t> v(2 * 32), t(2 * 32);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = int64_t(i * 7 % 65);
    t[i] = int64_t((i * 7 + 3) % 65);
  }
  t[5] = -1;  // nanoGPT's ignore_index
  const nn::GPTOutput out = m->forward(tokens(v, 2, 32), tokens(t, 2, 32));
  ASSERT_TRUE(out.loss.defined());
  // Hand reference from the logits: mean over non-ignored positions of logsumexp - logit[target].
  const std::vector<double> l = out.logits.to_vector<double>();
  double total = 0.0;
  int count = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] < 0) continue;
    double z = 0.0;
    for (int c = 0; c < 65; ++c) z += std::exp(l[i * 65 + c]);
    total += std::log(z) - l[i * 65 + t[i]];
    ++count;
  }
  EXPECT_NEAR(out.loss.item_double(), total / count, 1e-5);
  // Small init: logits near 0, so the loss starts near log(65) = 4.17.
  EXPECT_NEAR(out.loss.item_double(), std::log(65.0), 0.1);
}

TEST_P(GPTTest, BlockInputGradientsMatchFiniteDifferences) {
  manual_seed(3);
  GPTConfig c = tiny_config();
  c.bias = true;
  auto block = std::make_shared<nn::Block>(c);
  block->to(device(), DType::f64);
  GradCase g{"GPT block", {rand_input({2, 5, 16})}, [block](const Inputs& in) { return block->forward(in[0]); }};
  g.dtypes = {};  // the block's parameters are f64
  check_grad(g, device());
}

TEST_P(GPTTest, TiedWeightGetsBothGradients) {
  auto m = make(tiny_config());
  const Tensor idx = tokens({1, 2, 3, 4}, 1, 4);
  m->forward(idx, tokens({2, 3, 4, 5}, 1, 4)).loss.backward();
  const Tensor g = m->transformer->wte->weight.grad();
  ASSERT_TRUE(g.defined());
  // Rows of tokens that never appear as inputs still get the lm_head part of the gradient.
  const Tensor row = g.select(0, 9).cpu();
  EXPECT_GT(amax(abs(row)).item_double(), 0.0);
}

TEST_P(GPTTest, SgdStepsLowerTheLoss) {
  auto m = make(tiny_config(), 5);
  // A tiny repeated sequence: 0 1 2 3 0 1 2 3 ..., targets the next token.
  std::vector<int64_t> x(16), y(16);
  for (int i = 0; i < 16; ++i) {
    x[i] = i % 4;
    y[i] = (i + 1) % 4;
  }
  const Tensor idx = tokens(x, 2, 8), targets = tokens(y, 2, 8);
  const double lr = 0.3;
  double first = 0.0, last = 0.0;
  for (int step = 0; step < 30; ++step) {
    m->zero_grad();
    const Tensor loss = m->forward(idx, targets).loss;
    loss.backward();
    last = loss.item_double();
    if (step == 0) first = last;
    NoGradGuard no_grad;
    for (const Tensor& p : m->parameters()) {
      Tensor q = p;
      q.copy_(p - p.grad() * lr);
    }
  }
  EXPECT_NEAR(first, std::log(11.0), 0.1);
  EXPECT_LT(last, 0.25 * first) << "first " << first << " last " << last;
}

TEST_P(GPTTest, DropoutOnlyWhileTraining) {
  EMBER_REQUIRE_KERNEL(dropout_stub);
  GPTConfig c = tiny_config();
  c.dropout = 0.2;
  auto m = make(c);
  const Tensor idx = tokens({1, 2, 3, 4, 5, 6}, 1, 6);
  const Tensor a = m->forward(idx), b = m->forward(idx);
  EXPECT_FALSE(allclose(a, b.to(DType::f64), {0, 1e-6}));
  m->eval();
  EXPECT_TRUE(allclose(m->forward(idx), m->forward(idx).to(DType::f64), {0, 0}));
}

TEST_P(GPTTest, Generate) {
  auto m = make(tiny_config());
  m->eval();
  const Tensor idx = tokens({1, 2, 3, 4, 5, 6}, 2, 3);
  const Tensor out = m->generate(idx, 10, 1.0, std::nullopt, 42);
  ASSERT_EQ(out.sizes(), (Shape{2, 13}));  // beyond block_size: the context is cropped
  const std::vector<int64_t> v = out.cpu().to_vector<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(v.begin(), v.begin() + 3), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(std::vector<int64_t>(v.begin() + 13, v.begin() + 16), (std::vector<int64_t>{4, 5, 6}));
  for (int64_t t : v) EXPECT_TRUE(t >= 0 && t < 11) << t;
  EXPECT_EQ(m->generate(idx, 10, 1.0, std::nullopt, 42).cpu().to_vector<int64_t>(), v);
  // top_k = 1 is greedy decoding: each new token is the argmax of the logits at the last position.
  const Tensor greedy = m->generate(idx, 3, 1.0, 1, 7);
  for (int64_t t = 3; t < 6; ++t) {
    const Tensor logits = m->forward(greedy.slice(1, 0, t));
    const Tensor best = argmax(logits.select(1, t - 1), -1).cpu();
    EXPECT_EQ(best.to_vector<int64_t>(), greedy.select(1, t).cpu().to_vector<int64_t>()) << t;
  }
  EXPECT_THROW(m->generate(idx, 1, 0.0), ValueError);
  EXPECT_THROW(m->generate(idx.to(DType::i32), 1), DTypeError);
  EXPECT_THROW(m->generate(idx.slice(1, 0, 0), 1), ShapeError) << "no context";
  EXPECT_EQ(m->generate(idx.slice(0, 0, 0), 4).sizes(), (Shape{0, 7})) << "an empty batch";
}

// generate samples in eval mode whatever the model's mode: with dropout in training mode, the same seed gives the
// same text as in eval mode, the default generator does not move, and every module gets its own mode back.
TEST_P(GPTTest, GenerateRunsInEvalModeAndGivesTheModesBack) {
  GPTConfig c = tiny_config();
  c.dropout = 0.3;
  auto m = make(c);
  const Tensor idx = tokens({1, 2, 3, 4, 5, 6}, 2, 3);
  (*m->transformer->h)[0]->eval();  // a mixed tree: one block already in eval mode
  const PhiloxState before = default_generator().state();
  const std::vector<int64_t> in_training = m->generate(idx, 6, 1.0, std::nullopt, 5).cpu().to_vector<int64_t>();
  EXPECT_EQ(default_generator().state().offset, before.offset);
  EXPECT_TRUE(m->is_training());
  EXPECT_FALSE((*m->transformer->h)[0]->is_training());
  EXPECT_TRUE((*m->transformer->h)[1]->is_training());
  m->eval();
  EXPECT_EQ(m->generate(idx, 6, 1.0, std::nullopt, 5).cpu().to_vector<int64_t>(), in_training);
}

EMBER_INSTANTIATE_DEVICE_TESTS(GPTTest);

}  // namespace
}  // namespace ember::testing
