// Module tests: registration order and dotted names, name errors, train/eval recursion, parameter counts, state_dict
// round trips and key/shape errors, in-place conversion with to() keeping member handles, zero_grad, describe().
// References are hand-computed counts, names and values.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "ember/ember.h"
#include "ember/nn/init.h"
#include "ember/nn/layers.h"
#include "ember/nn/module.h"
#include "tests/harness/op_harness.h"

namespace ember::nn {
namespace {

using ::ember::testing::allclose;

// A small conv block: conv (3->4, 3x3) then bn(4).
struct Block : Module {
  Block() : Module("Block") {
    conv = register_module("conv", std::make_shared<Conv2d>(3, 4, 3));
    bn = register_module("bn", std::make_shared<BatchNorm2d>(4));
  }
  Tensor forward(const Tensor& x) override { return bn->forward(conv->forward(x)); }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
};

// fc1, a nested block, a plain buffer, fc2 — registered in that order.
struct Net : Module {
  Net() : Module("Net") {
    fc1 = register_module("fc1", std::make_shared<Linear>(5, 3));
    block = register_module("block", std::make_shared<Block>());
    scale = register_buffer("scale", ones({2}));
    fc2 = register_module("fc2", std::make_shared<Linear>(3, 2, /*bias=*/false));
  }
  Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))); }
  std::shared_ptr<Linear> fc1, fc2;
  std::shared_ptr<Block> block;
  Tensor scale;
};

std::vector<std::string> keys(const NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [k, t] : named) out.push_back(k);
  return out;
}

using ember::testing::error_message;

TEST(Module, RegistrationOrderAndDottedNames) {
  auto net = std::make_shared<Net>();
  EXPECT_EQ(keys(net->named_parameters()),
            (std::vector<std::string>{"fc1.weight", "fc1.bias", "block.conv.weight", "block.conv.bias",
                                      "block.bn.weight", "block.bn.bias", "fc2.weight"}));
  EXPECT_EQ(keys(net->named_parameters(/*recurse=*/false)), std::vector<std::string>{});
  EXPECT_EQ(keys(net->named_buffers()),
            (std::vector<std::string>{"scale", "block.bn.running_mean", "block.bn.running_var",
                                      "block.bn.num_batches_tracked"}));
  // PyTorch's state_dict order: per module its parameters, then its buffers, then its children.
  EXPECT_EQ(keys(net->state_dict()),
            (std::vector<std::string>{"scale", "fc1.weight", "fc1.bias", "block.conv.weight", "block.conv.bias",
                                      "block.bn.weight", "block.bn.bias", "block.bn.running_mean",
                                      "block.bn.running_var", "block.bn.num_batches_tracked", "fc2.weight"}));
  std::vector<std::string> modules;
  for (const auto& [name, m] : net->named_modules()) modules.push_back(name + ":" + m->type_name());
  EXPECT_EQ(modules, (std::vector<std::string>{":Net", "fc1:Linear", "block:Block", "block.conv:Conv2d",
                                               "block.bn:BatchNorm2d", "fc2:Linear"}));
  std::vector<std::string> children;
  for (const auto& [name, m] : net->named_children()) children.push_back(name);
  EXPECT_EQ(children, (std::vector<std::string>{"fc1", "block", "fc2"}));
  EXPECT_EQ(net->children().size(), 3u);
  EXPECT_EQ(net->parameters().size(), 7u);
  // The handles layers keep are the registered ones.
  EXPECT_TRUE(net->named_parameters()[0].second.is_same(net->fc1->weight));
  EXPECT_TRUE(net->named_buffers()[1].second.is_same(net->block->bn->running_mean));
  // Parameters are leaves that require grad; buffers do not.
  for (const Tensor& p : net->parameters()) EXPECT_TRUE(p.requires_grad() && p.is_leaf());
  for (const auto& [name, b] : net->named_buffers()) EXPECT_FALSE(b.requires_grad()) << name;
}

TEST(Module, NamedModulesOfAStackModule) {
  Linear lin(2, 2);  // not owned by a shared_ptr
  auto mods = lin.named_modules("root");
  ASSERT_EQ(mods.size(), 1u);
  EXPECT_EQ(mods[0].first, "root");
  EXPECT_EQ(mods[0].second.get(), &lin);
}

TEST(Module, RegistrationNameErrors) {
  Module m("Custom");
  m.register_parameter("w", zeros({2}));
  EXPECT_THROW(m.register_parameter("w", zeros({2})), ValueError);
  EXPECT_THROW(m.register_buffer("w", zeros({2})), ValueError);
  EXPECT_THROW(m.register_module("w", std::make_shared<ReLU>()), ValueError);
  EXPECT_THROW(m.register_parameter("", zeros({2})), ValueError);
  EXPECT_THROW(m.register_buffer("a.b", zeros({2})), ValueError);
  EXPECT_THROW(m.register_module("x.y", std::make_shared<ReLU>()), ValueError);
  EXPECT_THROW(m.register_module("null", std::shared_ptr<Module>()), ValueError);
  const std::string msg = error_message<ValueError>([&] { m.register_buffer("w", zeros({1})); });
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  // requires_grad = false registers a frozen parameter.
  Tensor frozen = m.register_parameter("frozen", ones({3}), /*requires_grad=*/false);
  EXPECT_FALSE(frozen.requires_grad());
  EXPECT_EQ(m.num_parameters(), 5);
  EXPECT_EQ(m.num_parameters(/*trainable_only=*/true), 2);
}

TEST(Module, DefaultForwardThrows) {
  Module m("Custom");
  const std::string msg = error_message<ValueError>([&] { m.forward(zeros({1})); });
  EXPECT_EQ(msg, "Custom has no single-input forward");
  ModuleList list(std::make_shared<ReLU>());
  EXPECT_THROW(list(zeros({1})), ValueError);
}

TEST(Module, TrainEvalRecurse) {
  auto net = std::make_shared<Net>();
  for (const auto& [name, m] : net->named_modules()) EXPECT_TRUE(m->is_training()) << name;
  net->eval();
  for (const auto& [name, m] : net->named_modules()) EXPECT_FALSE(m->is_training()) << name;
  net->block->train();
  EXPECT_FALSE(net->is_training());
  EXPECT_TRUE(net->block->bn->is_training());
  EXPECT_FALSE(net->fc1->is_training());
  net->train();
  for (const auto& [name, m] : net->named_modules()) EXPECT_TRUE(m->is_training()) << name;
}

TEST(Module, NumParameters) {
  Linear fc(784, 128);
  EXPECT_EQ(fc.num_parameters(), 784 * 128 + 128);
  EXPECT_EQ(fc.num_parameters(), 100480);
  EXPECT_EQ(fc.parameter_bytes(), 100480 * 4);
  fc.bias.requires_grad_(false);
  EXPECT_EQ(fc.num_parameters(/*trainable_only=*/true), 100352);
  // Net: fc1 5*3+3, conv 4*3*3*3+4, bn 4+4, fc2 3*2.
  Net net;
  EXPECT_EQ(net.num_parameters(), 18 + 112 + 8 + 6);
}

TEST(Module, SharedParameterListedOnce) {
  auto a = std::make_shared<Linear>(3, 3);
  Module parent("Parent");
  parent.register_module("a", a);
  auto holder = std::make_shared<Module>("Holder");
  holder->register_parameter("tied", a->weight);
  parent.register_module("b", holder);
  EXPECT_EQ(keys(parent.named_parameters()), (std::vector<std::string>{"a.weight", "a.bias"}));
  EXPECT_EQ(parent.num_parameters(), 12);
  // state_dict keeps every key (PyTorch does too).
  EXPECT_EQ(keys(parent.state_dict()), (std::vector<std::string>{"a.weight", "a.bias", "b.tied"}));
}

TEST(Module, StateDictRoundTripIntoFreshModel) {
  manual_seed(1);
  auto src = std::make_shared<Net>();
  // Make the buffers non-default so that they are visibly carried.
  src->train();
  (void)src->block->forward(randn({2, 3, 5, 5}));
  manual_seed(2);
  auto dst = std::make_shared<Net>();
  const NamedTensors state = src->state_dict();
  // state_dict tensors alias the module's storage and carry no autograd.
  EXPECT_EQ(state[1].second.raw_data(), src->fc1->weight.raw_data());
  EXPECT_FALSE(state[1].second.requires_grad());
  EXPECT_NE(dst->fc1->weight.to_vector<float>(), src->fc1->weight.to_vector<float>());

  const Tensor dst_weight_before = dst->fc1->weight;
  dst->load_state_dict(state);
  const NamedTensors loaded = dst->state_dict();
  ASSERT_EQ(keys(loaded), keys(state));
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(loaded[i].second.dtype(), state[i].second.dtype()) << state[i].first;
    EXPECT_EQ(loaded[i].second.to(DType::f64).to_vector<double>(), state[i].second.to(DType::f64).to_vector<double>())
        << state[i].first;
    EXPECT_NE(loaded[i].second.raw_data(), state[i].second.raw_data()) << state[i].first;  // independent storage
  }
  EXPECT_EQ(dst->block->bn->num_batches_tracked.item<int64_t>(), 1);
  // The member handle is unchanged and still the parameter.
  EXPECT_TRUE(dst->fc1->weight.is_same(dst_weight_before));
  EXPECT_TRUE(dst->fc1->weight.requires_grad());

  // Writing into the source afterwards leaves the loaded copy alone.
  const std::vector<float> loaded_w = dst->fc1->weight.to_vector<float>();
  init::constant_(src->fc1->weight, 7.0);
  EXPECT_EQ(dst->fc1->weight.to_vector<float>(), loaded_w);
}

TEST(Module, LoadStateDictCastsDtype) {
  Linear a(2, 2), b(2, 2);
  NamedTensors state = a.state_dict();
  for (auto& [k, t] : state) t = t.to(DType::f64);
  b.load_state_dict(state);
  EXPECT_EQ(b.weight.dtype(), DType::f32);
  EXPECT_EQ(b.weight.to_vector<float>(), a.weight.to_vector<float>());
}

TEST(Module, StrictAndNonStrictKeys) {
  Linear a(3, 2);
  // Missing key.
  NamedTensors only_weight{{"weight", ones({2, 3})}};
  std::string msg = error_message<ValueError>([&] { a.load_state_dict(only_weight); });
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'bias'"), std::string::npos) << msg;
  // A failed strict load changes nothing.
  EXPECT_NE(a.weight.to_vector<float>(), std::vector<float>(6, 1.0f));
  // Unexpected key.
  NamedTensors extra = a.state_dict();
  extra.emplace_back("running_mean", zeros({2}));
  msg = error_message<ValueError>([&] { a.load_state_dict(extra); });
  EXPECT_NE(msg.find("unexpected"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'running_mean'"), std::string::npos) << msg;
  // Non-strict: loads what matches, ignores the rest.
  NamedTensors partial{{"weight", ones({2, 3})}, {"other", zeros({1})}};
  a.load_state_dict(partial, /*strict=*/false);
  EXPECT_EQ(a.weight.to_vector<float>(), std::vector<float>(6, 1.0f));
  // Duplicate keys are refused.
  NamedTensors dup{{"weight", ones({2, 3})}, {"weight", ones({2, 3})}, {"bias", ones({2})}};
  EXPECT_THROW(a.load_state_dict(dup), ValueError);
}

TEST(Module, ShapeMismatchNamesKeyAndShapes) {
  Linear a(3, 2);
  NamedTensors bad{{"weight", ones({3, 4})}, {"bias", ones({2})}};
  const std::string msg = error_message<ShapeError>([&] { a.load_state_dict(bad); });
  EXPECT_NE(msg.find("'weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  // Non-strict mode still refuses a size mismatch (PyTorch too).
  EXPECT_THROW(a.load_state_dict(bad, /*strict=*/false), ShapeError);
}

// Every check runs before the first copy: a meta tensor (no data) in the last entry leaves the first one unloaded.
TEST(Module, MetaTensorInTheStateDictChangesNothing) {
  Linear a(3, 2);
  const std::vector<float> weight = a.weight.to_vector<float>();
  NamedTensors bad{{"weight", full({2, 3}, 7.0)}, {"bias", empty({2}, TensorOptions(DType::f32, Device::meta()))}};
  const std::string msg = error_message<DeviceError>([&] { a.load_state_dict(bad); });
  EXPECT_NE(msg.find("'bias'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("meta"), std::string::npos) << msg;
  EXPECT_EQ(a.weight.to_vector<float>(), weight);
}

TEST(Module, ToDtypeKeepsHandlesAndRequiresGrad) {
  auto net = std::make_shared<Net>();
  const Tensor w = net->fc1->weight;  // a second handle to the same parameter
  const std::vector<float> before = w.to_vector<float>();
  // Give the weight a gradient: to() drops it.
  sum(net->forward(ones({1, 5}))).backward();
  ASSERT_TRUE(w.grad().defined());

  net->to(DType::f64);
  EXPECT_EQ(w.dtype(), DType::f64);
  EXPECT_EQ(net->fc1->weight.dtype(), DType::f64);
  EXPECT_TRUE(w.is_same(net->fc1->weight));
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(w.is_leaf());
  EXPECT_FALSE(w.grad().defined());
  const std::vector<double> after = w.to_vector<double>();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i], static_cast<double>(before[i]));
  // Floating buffers convert, integer ones stay.
  EXPECT_EQ(net->block->bn->running_var.dtype(), DType::f64);
  EXPECT_EQ(net->scale.dtype(), DType::f64);
  EXPECT_EQ(net->block->bn->num_batches_tracked.dtype(), DType::i64);
  // Every parameter converted, and the model runs in f64 with gradients of the new dtype.
  for (const Tensor& p : net->parameters()) EXPECT_EQ(p.dtype(), DType::f64);
  sum(net->forward(ones({1, 5}, DType::f64))).backward();
  EXPECT_EQ(net->fc1->weight.grad().dtype(), DType::f64);
  // The device form (cpu -> cpu) and the combined form leave values alone.
  net->to(Device::cpu());
  net->to(Device::cpu(), DType::f32);
  EXPECT_EQ(w.dtype(), DType::f32);
  EXPECT_EQ(w.to_vector<float>(), before);
  EXPECT_THROW(net->to(DType::i64), DTypeError);
}

TEST(Module, NonPersistentBuffer) {
  Module m("Custom");
  Tensor mask = m.register_buffer("mask", ones({2, 2}), /*persistent=*/false);
  m.register_buffer("kept", zeros({1}));
  EXPECT_EQ(keys(m.named_buffers()), (std::vector<std::string>{"mask", "kept"}));
  EXPECT_EQ(keys(m.state_dict()), std::vector<std::string>{"kept"});
  m.load_state_dict({{"kept", ones({1})}});  // strict: "mask" is not expected
  m.to(DType::f64);
  EXPECT_EQ(mask.dtype(), DType::f64);
}

TEST(Module, SetData) {
  const Tensor dst = zeros({2, 3});
  dst.requires_grad_();
  dst.set_grad(ones({2, 3}));
  const Tensor src = arange(0, 4, 1, DType::f64).view({2, 2}).t();
  set_data(dst, src);
  EXPECT_EQ(dst.sizes(), (Shape{2, 2}));
  EXPECT_EQ(dst.strides(), (Shape{1, 2}));
  EXPECT_EQ(dst.dtype(), DType::f64);
  EXPECT_EQ(dst.to_vector<double>(), (std::vector<double>{0, 2, 1, 3}));
  EXPECT_TRUE(dst.requires_grad());
  EXPECT_FALSE(dst.grad().defined());
  EXPECT_THROW(set_data(dst, zeros({1}, DType::i64)), DTypeError);  // a grad-requiring tensor stays floating
}

TEST(Module, ZeroGradBothModes) {
  Linear fc(3, 2);
  sum(fc(ones({4, 3}))).backward();
  ASSERT_TRUE(fc.weight.grad().defined());
  const Tensor g = fc.weight.grad();
  // d sum(x W^T + b) / dW[o][i] = sum_n x[n][i] = 4; d / db = 4.
  EXPECT_EQ(g.to_vector<float>(), std::vector<float>(6, 4.0f));
  EXPECT_EQ(fc.bias.grad().to_vector<float>(), std::vector<float>(2, 4.0f));
  fc.zero_grad(/*set_to_none=*/false);
  EXPECT_TRUE(fc.weight.grad().defined());
  EXPECT_TRUE(fc.weight.grad().is_same(g));  // zeroed in place
  EXPECT_EQ(g.to_vector<float>(), std::vector<float>(6, 0.0f));
  fc.zero_grad();
  EXPECT_FALSE(fc.weight.grad().defined());
  EXPECT_FALSE(fc.bias.grad().defined());
  fc.zero_grad();  // no grads: nothing to do
}

TEST(Module, Describe) {
  auto seq = std::make_shared<Sequential>(std::make_shared<Linear>(784, 128), std::make_shared<ReLU>(),
                                          std::make_shared<Linear>(128, 10));
  const std::string d = seq->describe();
  EXPECT_NE(d.find("Sequential()  # 101,770 parameters"), std::string::npos) << d;
  EXPECT_NE(d.find("  (0): Linear(in_features=784, out_features=128, bias=True)  # 100,480 parameters"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("  (1): ReLU()\n"), std::string::npos) << d;
  EXPECT_EQ(std::count(d.begin(), d.end(), '\n'), 4);
}

}  // namespace
}  // namespace ember::nn
