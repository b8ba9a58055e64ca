// Int8 quantization of layers (ember/nn/quantize.h): the packed layout (buffers, bytes), quantized Linear / Conv2d
// against their dequantized dense twins and against hand-derived error bounds, dynamic and static activations,
// calibration against hand-computed maxima, state_dict / safetensors round trips between quantized models, and the
// error paths (packing twice, static before calibration, training a packed layer).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ember/kernels/ops_quant.h"
#include "ember/nn/quantize.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

using nn::ActivationQuant;

std::vector<std::string> names_of(const nn::NamedTensors& ts) {
  std::vector<std::string> out;
  for (const auto& [n, t] : ts) out.push_back(n);
  return out;
}

std::shared_ptr<nn::Linear> linear_copy(const nn::Linear& src, const Tensor& weight) {
  auto l = std::make_shared<nn::Linear>(src.in_features, src.out_features, src.bias.defined());
  NoGradGuard g;
  l->weight.copy_(weight);
  if (src.bias.defined()) l->bias.copy_(src.bias);
  return l;
}

TEST(Quantize, LinearLayoutBytesAndDenseTwin) {
  auto lin = std::make_shared<nn::Linear>(20, 7);
  const Tensor w0 = lin->weight.detach().clone();
  const Tensor x = rand_input({3, 20}).to(DType::f32);
  nn::quantize_int8(*lin);
  EXPECT_FALSE(lin->weight.defined());
  ASSERT_TRUE(lin->packed_weight);
  EXPECT_EQ(lin->packed_weight->format(), "int8");
  EXPECT_EQ(names_of(lin->named_parameters()), (std::vector<std::string>{"bias"}));
  EXPECT_EQ(names_of(lin->named_buffers()), (std::vector<std::string>{"weight_int8", "weight_scale"}));
  EXPECT_EQ(names_of(lin->state_dict()), (std::vector<std::string>{"bias", "weight_int8", "weight_scale"}));
  // f32 [7, 20] = 560 bytes -> 7*20 int8 + 7 f32 scales = 168 bytes.
  EXPECT_EQ(lin->packed_weight->nbytes(), 7 * 20 + 4 * 7);
  EXPECT_EQ(lin->parameter_bytes(), 7 * 4);
  // dense() is within scale/2 of the original weight per element.
  const Tensor dense = lin->packed_weight->dense();
  EXPECT_EQ(dense.dtype(), DType::f32);
  const std::vector<double> d = dense.to_vector<double>(), w = w0.to_vector<double>();
  const std::vector<double> s = lin->named_buffers()[1].second.to_vector<double>();
  for (int64_t i = 0; i < 7 * 20; ++i) EXPECT_LE(std::fabs(d[i] - w[i]), s[i / 20] / 2 * (1 + 1e-6));

  NoGradGuard g;
  const Tensor y = (*lin)(x);
  auto twin = linear_copy(*lin, dense);
  EXPECT_TRUE(allclose(y, (*twin)(x), {1e-5, 1e-6}));
  EXPECT_TRUE(allclose((*lin)(x.view({3, 1, 20})), (*twin)(x).view({3, 1, 7}), {1e-5, 1e-6}));

  // dequantize: a dense f32 parameter again, registered after the bias, with the same outputs.
  nn::dequantize(*lin);
  EXPECT_FALSE(lin->packed_weight);
  EXPECT_EQ(names_of(lin->named_parameters()), (std::vector<std::string>{"bias", "weight"}));
  EXPECT_TRUE(lin->named_buffers().empty());
  EXPECT_TRUE(lin->weight.requires_grad());
  EXPECT_TRUE(allclose((*lin)(x), y, {1e-5, 1e-6}));
}

// The bound on |int8 x int8 linear - f32 linear| per output (activation and weight rounding, and their product).
void expect_within_quant_bound(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& wscale, double sx,
                               const Tensor& b) {
  const Tensor ref = ops::linear(x, w, b);
  const std::vector<double> yv = y.to_vector<double>(), rv = ref.to_vector<double>(), xv = x.to_vector<double>();
  const std::vector<double> wv = w.to_vector<double>(), sv = wscale.to_vector<double>();
  const int64_t n = w.size(0), k = w.size(1), m = x.numel() / k;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double bound = 1e-5;
      for (int64_t t = 0; t < k; ++t)
        bound += sx / 2 * std::fabs(wv[j * k + t]) + std::fabs(xv[i * k + t]) * sv[j] / 2 + sx * sv[j] / 4;
      EXPECT_LE(std::fabs(yv[i * n + j] - rv[i * n + j]), bound) << i << ", " << j;
    }
}

TEST(Quantize, DynamicLinearWithinQuantizationBound) {
  auto lin = std::make_shared<nn::Linear>(24, 5);
  const Tensor w0 = lin->weight.detach().clone(), b0 = lin->bias.detach().clone();
  nn::quantize_int8(*lin, ActivationQuant::Dynamic);
  const auto p = std::dynamic_pointer_cast<nn::Int8PackedWeight>(lin->packed_weight);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->mode(), ActivationQuant::Dynamic);
  EXPECT_FALSE(p->input_scale().defined());
  const Tensor x = rand_input({4, 24}, -2.0, 2.0).to(DType::f32);
  double amax = 0.0;
  for (double v : x.to_vector<double>()) amax = std::max(amax, std::fabs(v));
  NoGradGuard g;
  expect_within_quant_bound((*lin)(x), x, w0, p->scale(), amax / 127.0, b0);
  EXPECT_THROW((*lin)(x.to(DType::f64)), DTypeError);  // int8 activations come from f32
}

TEST(Quantize, Conv2dEqualsDequantizedTwin) {
  auto conv = std::make_shared<nn::Conv2d>(nn::Conv2dOptions(4, 6, 3).stride(2).padding(1).groups(2));
  const Tensor x = rand_input({2, 4, 9, 8}).to(DType::f32);
  nn::quantize_int8(*conv);
  EXPECT_FALSE(conv->weight.defined());
  EXPECT_EQ(conv->packed_weight->nbytes(), 6 * 2 * 3 * 3 + 4 * 6);
  EXPECT_EQ(names_of(conv->state_dict()), (std::vector<std::string>{"bias", "weight_int8", "weight_scale"}));
  auto twin = std::make_shared<nn::Conv2d>(nn::Conv2dOptions(4, 6, 3).stride(2).padding(1).groups(2));
  {
    NoGradGuard g;
    twin->weight.copy_(conv->packed_weight->dense());
    twin->bias.copy_(conv->bias);
  }
  NoGradGuard g;
  const Tensor y = (*conv)(x);
  EXPECT_TRUE(allclose(y, (*twin)(x), {1e-5, 1e-6}));
  EXPECT_TRUE(allclose((*conv)(x.select(0, 1)), y.select(0, 1), {1e-6, 1e-7}));  // unbatched [C, H, W]
  nn::dequantize(*conv);
  EXPECT_TRUE(allclose((*conv)(x), y, {1e-5, 1e-6}));
}

TEST(Quantize, PackedLayersAreForInference) {
  auto lin = std::make_shared<nn::Linear>(3, 2);
  nn::quantize_int8(*lin);
  EXPECT_THROW((*lin)(rand_input({1, 3}).to(DType::f32)), ValueError);  // grad mode on, bias requires grad
}

TEST(Quantize, Errors) {
  auto lin = std::make_shared<nn::Linear>(3, 2);
  EXPECT_THROW(nn::dequantize(*lin), ValueError);  // not packed
  nn::quantize_int8(*lin);
  const std::string msg = error_message<ValueError>([&] { nn::quantize_int8(*lin); });
  EXPECT_NE(msg.find("already holds a packed 'int8'"), std::string::npos) << msg;
  EXPECT_EQ(names_of(lin->state_dict()), (std::vector<std::string>{"bias", "weight_int8", "weight_scale"}));
  auto conv = std::make_shared<nn::Conv2d>(2, 2, 1);
  nn::quantize_int8(*conv);
  EXPECT_THROW(nn::quantize_int8(*conv), ValueError);
  // Weights that cannot be quantized leave the layer as it was.
  auto bad = std::make_shared<nn::Linear>(2, 2);
  {
    NoGradGuard g;
    bad->weight.copy_(from_vector<float>({1, NAN, 0, 1}, {2, 2}));
  }
  EXPECT_THROW(nn::quantize_int8(*bad), ValueError);
  EXPECT_TRUE(bad->weight.defined());
  EXPECT_FALSE(bad->packed_weight);
  EXPECT_EQ(names_of(bad->named_parameters()), (std::vector<std::string>{"weight", "bias"}));
  // Static before calibration; a calibration without static layers.
  auto st = std::make_shared<nn::Linear>(3, 2);
  nn::quantize_int8(*st, ActivationQuant::Static);
  NoGradGuard g;
  const std::string smsg = error_message<ValueError>([&] { (*st)(rand_input({1, 3}).to(DType::f32)); });
  EXPECT_NE(smsg.find("calibrat"), std::string::npos) << smsg;
  EXPECT_THROW(nn::Calibration c(*lin), ValueError);
}

// Linear(4, 3) with a hand-set weight, ReLU, Linear(3, 2), both static.
std::shared_ptr<nn::Sequential> static_model() {
  auto model = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::ReLU>(),
                                                std::make_shared<nn::Linear>(3, 2));
  auto l0 = model->at<nn::Linear>(0);
  {
    NoGradGuard g;
    l0->weight.copy_(from_vector<float>({1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, -1}, {3, 4}));
    l0->bias.zero_();
  }
  EXPECT_EQ(nn::quantize_model(*model, ActivationQuant::Static), (std::vector<std::string>{"0", "2"}));
  return model;
}

double input_scale_of(nn::Sequential& model, size_t i) {
  auto p = std::dynamic_pointer_cast<nn::Int8PackedWeight>(model.at<nn::Linear>(i)->packed_weight);
  return p->input_scale().item_double();
}

TEST(Quantize, CalibrationSetsHandComputedScales) {
  auto model = static_model();
  EXPECT_EQ(input_scale_of(*model, 0), 0.0);  // uncalibrated
  const Tensor b1 = from_vector<float>({2.5f, 1, 0, -1, 0, 0, 0, 0}, {2, 4});
  const Tensor b2 = from_vector<float>({1, -5, 0.5f, 2}, {1, 4});
  // Layer 0 sees max|x| = 5 (batch 2). Its outputs: batch 1 -> [2.5, 2, 1] and [0, 0, 0]; batch 2 -> [1, -10, -2];
  // after the ReLU layer 2 sees max 2.5 (the int8 weights 1, 2, -1 are exact: 127 * (max / 127) per row).
  EXPECT_EQ(nn::calibrate(*model, [&] {
              (*model)(b1);
              (*model)(b2);
            }),
            2);
  EXPECT_NEAR(input_scale_of(*model, 0), 5.0 / 127.0, 5.0 / 127.0 * 1e-6);
  EXPECT_NEAR(input_scale_of(*model, 2), 2.5 / 127.0, 2.5 / 127.0 * 1e-6);
  // Calibrated: the forward runs int8 x int8, within the quantization bound of the f32 model.
  NoGradGuard g;
  auto l2 = model->at<nn::Linear>(2);
  auto p2 = std::dynamic_pointer_cast<nn::Int8PackedWeight>(l2->packed_weight);
  const Tensor h = from_vector<float>({2, 1, 0.5f}, {1, 3});
  expect_within_quant_bound((*l2)(h), h, p2->dense(), p2->scale(), 2.5 / 127.0, l2->bias);
  // Inputs beyond the calibrated range clamp to +-127 * scale: layer 2 sees 2.5 at most.
  const Tensor big = from_vector<float>({10, 0, 0}, {1, 3});
  const Tensor clamped = from_vector<float>({2.5f, 0, 0}, {1, 3});
  EXPECT_TRUE(allclose((*l2)(big), (*l2)(clamped), {0, 0}));
  // Calibrating again starts from a fresh maximum.
  {
    nn::Calibration c(*model);
    (*model)(b1);
  }
  EXPECT_NEAR(input_scale_of(*model, 0), 2.5 / 127.0, 2.5 / 127.0 * 1e-6);
}

TEST(Quantize, StateDictRoundTripBetweenQuantizedModels) {
  auto a = static_model();
  nn::calibrate(*a, [&] { (*a)(rand_input({5, 4}).to(DType::f32)); });
  auto b = static_model();  // another random init of layer 2, uncalibrated
  const nn::NamedTensors state = a->state_dict();
  EXPECT_EQ(names_of(state), (std::vector<std::string>{"0.bias", "0.weight_int8", "0.weight_scale", "0.input_scale",
                                                       "2.bias", "2.weight_int8", "2.weight_scale", "2.input_scale"}));
  // Through safetensors bytes (I8 weights, F32 scales) into the other quantized model.
  b->load_state_dict(nn::deserialize_safetensors(nn::serialize_safetensors(state)));
  NoGradGuard g;
  const Tensor x = rand_input({3, 4}).to(DType::f32);
  EXPECT_TRUE(allclose((*b)(x), (*a)(x), {0, 0}));
  // A dense model does not take the quantized state (strict keys).
  auto dense = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::ReLU>(),
                                                std::make_shared<nn::Linear>(3, 2));
  EXPECT_THROW(dense->load_state_dict(state), ValueError);
}

TEST(Quantize, QuantizeModelWalksTheTree) {
  auto net = std::make_shared<nn::Sequential>(std::make_shared<nn::Conv2d>(1, 4, 3), std::make_shared<nn::ReLU>(),
                                              std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(4 * 6 * 6, 10));
  const int64_t before = net->parameter_bytes();
  EXPECT_EQ(before, 4 * (4 * 9 + 4 + 144 * 10 + 10));
  const Tensor x = rand_input({2, 1, 8, 8}).to(DType::f32);
  EXPECT_EQ(nn::quantize_model(*net, ActivationQuant::None, /*convs=*/false), (std::vector<std::string>{"3"}));
  EXPECT_EQ(nn::quantize_model(*net), (std::vector<std::string>{"0"}));  // the Linear is already packed
  EXPECT_TRUE(nn::quantize_model(*net).empty());
  // Weight bytes: f32 4*(36 + 1440) -> int8 (36 + 1440) + 4*(4 + 10) scales.
  int64_t packed = 0;
  for (const auto& [name, t] : net->named_buffers()) packed += t.nbytes();
  EXPECT_EQ(packed, 36 + 1440 + 4 * (4 + 10));
  EXPECT_EQ(net->parameter_bytes(), 4 * (4 + 10));
  NoGradGuard g;
  EXPECT_EQ((*net)(x).sizes(), (Shape{2, 10}));
}

}  // namespace
}  // namespace ember::testing
