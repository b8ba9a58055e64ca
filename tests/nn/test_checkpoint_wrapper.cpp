// CheckpointWrapper and nn::checkpoint_sequential: parameter and state_dict names under "module.", a state_dict
// round trip, and outputs and gradients bit-identical to the bare modules (dropout in train mode included).
// The reference is the same modules run without checkpointing; their backward reads the tensors saved by the forward,
// the wrapped run's backward reads recomputed ones.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "ember/ember.h"
#include "tests/harness/op_harness.h"

namespace ember::nn {
namespace {

using ::ember::testing::error_message;
using ::ember::testing::rand_input;

::testing::AssertionResult bit_identical(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return ::testing::AssertionFailure() << "undefined tensor";
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype())
    return ::testing::AssertionFailure() << a.description() << " vs " << b.description();
  const std::vector<float> va = a.detach().to_vector<float>();
  const std::vector<float> vb = b.detach().to_vector<float>();
  if (std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)) == 0) return ::testing::AssertionSuccess();
  for (size_t i = 0; i < va.size(); ++i)
    if (std::memcmp(&va[i], &vb[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << va[i] << " vs " << vb[i];
  return ::testing::AssertionFailure();
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::vector<std::string> keys(const NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [k, t] : named) out.push_back(k);
  return out;
}

std::shared_ptr<Sequential> make_mlp() {
  return std::make_shared<Sequential>(std::make_shared<Linear>(12, 32), std::make_shared<GELU>(),
                                      std::make_shared<Dropout>(0.25), std::make_shared<Linear>(32, 12),
                                      std::make_shared<ReLU>(), std::make_shared<Linear>(12, 12));
}

// Runs sum(forward(x) * v) backward with the generator at `seed`; returns the output and the gradients of x and of
// `params` (cleared first).
struct RunResult {
  Tensor y;
  std::vector<Tensor> grads;
};
RunResult run(const std::function<Tensor(const Tensor&)>& forward, const Tensor& x, const Tensor& v,
        const std::vector<Tensor>& params, uint64_t seed) {
  x.set_grad(Tensor());
  for (const Tensor& p : params) p.set_grad(Tensor());
  manual_seed(seed);
  RunResult r;
  r.y = forward(x);
  sum(r.y * v).backward();
  r.grads.push_back(x.grad());
  for (const Tensor& p : params) r.grads.push_back(p.grad());
  return r;
}

void expect_same(const RunResult& got, const RunResult& want) {
  EXPECT_TRUE(bit_identical(got.y, want.y)) << "output";
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i) EXPECT_TRUE(bit_identical(got.grads[i], want.grads[i])) << i;
}

TEST(CheckpointWrapper, ParameterAndStateDictNames) {
  auto wrapper = std::make_shared<CheckpointWrapper>(std::make_shared<Linear>(4, 3));
  EXPECT_EQ(keys(wrapper->named_parameters()), (std::vector<std::string>{"module.weight", "module.bias"}));
  EXPECT_EQ(keys(wrapper->state_dict()), (std::vector<std::string>{"module.weight", "module.bias"}));
  EXPECT_EQ(wrapper->num_parameters(), 4 * 3 + 3);
  EXPECT_EQ(wrapper->type_name(), "CheckpointWrapper");
  // Nested in a container: the wrapper's own name comes first.
  Sequential seq(std::make_shared<CheckpointWrapper>(std::make_shared<Linear>(4, 4, /*bias=*/false)));
  EXPECT_EQ(keys(seq.named_parameters()), std::vector<std::string>{"0.module.weight"});
  EXPECT_TRUE(contains(
      error_message<ValueError>([] { CheckpointWrapper w(nullptr); }), "null"));
}

TEST(CheckpointWrapper, StateDictRoundTrip) {
  manual_seed(3);
  auto a = std::make_shared<CheckpointWrapper>(make_mlp());
  manual_seed(4);
  auto b = std::make_shared<CheckpointWrapper>(make_mlp());
  b->load_state_dict(a->state_dict());
  const NamedTensors sa = a->state_dict(), sb = b->state_dict();
  ASSERT_EQ(keys(sa), keys(sb));
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_TRUE(bit_identical(sa[i].second, sb[i].second)) << sa[i].first;
  // Through safetensors bytes, into a wrapper, and the bare module's keys are the wrapper's without "module.".
  auto c = std::make_shared<CheckpointWrapper>(make_mlp());
  c->load_state_dict(deserialize_safetensors(serialize_safetensors(a->state_dict())));
  auto bare = make_mlp();
  NamedTensors stripped;
  for (const auto& [k, t] : a->state_dict()) {
    ASSERT_EQ(k.rfind("module.", 0), 0u) << k;
    stripped.emplace_back(k.substr(7), t);
  }
  bare->load_state_dict(stripped);
  a->eval();
  c->eval();
  bare->eval();
  const Tensor x = rand_input({5, 12}).to(DType::f32);
  const Tensor ya = a->forward(x);
  EXPECT_TRUE(bit_identical(c->forward(x), ya));
  EXPECT_TRUE(bit_identical(bare->forward(x), ya));
}

TEST(CheckpointWrapper, GradientsIdenticalToBareModule) {
  manual_seed(11);
  auto mlp = make_mlp();
  auto wrapper = std::make_shared<CheckpointWrapper>(mlp);
  wrapper->train();
  EXPECT_TRUE(mlp->is_training());
  Tensor x = rand_input({6, 12}).to(DType::f32);
  x.requires_grad_();
  const Tensor v = rand_input({6, 12}).to(DType::f32);
  const std::vector<Tensor> params = mlp->parameters();
  const RunResult bare = run([&](const Tensor& h) { return mlp->forward(h); }, x, v, params, 77);
  autograd::reset_checkpoint_stats();
  const RunResult wrapped = run([&](const Tensor& h) { return wrapper->forward(h); }, x, v, params, 77);
  expect_same(wrapped, bare);
  EXPECT_EQ(autograd::checkpoint_stats().regions, 1);
  EXPECT_EQ(autograd::checkpoint_stats().recomputations, 1);
  // The dropout mask differs for another seed (the comparison above is not trivially equal).
  const RunResult other = run([&](const Tensor& h) { return mlp->forward(h); }, x, v, params, 78);
  EXPECT_FALSE(bit_identical(other.y, bare.y));
}

TEST(CheckpointWrapper, WrappedBlocksInAModel) {
  // A model whose hidden blocks are wrapped one by one, against the same blocks unwrapped.
  manual_seed(5);
  std::vector<std::shared_ptr<Module>> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(make_mlp());
  Sequential wrapped_model, bare_model;
  for (const auto& b : blocks) {
    wrapped_model.push_back(std::make_shared<CheckpointWrapper>(b));
    bare_model.push_back(b);
  }
  Tensor x = rand_input({4, 12}).to(DType::f32);
  x.requires_grad_();
  const Tensor v = rand_input({4, 12}).to(DType::f32);
  const std::vector<Tensor> params = bare_model.parameters();
  EXPECT_EQ(wrapped_model.parameters().size(), params.size());
  const RunResult bare = run([&](const Tensor& h) { return bare_model.forward(h); }, x, v, params, 21);
  const RunResult wrapped = run([&](const Tensor& h) { return wrapped_model.forward(h); }, x, v, params, 21);
  expect_same(wrapped, bare);
}

TEST(CheckpointSequential, ModulesAndSequentialMatchPlainForward) {
  manual_seed(9);
  auto seq = make_mlp();
  Tensor x = rand_input({7, 12}).to(DType::f32);
  x.requires_grad_();
  const Tensor v = rand_input({7, 12}).to(DType::f32);
  const std::vector<Tensor> params = seq->parameters();
  const RunResult bare = run(
      [&](const Tensor& h) {
        Tensor out = h;
        for (const auto& m : *seq) out = m->forward(out);
        return out;
      },
      x, v, params, 31);
  for (int64_t segments = 1; segments <= 6; ++segments) {
    SCOPED_TRACE(segments);
    autograd::reset_checkpoint_stats();
    expect_same(run([&](const Tensor& h) { return checkpoint_sequential(*seq, segments, h); }, x, v, params, 31),
                bare);
    EXPECT_EQ(autograd::checkpoint_stats().recomputations, segments - 1);
    const std::vector<std::shared_ptr<Module>> list(seq->begin(), seq->end());
    expect_same(run([&](const Tensor& h) { return checkpoint_sequential(list, segments, h); }, x, v, params, 31),
                bare);
  }
  EXPECT_TRUE(contains(
      error_message<ValueError>([&] { checkpoint_sequential(*seq, 7, x); }), "segments"));
}

TEST(CheckpointWrapper, EvalAndNoGradRunThePlainForward) {
  manual_seed(2);
  auto mlp = make_mlp();
  auto wrapper = std::make_shared<CheckpointWrapper>(mlp);
  wrapper->eval();
  EXPECT_FALSE(mlp->is_training());
  const Tensor x = rand_input({3, 12}).to(DType::f32);
  autograd::reset_checkpoint_stats();
  Tensor y;
  {
    NoGradGuard no_grad;
    y = wrapper->forward(x);
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(autograd::checkpoint_stats().regions, 0);
  EXPECT_TRUE(bit_identical(y, mlp->forward(x).detach()));
}

}  // namespace
}  // namespace ember::nn
