// CPU kernels split over threads (Note [Parallel chunks] in core/parallel.h, Note [Parallel GEMM] in gemm.cpp) give
// the same bits for 1, 2 and 3 threads — the invariant that keeps every reference test, resume and estimator check
// valid whatever the machine — and a split product still matches a float64 reference. Shapes are chosen so that
// each path really splits: GEMM row blocks, column blocks, batches, packed operands, tails that are not multiples of
// Eigen's register panels; element-wise loops with broadcast and strided operands; softmax and layer-norm rows; the
// fused optimizer steps; conv2d forward and backward.
#include <cstring>
#include <functional>
#include <vector>

#include "ember/core/generator.h"
#include "ember/core/parallel.h"
#include "ember/core/philox.h"
#include "ember/kernels/ops.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), static_cast<size_t>(ca.nbytes())) == 0;
}

// Runs f with 1, 2 and 3 threads and expects every output to have the same bits as with one thread.
void expect_thread_count_invariant(const char* what, const std::function<std::vector<Tensor>()>& f) {
  SCOPED_TRACE(what);
  std::vector<Tensor> ref;
  {
    ScopedNumThreads tc(1);
    ref = f();
  }
  for (int threads : {2, 3}) {
    ScopedNumThreads tc(threads);
    const std::vector<Tensor> got = f();
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(same_bits(got[i], ref[i])) << "output " << i << ", " << threads << " threads";
  }
}

TEST(ParallelKernels, GemmSplitsGiveTheSameBitsAsOneThread) {
  struct Case {
    const char* what;
    Shape a, b;
    bool transpose_a, transpose_b;
  };
  const std::vector<Case> cases = {
      {"row blocks (M >= N)", {301, 200}, {200, 97}, false, false},
      {"column blocks (N > M)", {97, 200}, {200, 1003}, false, false},
      {"column blocks, transposed right operand", {64, 288}, {577, 288}, false, true},
      {"row blocks, transposed left operand", {784, 256}, {784, 130}, true, false},
      {"batches", {6, 70, 33}, {6, 33, 71}, false, false},
      {"batches with a broadcast right operand", {5, 64, 64}, {64, 100}, false, false},
  };
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(dtype_name(dt));
      Tensor a = rand_input(c.a).to(dt), b = rand_input(c.b).to(dt);
      if (c.transpose_a) a = a.transpose(-1, -2);
      if (c.transpose_b) b = b.transpose(-1, -2);
      expect_thread_count_invariant(c.what, [&] { return std::vector<Tensor>{ops::matmul(a, b)}; });
    }
  }
  // Both operands strided (no unit stride): packed once, then split.
  const Tensor a = rand_input({400, 2, 300}).select(1, 0), b = rand_input({300, 3, 200}).select(1, 1);
  expect_thread_count_invariant("both operands packed", [&] { return std::vector<Tensor>{ops::matmul(a, b)}; });
}

TEST(ParallelKernels, SplitGemmMatchesAFloat64Reference) {
  ScopedNumThreads tc(3);
  const Tensor a = rand_input({150, 77}), b = rand_input({77, 500});
  const Tensor got = ops::matmul(a, b).to(DType::f64);
  const Tensor want = ops::matmul(a.to(DType::f64), b.to(DType::f64));
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], w[i], 1e-5 * (1.0 + std::abs(w[i]))) << "element " << i;
}

TEST(ParallelKernels, ElementwiseSoftmaxLayerNormAndDropout) {
  const Tensor x = rand_input({300, 1000}).to(DType::f32), row = rand_input({1000}).to(DType::f32);
  const Tensor col = rand_input({300, 1});                                   // f64: mixed dtypes promote
  const Tensor xt = rand_input({1000, 300}).to(DType::f32).transpose(0, 1);  // strided operand
  expect_thread_count_invariant("binary with broadcast", [&] {
    return std::vector<Tensor>{ops::add(x, row), ops::mul(x, col), ops::sub(x, xt), ops::div(xt, row)};
  });
  expect_thread_count_invariant("unary", [&] {
    return std::vector<Tensor>{ops::gelu(x), ops::exp(xt), ops::tanh(x), ops::relu(xt)};
  });
  expect_thread_count_invariant("softmax along the last and the first dim", [&] {
    return std::vector<Tensor>{ops::softmax(x, -1), ops::log_softmax(x, 0), ops::softmax(xt, 1)};
  });
  const Tensor w = rand_input({1000}).to(DType::f32), bias = rand_input({1000}).to(DType::f32);
  expect_thread_count_invariant("layer norm", [&] {
    return std::vector<Tensor>{ops::layer_norm(x, {1000}, w, bias), ops::layer_norm(xt, {1000})};
  });
  const Tensor g = rand_input({300, 1000}).to(DType::f32);
  const LayerNormResult f = ops::layer_norm_with_stats(x, {1000}, w, bias), ft = ops::layer_norm_with_stats(xt, {1000},
                                                                                                           w, bias);
  expect_thread_count_invariant("layer norm backward (contiguous and strided x)", [&] {
    const LayerNormGrads a = ops::layer_norm_backward(g, x, w, f.mean, f.rstd, 1, true, true, true);
    const LayerNormGrads b = ops::layer_norm_backward(g, xt, w, ft.mean, ft.rstd, 1, true, true, true);
    return std::vector<Tensor>{a.x, a.weight, a.bias, b.x, b.weight, b.bias};
  });
  expect_thread_count_invariant("dropout", [&] {
    manual_seed(7);
    return std::vector<Tensor>{ops::dropout(x, 0.3)};
  });
}

// Note [Random draws in chunks] (kernels/cpu/copy_fill_random.cpp): chunks split at multiples of 4 elements; sizes
// with tails (a partial last counter) and an odd starting offset (a draw after one of 3 elements) in every dtype.
TEST(ParallelKernels, RandomDrawsInChunks) {
  expect_thread_count_invariant("uniform and normal draws", [] {
    manual_seed(11);
    std::vector<Tensor> out;
    for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      (void)rand({3}, dt);  // the next draws start 1 counter on: offsets other than 0
      out.push_back(rand({200003}, dt));
      out.push_back(randn({100001}, dt));
      out.push_back(randn({7}, dt));
    }
    return out;
  });
  // Element i of the draw is the Philox value of (seed, offset, i) (Note [Philox stream]), computed per element.
  manual_seed(12);
  const PhiloxState at = default_generator().state();
  const Tensor u = rand({70001}), z = randn({70001});
  const std::vector<float> uv = u.to_vector<float>(), zv = z.to_vector<float>();
  const uint64_t z_offset = at.offset + philox_uniform_counters(70001);
  for (uint64_t i : {uint64_t{0}, uint64_t{1}, uint64_t{5}, uint64_t{32767}, uint64_t{32768}, uint64_t{70000}}) {
    EXPECT_EQ(uv[i], philox_uniform_element(at.seed, at.offset, i)) << i;
    EXPECT_EQ(zv[i], philox_normal_element(at.seed, z_offset, i)) << i;
  }
}

TEST(ParallelKernels, ReductionsSplitOverOutputs) {
  const Tensor x = rand_input({64, 32, 12, 12}).to(DType::f32);
  expect_thread_count_invariant("sum, mean, var, amax, argmax over kept outputs, sums down strided columns", [&] {
    return std::vector<Tensor>{ops::sum(x, {0, 2, 3}), ops::mean(x, {1}), ops::var(x, {3}), ops::amax(x, {0}),
                               ops::argmax(x, 2), ops::sum(x.transpose(1, 3), {3}), ops::sum(x, {0}),
                               ops::mean(x, {0, 2})};
  });
}

TEST(ParallelKernels, MaxPoolFastPathAndGeneralPath) {
  const Tensor x = rand_input({16, 32, 24, 24}).to(DType::f32);
  Pool2dParams two;  // 2x2, stride 2: the fast path
  Pool2dParams three;
  three.kernel[0] = three.kernel[1] = 3;
  three.padding[0] = three.padding[1] = 1;
  expect_thread_count_invariant("max_pool2d", [&] {
    return std::vector<Tensor>{ops::max_pool2d(x, two), ops::max_pool2d(x, three), ops::avg_pool2d(x, three)};
  });
  // Backward: planes split over the threads; the 2x2 pool's planes are written by cells, the 3x3 pool's scattered
  // (Note [Max-pool backward by cells]); bf16 goes through a float plane per chunk.
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor xd = x.to(dt);
    const MaxPoolResult r2 = ops::max_pool2d_with_indices(xd, two), r3 = ops::max_pool2d_with_indices(xd, three);
    const Tensor g2 = rand_input(r2.out.shape()).to(dt), g3 = rand_input(r3.out.shape()).to(dt);
    expect_thread_count_invariant("max_pool2d_backward", [&] {
      return std::vector<Tensor>{ops::max_pool2d_backward(g2, r2.indices, xd.shape()),
                                 ops::max_pool2d_backward(g3, r3.indices, xd.shape()),
                                 ops::avg_pool2d_backward(g3, xd.shape(), three)};
    });
  }
}

TEST(ParallelKernels, OptimizerStepsSplitOverThreads) {
  const Tensor p0 = rand_input({300000}).to(DType::f32), g = rand_input({300000}).to(DType::f32),
               m0 = rand_input({300000}).to(DType::f32), v0 = rand_input({300000}, 0.0, 1.0).to(DType::f32);
  expect_thread_count_invariant("adamw and sgd", [&] {
    const Tensor p = p0.clone(), m = m0.clone(), v = v0.clone(), q = p0.clone(), buf = m0.clone();
    AdamParams ap;
    ap.decoupled = true;
    ap.weight_decay = 0.1;
    ap.step = 3;
    ops::adam_step_(p, g, m, v, ap);
    SgdParams sp;
    sp.momentum = 0.9;
    ops::sgd_step_(q, g, buf, sp);
    return std::vector<Tensor>{p, m, v, q, buf};
  });
}

// Batches of images run image by image on the threads, one image splits its im2col and GEMM, and the weight
// gradient sums a fixed number of partial sums (Note [Convolution over images] in ember/kernels/cpu/conv_pool.cpp).
TEST(ParallelKernels, Conv2dForwardAndBackward) {
  struct Case {
    const char* what;
    Shape x, w;
    int64_t groups, stride;
    DType dtype;
  };
  const std::vector<Case> cases = {
      {"8 images", {8, 16, 20, 20}, {32, 16, 3, 3}, 1, 1, DType::f32},
      {"one image: split im2col and GEMM", {1, 16, 30, 30}, {32, 16, 3, 3}, 1, 1, DType::f32},
      {"11 images: 8 uneven weight partials", {11, 8, 12, 12}, {16, 8, 3, 3}, 1, 1, DType::f32},
      {"groups and stride 2", {5, 8, 15, 15}, {12, 4, 3, 3}, 2, 2, DType::f64},
      {"bf16", {6, 8, 12, 12}, {16, 8, 3, 3}, 1, 1, DType::bf16},
  };
  for (const Case& c : cases) {
    const Tensor x = rand_input(c.x).to(c.dtype), w = rand_input(c.w).to(c.dtype), b = rand_input({c.w[0]}).to(c.dtype);
    Conv2dParams p;
    p.padding[0] = p.padding[1] = 1;
    p.stride[0] = p.stride[1] = c.stride;
    p.groups = c.groups;
    expect_thread_count_invariant(c.what, [&] {
      const Tensor y = ops::conv2d(x, w, b, p);
      const Tensor gy = ops::mul(y, 0.5);
      // A channels-last gradient as well: its [O, H*W] rows are packed per image.
      const Tensor gy_cl = gy.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
      return std::vector<Tensor>{y, ops::conv2d_backward_input(gy, w, x.sizes(), p),
                                 ops::conv2d_backward_weight(gy, x, w.sizes(), p),
                                 ops::conv2d_backward_weight(gy_cl, x, w.sizes(), p)};
    });
  }
}

// The fused residual add + layer norm (with the backward's grad_add) and bias + GELU, shapes that split over rows.
TEST(ParallelKernels, FusedAddLayerNormAndBiasGelu) {
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = rand_input({512, 768}).to(dt), r = rand_input({512, 768}).to(dt);
    const Tensor w = rand_input({768}, 0.5, 1.5).to(dt), b = rand_input({768}).to(dt);
    expect_thread_count_invariant("add_layer_norm_with_stats", [&] {
      const AddLayerNormResult a = ops::add_layer_norm_with_stats(x, r, {768}, w, b);
      return std::vector<Tensor>{a.sum, a.out, a.mean, a.rstd};
    });
    const Tensor g = rand_input({512, 768}).to(dt), ga = rand_input({512, 768}).to(dt);
    const LayerNormResult f = ops::layer_norm_with_stats(x, {768}, w, b);
    expect_thread_count_invariant("layer_norm_backward with grad_add", [&] {
      const LayerNormGrads d = ops::layer_norm_backward(g, x, w, f.mean, f.rstd, 1, true, true, true, ga);
      return std::vector<Tensor>{d.x, d.weight, d.bias};
    });
    const Tensor gx = rand_input({4096, 96}, -4.0, 4.0).to(dt), gb = rand_input({96}).to(dt);
    const Tensor gg = rand_input({4096, 96}).to(dt);
    for (GeluApprox approx : {GeluApprox::None, GeluApprox::Tanh}) {
      expect_thread_count_invariant("bias_gelu", [&] { return std::vector<Tensor>{ops::bias_gelu(gx, gb, approx)}; });
      expect_thread_count_invariant("bias_gelu_backward", [&] {
        const BiasGeluGrads d = ops::bias_gelu_backward(gg, gx, gb, approx, true, true);
        return std::vector<Tensor>{d.x, d.bias};
      });
    }
  }
  // The mixed layer norm: bf16 x and residual, f32 affine.
  const Tensor x = rand_input({512, 768}).to(DType::bf16), r = rand_input({512, 768}).to(DType::bf16);
  const Tensor w = rand_input({768}, 0.5, 1.5).to(DType::f32);
  expect_thread_count_invariant("mixed add_layer_norm_with_stats", [&] {
    const AddLayerNormResult a = ops::add_layer_norm_with_stats(x, r, {768}, w, w);
    return std::vector<Tensor>{a.sum, a.out, a.mean, a.rstd};
  });
}

}  // namespace
}  // namespace ember::testing
