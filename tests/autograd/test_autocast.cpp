// Autocast: the published policy table is what the ops do (result dtypes of every listed op under f16 and bf16),
// promotion of mixed inputs, unlisted ops keep their dtype, nesting and thread locality, gradients through the
// recorded casts (against a float64 reference on the rounded inputs), and the cast cache's lifetime and validity.
#include <map>
#include <thread>

#include "ember/nn/functional.h"
#include "ember/nn/module.h"
#include "ember/nn/transformer.h"
#include "tests/autograd/engine_test_util.h"

namespace ember::testing {
namespace {

namespace F = nn::functional;

class AutocastTest : public DeviceTest {};

// One call per listed op on inputs of dtype `in`, returning the result's dtype. Inputs are f32 or f16, so a
// lower-precision op shows the autocast dtype and an fp32 op shows f32.
using PolicyProbe = std::function<DType(DType in, Device dev)>;

Tensor input(Shape shape, DType dtype, Device dev, double lo = -1.0, double hi = 1.0) {
  return rand_input(shape, lo, hi).to(dtype).to(dev);
}

std::map<std::string, PolicyProbe> policy_probes() {
  std::map<std::string, PolicyProbe> p;
  p["matmul"] = [](DType in, Device d) { return matmul(input({3, 4}, in, d), input({4, 2}, in, d)).dtype(); };
  p["bmm"] = [](DType in, Device d) { return bmm(input({2, 3, 4}, in, d), input({2, 4, 2}, in, d)).dtype(); };
  p["linear"] = [](DType in, Device d) {
    return linear(input({3, 4}, in, d), input({5, 4}, in, d), input({5}, in, d)).dtype();
  };
  p["conv2d"] = [](DType in, Device d) {
    return conv2d(input({1, 2, 5, 5}, in, d), input({3, 2, 3, 3}, in, d), input({3}, in, d)).dtype();
  };
  p["scaled_dot_product_attention"] = [](DType in, Device d) {
    return F::scaled_dot_product_attention(input({1, 2, 4, 8}, in, d), input({1, 2, 4, 8}, in, d),
                                           input({1, 2, 4, 8}, in, d), Tensor(), 0.0, true)
        .dtype();
  };
  p["softmax"] = [](DType in, Device d) { return softmax(input({3, 4}, in, d), 1).dtype(); };
  p["log_softmax"] = [](DType in, Device d) { return log_softmax(input({3, 4}, in, d), 1).dtype(); };
  p["layer_norm"] = [](DType in, Device d) {
    return layer_norm(input({3, 4}, in, d), {4}, input({4}, in, d), input({4}, in, d)).dtype();
  };
  p["sum"] = [](DType in, Device d) { return sum(input({3, 4}, in, d)).dtype(); };
  p["mean"] = [](DType in, Device d) { return mean(input({3, 4}, in, d), {1}).dtype(); };
  p["var"] = [](DType in, Device d) { return var(input({3, 4}, in, d), {1}).dtype(); };
  p["exp"] = [](DType in, Device d) { return exp(input({3}, in, d)).dtype(); };
  p["log"] = [](DType in, Device d) { return log(input({3}, in, d, 0.5, 2.0)).dtype(); };
  p["pow"] = [](DType in, Device d) {
    const DType a = pow(input({3}, in, d, 0.5, 2.0), 2.0).dtype();
    const DType b = pow(input({3}, in, d, 0.5, 2.0), input({3}, in, d)).dtype();
    return a == b ? a : DType::b8;  // the two overloads must agree
  };
  p["rsqrt"] = [](DType in, Device d) { return rsqrt(input({3}, in, d, 0.5, 2.0)).dtype(); };
  p["cross_entropy"] = [](DType in, Device d) {
    return F::cross_entropy(input({4, 5}, in, d), rand_indices({4}, 5).to(d)).dtype();
  };
  p["nll_loss"] = [](DType in, Device d) {
    return F::nll_loss(input({4, 5}, in, d, -3.0, -0.1), rand_indices({4}, 5).to(d)).dtype();
  };
  p["bias_gelu"] = [](DType in, Device d) { return bias_gelu(input({2, 4}, in, d), input({4}, in, d)).dtype(); };
  p["mse_loss"] = [](DType in, Device d) { return F::mse_loss(input({4}, in, d), input({4}, in, d)).dtype(); };
  // promote: an f16/bf16 operand meets an f32 one (for an f32 probe input, the other operand is f16).
  auto other = [](DType in) { return in == DType::f32 ? DType::f16 : DType::f32; };
  p["add"] = [other](DType in, Device d) { return add(input({3}, in, d), input({3}, other(in), d)).dtype(); };
  p["sub"] = [other](DType in, Device d) { return sub(input({3}, in, d), input({3}, other(in), d)).dtype(); };
  p["mul"] = [other](DType in, Device d) { return mul(input({3}, in, d), input({3}, other(in), d)).dtype(); };
  p["div"] = [other](DType in, Device d) {
    return div(input({3}, in, d), input({3}, other(in), d, 0.5, 2.0)).dtype();
  };
  p["maximum"] = [other](DType in, Device d) { return maximum(input({3}, in, d), input({3}, other(in), d)).dtype(); };
  p["minimum"] = [other](DType in, Device d) { return minimum(input({3}, in, d), input({3}, other(in), d)).dtype(); };
  p["where"] = [other](DType in, Device d) {
    const Tensor cond = gt(input({3}, DType::f32, d), scalar_tensor(0.0, {DType::f32, d}));
    return where(cond, input({3}, in, d), input({3}, other(in), d)).dtype();
  };
  return p;
}

TEST_P(AutocastTest, EveryPolicyEntryIsAppliedWithItsCategory) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  EMBER_REQUIRE_KERNEL(softmax_stub);
  const auto probes = policy_probes();
  for (DType low : {DType::f16, DType::bf16}) {
    AutocastGuard autocast(device().type, low);
    for (const AutocastPolicyEntry& e : autocast_policy()) {
      SCOPED_TRACE(std::string(e.op) + " under " + dtype_name(low));
      auto it = probes.find(e.op);
      ASSERT_NE(it, probes.end()) << "no probe for the listed op " << e.op;
      switch (e.category) {
        case AutocastCategory::lower_precision:
          EXPECT_EQ(it->second(DType::f32, device()), low);
          EXPECT_EQ(it->second(low == DType::f16 ? DType::bf16 : DType::f16, device()), low);
          break;
        case AutocastCategory::fp32:
          EXPECT_EQ(it->second(DType::f16, device()), DType::f32);
          EXPECT_EQ(it->second(DType::bf16, device()), DType::f32);
          break;
        case AutocastCategory::promote:
          EXPECT_EQ(it->second(DType::f32, device()), DType::f32);  // f32 with f16 -> the widest
          EXPECT_EQ(it->second(DType::f16, device()), DType::f32);
          break;
      }
    }
  }
  EXPECT_EQ(probes.size(), autocast_policy().size()) << "a probe for an op the table does not list";
}

TEST_P(AutocastTest, OutsideARegionAndForF64TheDtypesAreKept) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  const auto probes = policy_probes();
  EXPECT_EQ(probes.at("matmul")(DType::f32, device()), DType::f32);
  EXPECT_EQ(probes.at("softmax")(DType::f16, device()), DType::f16);
  AutocastGuard autocast(device().type, DType::f16);
  if (device().is_cpu()) EXPECT_EQ(probes.at("matmul")(DType::f64, device()), DType::f64);
  // Unlisted ops run in their input's dtype.
  EXPECT_EQ(relu(input({3}, DType::f16, device())).dtype(), DType::f16);
  EXPECT_EQ(gelu(input({3}, DType::f32, device())).dtype(), DType::f32);
  EXPECT_EQ(input({2, 3}, DType::f32, device()).transpose(0, 1).dtype(), DType::f32);
  // An integer operand is never cast.
  EXPECT_EQ(sum(ones({3}, {DType::i64, device()})).dtype(), DType::i64);
}

// An f32 CPU tensor of uniform values (the harness's rand_input makes f64, which autocast leaves alone).
Tensor rand_f32(const Shape& shape) { return rand_input(shape).to(DType::f32); }

TEST(Autocast, RegionsNestAndEachDeviceTypeHasItsOwnState) {
  EXPECT_FALSE(autocast::is_enabled(DeviceType::CPU));
  EXPECT_EQ(autocast::default_dtype(DeviceType::CPU), DType::bf16);
  EXPECT_EQ(autocast::default_dtype(DeviceType::CUDA), DType::f16);
  const Tensor a = rand_f32({2, 2}), b = rand_f32({2, 2});
  {
    AutocastGuard outer(DeviceType::CPU);  // CPU default: bf16
    EXPECT_TRUE(autocast::is_enabled(DeviceType::CPU));
    EXPECT_FALSE(autocast::is_enabled(DeviceType::CUDA));
    EXPECT_EQ(matmul(a, b).dtype(), DType::bf16);
    {
      AutocastGuard inner(DeviceType::CPU, DType::f16);
      EXPECT_EQ(matmul(a, b).dtype(), DType::f16);
      {
        AutocastGuard off(DeviceType::CPU, /*enabled=*/false);
        EXPECT_EQ(matmul(a, b).dtype(), DType::f32);
      }
      EXPECT_EQ(matmul(a, b).dtype(), DType::f16);
    }
    EXPECT_EQ(matmul(a, b).dtype(), DType::bf16);
    {
      AutocastGuard cuda_only(DeviceType::CUDA, DType::f16, true);  // leaves CPU ops at the outer CPU setting
      EXPECT_EQ(matmul(a, b).dtype(), DType::bf16);
    }
  }
  EXPECT_FALSE(autocast::is_enabled(DeviceType::CPU));
  EXPECT_EQ(matmul(a, b).dtype(), DType::f32);
}

TEST(Autocast, StateIsPerThread) {
  const Tensor a = rand_f32({2, 2});
  AutocastGuard autocast(DeviceType::CPU, DType::f16);
  DType other = DType::b8;
  std::thread t([&] { other = matmul(a, a).dtype(); });
  t.join();
  EXPECT_EQ(other, DType::f32);
  EXPECT_EQ(matmul(a, a).dtype(), DType::f16);
}

TEST(Autocast, RejectsAFullPrecisionDtype) {
  EXPECT_THROW(AutocastGuard(DeviceType::CPU, DType::f32), DTypeError);
  EXPECT_FALSE(autocast::is_enabled(DeviceType::CPU));
}

// Rounds every element of t to `dtype` and back (the value an autocast cast produces), as doubles.
std::vector<double> rounded(const Tensor& t, DType dtype) {
  return t.detach().to(dtype).to(DType::f64).to_vector<double>();
}

TEST(Autocast, GradientsFlowThroughTheCastsInTheOriginalDtype) {
  // loss = sum(x @ w) with x, w f32 leaves: the product runs in f16; the gradients come back as f32 tensors equal
  // (to f16 rounding of the backward product) to the float64 gradient at the rounded inputs.
  Tensor x = rand_f32({3, 4}), w = rand_f32({4, 2});
  x.requires_grad_();
  w.requires_grad_();
  {
    AutocastGuard autocast(DeviceType::CPU, DType::f16);
    Tensor y = matmul(x, w);
    ASSERT_EQ(y.dtype(), DType::f16);
    Tensor loss = sum(y);
    ASSERT_EQ(loss.dtype(), DType::f32);
    loss.backward();
  }
  ASSERT_EQ(x.grad().dtype(), DType::f32);
  ASSERT_EQ(w.grad().dtype(), DType::f32);
  // d/dx sum(x w) = row sums of w broadcast over x's rows; d/dw = column sums of x broadcast over w's columns.
  const std::vector<double> wr = rounded(w, DType::f16), xr = rounded(x, DType::f16);
  std::vector<double> gx(12), gw(8);
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 4; ++k) gx[i * 4 + k] = wr[k * 2] + wr[k * 2 + 1];
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 2; ++j) gw[k * 2 + j] = xr[k] + xr[4 + k] + xr[8 + k];
  EXPECT_TRUE(values_near(x.grad(), gx, 4e-3));
  EXPECT_TRUE(values_near(w.grad(), gw, 4e-3));
}

TEST(Autocast, ParameterCastsAreCachedForTheRegion) {
  Tensor w = rand_f32({4, 4});
  w.requires_grad_();
  const Tensor x = rand_f32({2, 4});
  autocast::clear_cache();
  {
    AutocastGuard autocast(DeviceType::CPU, DType::f16);
    Tensor y = matmul(matmul(x, w), w);  // w used twice: one cached cast
    EXPECT_EQ(autocast::cache_size(), 1);
    const Tensor a = autocast::lower(w), b = autocast::lower(w);
    EXPECT_EQ(a.unsafe_impl(), b.unsafe_impl());
    // Non-leaves and tensors that do not require grad are not cached.
    Tensor h = matmul(x, w);
    (void)matmul(h.to(DType::f32), rand_f32({4, 2}));
    EXPECT_EQ(autocast::cache_size(), 1);
    // Both uses of w reach w.grad through the one cast node.
    sum(y).backward();
    EXPECT_TRUE(w.grad().defined());
    {
      // An in-place change of the source invalidates its entry.
      NoGradGuard no_grad;
      w.fill_(0.5);
    }
    const Tensor c = autocast::lower(w);
    EXPECT_NE(c.unsafe_impl(), a.unsafe_impl());
    EXPECT_TRUE(values_near(c, std::vector<double>(16, 0.5)));
    {
      // A cast made under no_grad has no history and is not handed to ops recorded later.
      NoGradGuard no_grad;
      EXPECT_FALSE(autocast::lower(w).requires_grad());
    }
    EXPECT_TRUE(autocast::lower(w).requires_grad());
  }
  EXPECT_EQ(autocast::cache_size(), 0) << "the cache lives as long as the outermost region";
  {
    AutocastGuard no_cache(DeviceType::CPU, DType::f16, true, /*cache_enabled=*/false);
    (void)matmul(x, w);
    EXPECT_EQ(autocast::cache_size(), 0);
  }
}

TEST(Autocast, GptLossUnderAutocastIsCloseToFp32AndParametersGetFp32Grads) {
  nn::GPTConfig cfg;
  cfg.n_layer = 2;
  cfg.n_embd = 32;
  cfg.n_head = 2;
  cfg.block_size = 16;
  manual_seed(7);
  nn::GPT model(cfg);
  const Tensor idx = rand_indices({2, 16}, cfg.vocab_size), targets = rand_indices({2, 16}, cfg.vocab_size);
  const double ref = model.forward(idx, targets).loss.item_double();
  for (DType low : {DType::f16, DType::bf16}) {
    model.zero_grad();
    AutocastGuard autocast(DeviceType::CPU, low);
    nn::GPTOutput out = model.forward(idx, targets);
    EXPECT_EQ(out.logits.dtype(), low) << "lm_head is a linear";
    EXPECT_EQ(out.loss.dtype(), DType::f32) << "losses run in fp32";
    EXPECT_NEAR(out.loss.item_double(), ref, low == DType::f16 ? 5e-3 : 3e-2);
    out.loss.backward();
    for (const auto& [name, p] : model.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_EQ(p.grad().dtype(), DType::f32) << name;
    }
  }
}

// Layer norm over rows of n values in float64 (biased variance, eps 1e-5): y = xhat * w + b and, for an upstream
// gradient g, the gradients of sum(y * g) by the textbook formulas.
struct LayerNormRef {
  std::vector<double> y, gx, gw, gb;
};
LayerNormRef layer_norm_ref(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                            const std::vector<double>& g, size_t n) {
  const size_t rows = x.size() / n;
  LayerNormRef r{std::vector<double>(x.size()), std::vector<double>(x.size()), std::vector<double>(n, 0.0),
                 std::vector<double>(n, 0.0)};
  for (size_t i = 0; i < rows; ++i) {
    double mu = 0, var = 0;
    for (size_t j = 0; j < n; ++j) mu += x[i * n + j] / double(n);
    for (size_t j = 0; j < n; ++j) var += (x[i * n + j] - mu) * (x[i * n + j] - mu) / double(n);
    const double rstd = 1.0 / std::sqrt(var + 1e-5);
    std::vector<double> xhat(n), dxhat(n);
    double m1 = 0, m2 = 0;
    for (size_t j = 0; j < n; ++j) {
      xhat[j] = (x[i * n + j] - mu) * rstd;
      r.y[i * n + j] = xhat[j] * w[j] + b[j];
      dxhat[j] = g[i * n + j] * w[j];
      m1 += dxhat[j] / double(n);
      m2 += dxhat[j] * xhat[j] / double(n);
      r.gw[j] += g[i * n + j] * xhat[j];
      r.gb[j] += g[i * n + j];
    }
    for (size_t j = 0; j < n; ++j) r.gx[i * n + j] = rstd * (dxhat[j] - m1 - xhat[j] * m2);
  }
  return r;
}

TEST(Autocast, LayerNormKeepsTheHalfInputAndComputesInFp32) {
  // Note [Mixed layer norm]: under autocast, layer norm of an f16/bf16 x with f32 weight/bias returns f32 and saves
  // x itself; output and gradients are the float64 layer norm of x's values to f32 accuracy, x's gradient rounded once.
  for (DType low : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(low));
    const Tensor x0 = rand_input({3, 2, 8}).to(low);
    Tensor w = rand_f32({8}), b = rand_f32({8});
    w.requires_grad_();
    b.requires_grad_();
    Tensor x = x0.clone();
    x.requires_grad_();
    const Tensor g = rand_f32({3, 2, 8});
    Tensor y;
    {
      AutocastGuard autocast(DeviceType::CPU, low);
      y = layer_norm(x, {8}, w, b);
    }
    ASSERT_EQ(y.dtype(), DType::f32);
    sum(mul(y, g)).backward();
    ASSERT_EQ(x.grad().dtype(), low);
    const LayerNormRef ref = layer_norm_ref(elems(x0), elems(w), elems(b), elems(g), 8);
    EXPECT_TRUE(values_near(y, ref.y, 1e-5));
    EXPECT_TRUE(values_near(w.grad(), ref.gw, 1e-4));
    EXPECT_TRUE(values_near(b.grad(), ref.gb, 1e-5));
    // Rounding the f64 gradient to the half type may differ from rounding the f32 one by one unit in the last place.
    const double ulp = low == DType::f16 ? 1.0 / 1024 : 1.0 / 128;
    const std::vector<double> gx = elems(x.grad());
    for (size_t i = 0; i < gx.size(); ++i)
      EXPECT_LE(std::abs(gx[i] - ref.gx[i]), ulp * std::max(1.0, std::abs(ref.gx[i]))) << "element " << i;
  }
  // Mixed pairs the kernels do not take are refused with the rule in the message.
  const Tensor x = rand_input({2, 4}).to(DType::f16);
  EXPECT_THROW(ops::layer_norm(x, {4}, rand_f32({4}), rand_input({4}).to(DType::f16)), DTypeError);
  EXPECT_THROW(ops::layer_norm(rand_f32({2, 4}), {4}, rand_input({4}).to(DType::f16), Tensor()), DTypeError);
}

TEST(Autocast, CachedCastFollowsAStorageSwappedInBySetData) {
  // Module::to(dtype/device) replaces a parameter's storage (set_data): the cached cast of the old storage must not
  // be handed out for the new one, even at the same version number.
  Tensor w = rand_f32({2, 2});
  w.requires_grad_();
  AutocastGuard autocast(DeviceType::CPU, DType::f16);
  EXPECT_TRUE(values_near(autocast::lower(w), rounded(w, DType::f16)));
  nn::set_data(w, full({2, 2}, 3.0, TensorOptions(DType::f32)));
  EXPECT_TRUE(values_near(autocast::lower(w), std::vector<double>(4, 3.0)));
}

EMBER_INSTANTIATE_DEVICE_TESTS(AutocastTest);

}  // namespace
}  // namespace ember::testing
