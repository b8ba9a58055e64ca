// The fused softmax + cross-entropy over rows (Note [Fused cross-entropy] in ember/kernels/stubs.h): per-row loss and
// log-sum-exp against naive float64 loops (ignored rows, label smoothing, C from 1 to 1000), the logits' gradient
// against central finite differences and against the formula, masked (-inf) logits, NaN rows, f16/bf16 logits, the
// nn::functional::cross_entropy path against nll_loss(log_softmax) (the composed form), that the fused path holds no
// [M, C] tensor between forward and backward, and every error path. Device-parameterised: cuda instances skip
// without a GPU.
#include <cmath>
#include <limits>
#include <vector>

#include "ember/memory/cpu_allocator.h"
#include "ember/nn/functional.h"
#include "tests/harness/grad_check.h"

namespace ember::testing {
namespace {

namespace F = nn::functional;

class CrossEntropyTest : public DeviceTest {};

// Per-row loss (0 for ignored rows) of logits [M, C] as nn.CrossEntropyLoss(reduction='none') defines it.
Tensor naive_loss(const Tensor& logits, const Tensor& target, int64_t ignore, double s) {
  const int64_t M = logits.size(0), C = logits.size(1);
  const std::vector<double> x = logits.contiguous().to_vector<double>();
  const std::vector<int64_t> t = target.to_vector<int64_t>();
  std::vector<double> out(static_cast<size_t>(M), 0.0);
  for (int64_t i = 0; i < M; ++i) {
    if (t[static_cast<size_t>(i)] == ignore) continue;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < C; ++j) mx = std::max(mx, x[static_cast<size_t>(i * C + j)]);
    double sum = 0.0;
    for (int64_t j = 0; j < C; ++j) sum += std::exp(x[static_cast<size_t>(i * C + j)] - mx);
    const double lse = mx + std::log(sum);
    double smooth = 0.0;  // sum over classes of -log p
    for (int64_t j = 0; j < C; ++j) smooth += lse - x[static_cast<size_t>(i * C + j)];
    const double nll = lse - x[static_cast<size_t>(i * C + t[static_cast<size_t>(i)])];
    out[static_cast<size_t>(i)] = (1.0 - s) * nll + s / static_cast<double>(C) * smooth;
  }
  return from_vector(out, {M});
}

// d loss_i / d x_ij weighted by grad [M]: grad_i (softmax_ij - (1 - s) [j == t_i] - s / C).
Tensor naive_grad(const Tensor& grad, const Tensor& logits, const Tensor& target, int64_t ignore, double s) {
  const int64_t M = logits.size(0), C = logits.size(1);
  const std::vector<double> x = logits.contiguous().to_vector<double>();
  const std::vector<double> g = grad.contiguous().to_vector<double>();
  const std::vector<int64_t> t = target.to_vector<int64_t>();
  std::vector<double> out(static_cast<size_t>(M * C), 0.0);
  for (int64_t i = 0; i < M; ++i) {
    const int64_t ti = t[static_cast<size_t>(i)];
    if (ti == ignore) continue;
    double mx = -std::numeric_limits<double>::infinity(), sum = 0.0;
    for (int64_t j = 0; j < C; ++j) mx = std::max(mx, x[static_cast<size_t>(i * C + j)]);
    for (int64_t j = 0; j < C; ++j) sum += std::exp(x[static_cast<size_t>(i * C + j)] - mx);
    for (int64_t j = 0; j < C; ++j) {
      const double p = std::exp(x[static_cast<size_t>(i * C + j)] - mx) / sum;
      out[static_cast<size_t>(i * C + j)] =
          g[static_cast<size_t>(i)] * (p - s / static_cast<double>(C) - (j == ti ? 1.0 - s : 0.0));
    }
  }
  return from_vector(out, {M, C});
}

// Targets in [0, C) with every third row ignored (when `with_ignored`).
Tensor targets_for(int64_t M, int64_t C, int64_t ignore, bool with_ignored) {
  std::vector<int64_t> t = rand_indices({M}, C).to_vector<int64_t>();
  if (with_ignored)
    for (size_t i = 0; i < t.size(); i += 3) t[i] = ignore;
  return from_vector(t, {M});
}

TEST_P(CrossEntropyTest, LossMatchesReference) {
  EMBER_REQUIRE_KERNEL(cross_entropy_stub);
  for (const auto& [M, C] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {5, 7}, {3, 1000}, {64, 65}, {2, 513}}) {
    for (double s : {0.0, 0.1}) {
      const int64_t ignore = -100;
      const Tensor target = targets_for(M, C, ignore, M > 1);
      OpCase c{"cross_entropy_rows", {rand_input({M, C}, -4.0, 4.0), target}, [ignore, s](const Inputs& in) {
                 // The loss comes in f32 for f16/bf16 logits; rounded to the logits' dtype for the harness.
                 return ops::cross_entropy_rows(in[0], in[1], ignore, s).loss.to(in[0].dtype());
               }};
      c.reference = [ignore, s](const Inputs& in) { return naive_loss(in[0], in[1], ignore, s); };
      c.keep_dtype_inputs = {1};
      c.tolerance = [](DType dt) {  // computed in f32 from the rounded logits, then rounded once to the dtype
        if (dt == DType::f64) return Tolerance{1e-12, 1e-12};
        if (dt == DType::f32) return Tolerance{2e-5, 2e-5};
        return dt == DType::f16 ? Tolerance{1e-3, 1e-3} : Tolerance{8e-3, 8e-3};
      };
      SCOPED_TRACE(::testing::Message() << "M " << M << " C " << C << " smoothing " << s);
      check_op(c, device());
    }
  }
}

TEST_P(CrossEntropyTest, GradientMatchesFormula) {
  EMBER_REQUIRE_KERNEL(cross_entropy_backward_stub);
  for (const auto& [M, C] : std::vector<std::pair<int64_t, int64_t>>{{4, 9}, {3, 1000}, {7, 65}}) {
    for (double s : {0.0, 0.2}) {
      const int64_t ignore = 1;  // a valid class index used as ignore_index
      const Tensor target = targets_for(M, C, ignore, true);
      const Tensor grad = rand_input({M});
      OpCase c{
          "cross_entropy_rows_backward", {rand_input({M, C}, -3.0, 3.0), target, grad}, [ignore, s](const Inputs& in) {
            const CrossEntropyResult r = ops::cross_entropy_rows(in[0], in[1], ignore, s);
            return ops::cross_entropy_rows_backward(in[2], in[0], in[1], r.lse, ignore, s);
          }};
      c.reference = [ignore, s](const Inputs& in) { return naive_grad(in[2], in[0], in[1], ignore, s); };
      c.keep_dtype_inputs = {1, 2};
      c.tolerance = [](DType dt) {
        if (dt == DType::f64) return Tolerance{1e-12, 1e-12};
        if (dt == DType::f32) return Tolerance{1e-5, 1e-6};
        return Tolerance{1e-2, 4e-3};  // stored in f16/bf16 once
      };
      SCOPED_TRACE(::testing::Message() << "M " << M << " C " << C << " smoothing " << s);
      check_op(c, device());
    }
  }
}

TEST_P(CrossEntropyTest, GradientMatchesFiniteDifferences) {
  EMBER_REQUIRE_KERNEL(cross_entropy_backward_stub);
  for (double s : {0.0, 0.3}) {
    const Tensor target = from_vector(std::vector<int64_t>{2, -100, 0, 4}, {4});
    GradCase c{"cross_entropy_rows", {rand_input({4, 5}, -2.0, 2.0), target}, [s](const Inputs& in) {
                 return cross_entropy_rows(in[0], in[1], -100, s);
               }};
    c.wrt = {0};
    check_grad(c, device());
  }
}

TEST_P(CrossEntropyTest, FunctionalMatchesComposedForm) {
  EMBER_REQUIRE_KERNEL(cross_entropy_stub);
  const Device dev = device();
  const Tensor x64 = rand_input({6, 11, 3}, -3.0, 3.0);  // [N, C, d]: the class dim is moved last first
  const Tensor t =
      from_vector(std::vector<int64_t>{0, 3, -100, 10, 5, 7, 1, 2, 9, -100, 4, 6, 8, 0, 3, 3, 2, 1}, {6, 3}).to(dev);
  for (F::Reduction red : {F::Reduction::Mean, F::Reduction::Sum, F::Reduction::None}) {
    Tensor a = x64.to(dev, DType::f32).detach().requires_grad_(true);
    Tensor b = x64.to(dev, DType::f32).detach().requires_grad_(true);
    const Tensor fused = F::cross_entropy(a, t, -100, 0.0, red);
    const Tensor composed = F::nll_loss(log_softmax(b, 1), t, -100, red);
    ASSERT_EQ(fused.sizes(), composed.sizes());
    EXPECT_TRUE(allclose(fused, composed, {1e-5, 1e-6}));
    sum(fused).backward();
    sum(composed).backward();
    EXPECT_TRUE(allclose(a.grad(), b.grad(), {1e-5, 1e-6}));
  }
}

TEST_P(CrossEntropyTest, MaskedLogitsAndNaN) {
  EMBER_REQUIRE_KERNEL(cross_entropy_stub);
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor x = from_vector(std::vector<double>{0.5, -inf, 1.5, -inf,  //
                                                   1.0, 2.0, std::nan(""), 0.0},
                               {2, 4})
                       .to(device(), DType::f32)
                       .detach()
                       .requires_grad_(true);
  const Tensor t = from_vector(std::vector<int64_t>{2, 0}, {2}).to(device());
  const Tensor loss = cross_entropy_rows(x, t, -100, 0.0);
  const std::vector<double> l = loss.to_vector<double>();
  EXPECT_NEAR(l[0], std::log(std::exp(0.5) + std::exp(1.5)) - 1.5, 1e-6);  // masked classes take no probability
  EXPECT_TRUE(std::isnan(l[1]));                                           // a NaN logit poisons its row only
  sum(loss).backward();
  const std::vector<double> g = x.grad().to_vector<double>();
  EXPECT_EQ(g[1], 0.0);
  EXPECT_EQ(g[3], 0.0);
  const double p2 = std::exp(1.5) / (std::exp(0.5) + std::exp(1.5));
  EXPECT_NEAR(g[2], p2 - 1.0, 1e-6);
  EXPECT_TRUE(std::isnan(g[4]));
}

TEST_P(CrossEntropyTest, HalfLogitsUnderAutocastAreNotCopiedToF32) {
  EMBER_REQUIRE_KERNEL(cross_entropy_stub);
  const Tensor x64 = rand_input({8, 33}, -2.0, 2.0);
  const Tensor t = targets_for(8, 33, -100, true).to(device());
  for (DType dt : {DType::f16, DType::bf16}) {
    const Tensor x = x64.to(device(), dt);
    Tensor loss;
    {
      AutocastGuard guard(device().type, dt);
      loss = F::cross_entropy(x, t);
    }
    EXPECT_EQ(loss.dtype(), DType::f32);
    // The rounded logits, in f64 on the CPU.
    const Tensor want = F::cross_entropy(x.to(Device::cpu(), DType::f64), t.to(Device::cpu()));
    EXPECT_TRUE(allclose(loss, want, {1e-5, 1e-6})) << dtype_name(dt);
  }
}

// The composed path keeps the [M, C] log-probabilities alive for backward; the fused one only [M]-sized tensors.
TEST(CrossEntropyMemory, FusedPathHoldsNoRowsByClassesTensor) {
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  const int64_t M = 256, C = 4096;
  const Tensor x = randn({M, C}).requires_grad_(true);
  const Tensor t = (rand({M}) * double(C)).to(DType::i64);
  const int64_t before = alloc.stats().allocated_bytes;
  Tensor loss = F::cross_entropy(x, t);
  const int64_t held = alloc.stats().allocated_bytes - before;
  EXPECT_LT(held, M * C * 4 / 8) << "bytes held between forward and backward: " << held;
  loss.backward();
  ASSERT_TRUE(x.grad().defined());
}

TEST_P(CrossEntropyTest, Errors) {
  EMBER_REQUIRE_KERNEL(cross_entropy_stub);
  const Tensor x = zeros({3, 4}, {DType::f32, device()});
  const Tensor t = from_vector(std::vector<int64_t>{0, 1, 2}, {3}).to(device());
  EXPECT_NE(error_message<IndexError>([&] {
              (void)ops::cross_entropy_rows(x, from_vector(std::vector<int64_t>{0, 4, 1}, {3}).to(device()), -100, 0);
            }).find("target 4 at row 1"),
            std::string::npos);
  (void)error_message<DTypeError>([&] { (void)ops::cross_entropy_rows(x, t.to(DType::i32), -100, 0); });
  (void)error_message<DTypeError>([&] { (void)ops::cross_entropy_rows(t, t, -100, 0); });
  (void)error_message<ShapeError>([&] { (void)ops::cross_entropy_rows(x.reshape({12}), t, -100, 0); });
  (void)error_message<ShapeError>([&] { (void)ops::cross_entropy_rows(x, t.slice(0, 0, 2), -100, 0); });
  (void)error_message<ValueError>([&] { (void)ops::cross_entropy_rows(x, t, -100, 1.5); });
  const CrossEntropyResult r = ops::cross_entropy_rows(x, t, -100, 0.0);
  (void)error_message<ShapeError>([&] {
    (void)ops::cross_entropy_rows_backward(zeros({2}, {DType::f32, device()}), x, t, r.lse, -100, 0.0);
  });
  (void)error_message<DTypeError>(
      [&] { (void)ops::cross_entropy_rows_backward(r.loss, x, t, r.lse.to(DType::f64), -100, 0.0); });
}

// Note [Targets checked once]: the autograd node's backward takes its targets as checked. Targets outside [0, C)
// passed that way (a saved-tensor hook gone wrong) must not take a kernel outside its row: such a row's gradient is
// grad * softmax, as for a target that matches no class (the sanitizer build checks the memory).
TEST_P(CrossEntropyTest, BackwardOfCheckedTargetsStaysInsideTheRows) {
  EMBER_REQUIRE_KERNEL(cross_entropy_backward_stub);
  const int64_t M = 3, C = 8;  // C a multiple of every pack width, so the CUDA kernel takes its packed path too
  const Tensor x = rand_input({M, C}, -2.0, 2.0).to(DType::f32).to(device());
  const Tensor good = from_vector(std::vector<int64_t>{1, 2, 3}, {M}).to(device());
  // Row 1's -7 would land in row 0, written before it; the last row's C + 5 past the end of the gradient.
  const Tensor bad = from_vector(std::vector<int64_t>{1, -7, C + 5}, {M}).to(device());
  const CrossEntropyResult r = ops::cross_entropy_rows(x, good, -100, 0.0);
  const Tensor grad = full({M}, 0.5, {DType::f32, device()});
  const Tensor g = ops::cross_entropy_rows_backward(grad, x, bad, r.lse, -100, 0.0, ops::TargetValues::checked);
  const Tensor no_class = from_vector(std::vector<int64_t>{1, -1, -1}, {M});  // matches no class in rows 1 and 2
  EXPECT_TRUE(allclose(g, naive_grad(grad, x, no_class, /*ignore=*/-100, 0.0), Tolerance{1e-5, 1e-6}));
  // Unless told they were checked, the backward checks them.
  EXPECT_NE(error_message<IndexError>([&] {
              (void)ops::cross_entropy_rows_backward(grad, x, bad, r.lse, -100, 0.0);
            }).find("target -7 at row 1"),
            std::string::npos);
}

// What lets the node skip the check: its saved targets are version-checked, so targets written in place after the
// forward refuse the backward instead of reaching the kernel unchecked.
TEST_P(CrossEntropyTest, TargetsWrittenAfterTheForwardRefuseTheBackward) {
  EMBER_REQUIRE_KERNEL(cross_entropy_backward_stub);
  const Tensor x = rand_input({3, 5}, -2.0, 2.0).to(DType::f32).to(device()).requires_grad_(true);
  Tensor target = from_vector(std::vector<int64_t>{0, 4, 2}, {3}).to(device());
  Tensor loss = sum(cross_entropy_rows(x, target, -100, 0.0));
  target.fill_(Scalar(int64_t{7}));
  EXPECT_NE(error_message<ValueError>([&] { loss.backward(); }).find("modified"), std::string::npos);
}

EMBER_INSTANTIATE_DEVICE_TESTS(CrossEntropyTest);

}  // namespace
}  // namespace ember::testing
