// Regressions of the pruning / quantization APIs: all-or-nothing failures (structured pruning of a layer with a live
// unstructured mask, sparsify_linears and quantize_model meeting a bad layer midway), int8 unpacking after to(f64),
// f64 weights beyond f32's range, and measure_inference restoring the train mode when the forward throws.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ember/ember.h"
#include "ember/kernels/ops_quant.h"
#include "ember/nn/compression_report.h"
#include "ember/nn/layers.h"
#include "ember/nn/prune.h"
#include "ember/nn/quantize.h"
#include "ember/nn/sparse_linear.h"
#include "ember/nn/structured_prune.h"
#include "tests/harness/op_harness.h"

namespace ember::nn {
namespace {

using ::ember::testing::error_message;
using ::ember::testing::rand_input_seeded;

std::shared_ptr<Sequential> mlp() {
  return std::make_shared<Sequential>(std::make_shared<Linear>(4, 6), std::make_shared<ReLU>(),
                                      std::make_shared<Linear>(6, 3));
}

TEST(CompressRegressions, StructuredPruningRejectsLayersWithLiveMasks) {
  // Shrinking a weight would leave its "weight_mask" (and the gradient hook holding it) at the old size.
  for (size_t which : {size_t{0}, size_t{2}}) {  // the producer, then the consumer
    auto net = mlp();
    auto layer = net->at<Linear>(which);
    l1_unstructured(*layer, "weight", PruneAmount::fraction(0.5));
    const Shape w0 = net->at<Linear>(0)->weight.sizes(), w2 = net->at<Linear>(2)->weight.sizes();
    const std::string msg =
        error_message<ValueError>([&] { ln_structured(channel_groups(*net), PruneAmount::fraction(0.5)); });
    EXPECT_NE(msg.find("remove"), std::string::npos) << msg;
    EXPECT_EQ(net->at<Linear>(0)->weight.sizes(), w0);
    EXPECT_EQ(net->at<Linear>(2)->weight.sizes(), w2);
    // After remove() the pruning is permanent and structured pruning works.
    remove(*layer, "weight");
    ln_structured(channel_groups(*net), PruneAmount::fraction(0.5));
    EXPECT_EQ(net->at<Linear>(0)->weight.size(0), 3);
  }
}

TEST(CompressRegressions, SparsifyLinearsIsAllOrNothing) {
  auto net = mlp();
  {
    NoGradGuard no_grad;
    net->at<Linear>(0)->weight.zero_();  // sparse enough for any threshold
  }
  l1_unstructured(*net->at<Linear>(2), "weight", PruneAmount::fraction(0.5));  // a live mask: cannot be packed
  error_message<ValueError>([&] { sparsify_linears(*net); });
  EXPECT_FALSE(net->at<Linear>(0)->packed_weight);
  EXPECT_TRUE(net->at<Linear>(0)->weight.defined());
}

TEST(CompressRegressions, QuantizeModelIsAllOrNothing) {
  auto net = mlp();
  {
    NoGradGuard no_grad;
    net->at<Linear>(2)->weight.narrow(0, 1, 1).fill_(std::numeric_limits<float>::quiet_NaN());
  }
  error_message<ValueError>([&] { quantize_model(*net); });
  for (size_t i : {size_t{0}, size_t{2}}) {
    EXPECT_FALSE(net->at<Linear>(i)->packed_weight) << i;
    EXPECT_TRUE(net->at<Linear>(i)->weight.defined()) << i;
  }
}

TEST(CompressRegressions, DequantizeFollowsTheModuleDtype) {
  Linear layer(3, 2);
  quantize_int8(layer);
  layer.to(DType::f64);
  // Hand-dequantized reference from the packed tensors themselves: q (i8) times the per-row scale, in double.
  const auto* p = dynamic_cast<const Int8PackedWeight*>(layer.packed_weight.get());
  ASSERT_NE(p, nullptr);
  const std::vector<double> q = p->q().to_vector<double>(), s = p->scale().to_vector<double>();
  dequantize(layer);
  ASSERT_EQ(layer.weight.dtype(), DType::f64);
  const std::vector<double> w = layer.weight.to_vector<double>();
  for (size_t i = 0; i < w.size(); ++i) EXPECT_DOUBLE_EQ(w[i], q[i] * s[i / 3]) << i;
  NoGradGuard no_grad;
  const Tensor y = layer.forward(ones({1, 3}, {DType::f64}));
  EXPECT_EQ(y.dtype(), DType::f64);
}

TEST(CompressRegressions, QuantizingF64BeyondF32RangeRaises) {
  const Tensor w = from_vector(std::vector<double>{1e39, 1.0, -2.0, 0.5}, {2, 2});
  const std::string msg = error_message<ValueError>([&] { ops::quantize_per_channel_symmetric(w); });
  EXPECT_NE(msg.find("f32"), std::string::npos) << msg;
}

TEST(CompressRegressions, MeasureInferenceRestoresModeWhenForwardThrows) {
  auto net = mlp();
  net->train();
  error_message<ShapeError>([&] { measure_inference(*net, zeros({2, 5})); });
  EXPECT_TRUE(net->is_training());
  EXPECT_TRUE(net->at<Linear>(0)->is_training());
}

TEST(CompressRegressions, SharedLayerCountsAndPacksOnce) {
  // One Linear at two places of the tree (paths "0" and "2"): its weight is 4*4 f32 = 64 bytes, counted once.
  auto lin = std::make_shared<Linear>(4, 4);
  auto net = std::make_shared<Sequential>(lin, std::make_shared<ReLU>(), lin);
  EXPECT_EQ(model_memory(*net).weight_bytes, 64);
  EXPECT_EQ(quantize_model(*net), (std::vector<std::string>{"0"}));
  EXPECT_EQ(model_memory(*net).weight_bytes, 16 + 4 * 4);  // int8 values + f32 scales
  dequantize(*lin);
  {
    NoGradGuard no_grad;
    lin->weight.zero_();
  }
  EXPECT_EQ(sparsify_linears(*net), (std::vector<std::string>{"0"}));
}

TEST(CompressRegressions, NanNormIsRefusedBeforeAnyChange) {
  // A NaN norm would break the sort's ordering (which channels are kept would be arbitrary): refused up front.
  EXPECT_THROW(channels_to_keep({1.0, std::nan(""), 0.5}, PruneAmount::count(1)), ValueError);
  auto a = std::make_shared<Linear>(3, 4), b = std::make_shared<Linear>(4, 2);
  {
    NoGradGuard no_grad;
    a->weight.fill_(std::nan(""));
  }
  auto net = std::make_shared<Sequential>(a, std::make_shared<ReLU>(), b);
  EXPECT_THROW(ln_structured(channel_groups(*net), PruneAmount::fraction(0.5)), ValueError);
  EXPECT_EQ(a->out_features, 4);
  EXPECT_EQ(b->weight.sizes(), (Shape{2, 4}));
}

}  // namespace
}  // namespace ember::nn
