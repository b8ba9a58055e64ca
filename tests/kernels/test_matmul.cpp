// matmul / bmm / linear against a naive float64 triple loop written here: every rank combination of matmul (with
// broadcast batch dims), transposed and strided operands, large K, empty dims, and every error path.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ember/memory/cpu_allocator.h"
#if defined(EMBER_WITH_CUDA)
#include "ember/kernels/cuda/blas.h"
#endif
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

// Naive PyTorch-semantics matmul over std::vector<double>.
Tensor ref_matmul(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  Shape sa = a.sizes(), sb = b.sizes();
  const bool a_vec = sa.size() == 1, b_vec = sb.size() == 1;
  if (a_vec) sa.insert(sa.begin(), 1);
  if (b_vec) sb.push_back(1);
  const int64_t M = sa[sa.size() - 2], K = sa.back(), N = sb.back();
  const Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const size_t nb = std::max(ba.size(), bb.size());
  Shape batch(nb);
  for (size_t i = 0; i < nb; ++i) {
    const int64_t da = i + ba.size() >= nb ? ba[i + ba.size() - nb] : 1;
    const int64_t db = i + bb.size() >= nb ? bb[i + bb.size() - nb] : 1;
    batch[i] = std::max(da, db);
  }
  // Linear batch index of an operand with batch shape `own` for the broadcast batch multi-index of `flat`.
  auto operand_batch = [&](const Shape& own, int64_t flat) {
    int64_t idx = 0, mul = 1;
    for (int64_t i = static_cast<int64_t>(nb) - 1; i >= 0; --i) {
      const int64_t coord = flat % batch[i];
      flat /= batch[i];
      const int64_t j = i - static_cast<int64_t>(nb - own.size());
      if (j < 0) continue;
      if (own[j] != 1) idx += coord * mul;
      mul *= own[j];
    }
    return idx;
  };
  const int64_t B = numel_of(batch);
  std::vector<double> out(static_cast<size_t>(B * M * N));
  for (int64_t t = 0; t < B; ++t) {
    const double* pa = va.data() + operand_batch(ba, t) * M * K;
    const double* pb = vb.data() + operand_batch(bb, t) * K * N;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0.0;
        for (int64_t k = 0; k < K; ++k) s += pa[i * K + k] * pb[k * N + j];
        out[t * M * N + i * N + j] = s;
      }
  }
  Shape shape = batch;
  if (!a_vec) shape.push_back(M);
  if (!b_vec) shape.push_back(N);
  return from_vector(out, shape);
}

// Each output sums K products, and the rounding error of that sum grows like sqrt(K) for random-sign terms (a device
// may accumulate in a different order or in 16-bit steps), so the absolute tolerance scales with sqrt(K).
std::function<Tolerance(DType)> matmul_tolerance(int64_t K) {
  return [K](DType dt) {
    Tolerance t = default_tolerance(dt);
    t.atol *= std::max(1.0, std::sqrt(static_cast<double>(K) / 16.0));
    return t;
  };
}

class MatmulTest : public DeviceTest {};

TEST_P(MatmulTest, AllRankCombinations) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{7}, {7}},                    // 1-1: dot -> 0-d
      {{7}, {7, 3}},                 // 1-2
      {{5, 7}, {7}},                 // 2-1
      {{5, 7}, {7, 3}},              // 2-2
      {{2, 5, 7}, {7, 3}},           // 3-2
      {{5, 7}, {2, 7, 3}},           // 2-3
      {{7}, {2, 7, 3}},              // 1-3
      {{2, 5, 7}, {7}},              // 3-1
      {{2, 5, 7}, {2, 7, 3}},        // 3-3
      {{1, 5, 7}, {4, 7, 3}},        // 3-3, a's batch broadcasts
      {{2, 1, 5, 7}, {3, 7, 6}},     // 4-3 with broadcast on both sides
      {{3, 1, 5, 7}, {1, 2, 7, 6}},  // 4-4 with crossed broadcast
      {{1, 1}, {1, 1}},
  };
  for (const auto& [sa, sb] : cases) {
    SCOPED_TRACE(shape_str(sa) + " @ " + shape_str(sb));
    OpCase c{"matmul", {rand_input(sa), rand_input(sb)}, [](const Inputs& in) { return matmul(in[0], in[1]); }};
    c.reference = [](const Inputs& in) { return ref_matmul(in[0], in[1]); };
    c.tolerance = matmul_tolerance(sa.back());
    check_op(c, device());
  }
  // The 1-1 case is 0-d.
  const Tensor x = ones({4}, TensorOptions(DType::f32, device()));
  EXPECT_EQ(matmul(x, x).dim(), 0);
  EXPECT_EQ(matmul(x, x).item_double(), 4.0);
}

TEST_P(MatmulTest, TransposedAndStridedOperands) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  // Transposes inside the op call, so every dtype sees the strided view.
  OpCase t{"matmul", {rand_input({6, 5}), rand_input({3, 6})}, [](const Inputs& in) {
             return matmul(in[0].t(), in[1].t());
           }};
  t.reference = [](const Inputs& in) { return ref_matmul(in[0].t(), in[1].t()); };
  check_op(t, device());
  // Strided in both dims (every other row and column): no unit stride at all.
  OpCase s{"matmul", {rand_input({8, 10}), rand_input({10, 6})}, [](const Inputs& in) {
             return matmul(in[0].slice(0, 0, 8, 2).slice(1, 0, 10, 2), in[1].slice(0, 0, 10, 2).slice(1, 0, 6, 2));
           }};
  s.reference = [](const Inputs& in) {
    return ref_matmul(in[0].slice(0, 0, 8, 2).slice(1, 0, 10, 2), in[1].slice(0, 0, 10, 2).slice(1, 0, 6, 2));
  };
  check_op(s, device());
  // Batched, with the batch dim not outermost in memory.
  OpCase b{"matmul", {rand_input({4, 3, 5}), rand_input({5, 3, 2})}, [](const Inputs& in) {
             return matmul(in[0].transpose(0, 1), in[1].permute({1, 0, 2}));
           }};
  b.reference = [](const Inputs& in) { return ref_matmul(in[0].transpose(0, 1), in[1].permute({1, 0, 2})); };
  check_op(b, device());
  OpCase n{"matmul", {noncontiguous_input({2, 3, 4}), noncontiguous_input({4, 5})}, [](const Inputs& in) {
             return matmul(in[0], in[1]);
           }};
  n.reference = [](const Inputs& in) { return ref_matmul(in[0], in[1]); };
  check_op(n, device());
}

TEST_P(MatmulTest, LargeInnerDimension) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  for (int64_t K : {256, 2048}) {
    SCOPED_TRACE(K);
    OpCase c{"matmul", {rand_input({9, K}), rand_input({K, 7})}, [](const Inputs& in) { return matmul(in[0], in[1]); }};
    c.reference = [](const Inputs& in) { return ref_matmul(in[0], in[1]); };
    c.tolerance = matmul_tolerance(K);
    check_op(c, device());
  }
}

TEST_P(MatmulTest, EmptyDims) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  const TensorOptions f32(DType::f32, device());
  const Tensor z = matmul(empty({3, 0}, f32), empty({0, 4}, f32));  // K = 0: zeros
  EXPECT_EQ(z.sizes(), Shape({3, 4}));
  EXPECT_EQ(z.to_vector<double>(), std::vector<double>(12, 0.0));
  EXPECT_EQ(matmul(empty({0, 5}, f32), ones({5, 4}, f32)).sizes(), Shape({0, 4}));
  EXPECT_EQ(matmul(empty({2, 0, 5}, f32), ones({5, 4}, f32)).sizes(), Shape({2, 0, 4}));
  EXPECT_EQ(matmul(ones({3, 5}, f32), empty({0, 5, 4}, f32)).sizes(), Shape({0, 3, 4}));
  EXPECT_EQ(matmul(empty({0}, f32), empty({0}, f32)).item_double(), 0.0);
  EXPECT_EQ(bmm(empty({2, 3, 0}, f32), empty({2, 0, 4}, f32)).to_vector<double>(), std::vector<double>(24, 0.0));
}

TEST_P(MatmulTest, BmmMatchesReference) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  OpCase c{"bmm", {rand_input({3, 4, 5}), rand_input({3, 5, 2})}, [](const Inputs& in) { return bmm(in[0], in[1]); }};
  c.reference = [](const Inputs& in) { return ref_matmul(in[0], in[1]); };
  check_op(c, device());
  // A broadcast (stride-0) batch dim and a transposed right operand reach the kernel as they are.
  OpCase e{"bmm", {rand_input({3, 4, 5}), rand_input({1, 2, 5})}, [](const Inputs& in) {
             return bmm(in[0], in[1].expand({3, 2, 5}).transpose(1, 2));
           }};
  e.reference = [](const Inputs& in) { return ref_matmul(in[0], in[1].expand({3, 2, 5}).transpose(1, 2)); };
  check_op(e, device());
}

// The ways a logical [r, c] operand can sit in memory, as a view of an input made for it (make_layout_input).
enum class OperandLayout { RowMajor, ColMajor, RowMajorPadded, ColMajorPadded, BroadcastRows };
const char* layout_name(OperandLayout l) {
  switch (l) {
    case OperandLayout::RowMajor:
      return "row-major";
    case OperandLayout::ColMajor:
      return "column-major";
    case OperandLayout::RowMajorPadded:
      return "row-major, rows further apart than their length";
    case OperandLayout::ColMajorPadded:
      return "column-major, columns further apart than their length";
    case OperandLayout::BroadcastRows:
      return "one row broadcast (row stride 0)";
  }
  return "";
}
Tensor make_layout_input(OperandLayout l, int64_t r, int64_t c) {
  switch (l) {
    case OperandLayout::RowMajor:
      return rand_input({r, c});
    case OperandLayout::ColMajor:
      return rand_input({c, r});
    case OperandLayout::RowMajorPadded:
      return rand_input({r, c + 3});
    case OperandLayout::ColMajorPadded:
      return rand_input({c, r + 2});
    case OperandLayout::BroadcastRows:
      return rand_input({1, c});
  }
  return Tensor();
}
Tensor layout_view(OperandLayout l, const Tensor& t, int64_t r, int64_t c) {
  switch (l) {
    case OperandLayout::RowMajor:
      return t;
    case OperandLayout::ColMajor:
      return t.t();
    case OperandLayout::RowMajorPadded:
      return t.slice(1, 0, c);
    case OperandLayout::ColMajorPadded:
      return t.slice(1, 0, r).t();
    case OperandLayout::BroadcastRows:
      return t.expand({r, c});
  }
  return Tensor();
}

TEST_P(MatmulTest, EveryOperandLayoutPair) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  // Sizes no tile width divides; every layout of a against every layout of b (a GPU GEMM takes unit-stride operands
  // in place, transposed or not, and packs the rest).
  const int64_t M = 3, K = 5, N = 7;
  const OperandLayout all[] = {OperandLayout::RowMajor, OperandLayout::ColMajor, OperandLayout::RowMajorPadded,
                               OperandLayout::ColMajorPadded, OperandLayout::BroadcastRows};
  for (OperandLayout la : all) {
    for (OperandLayout lb : all) {
      SCOPED_TRACE(std::string("a ") + layout_name(la) + ", b " + layout_name(lb));
      auto views = [=](const Inputs& in) {
        return std::make_pair(layout_view(la, in[0], M, K), layout_view(lb, in[1], K, N));
      };
      OpCase c{"matmul", {make_layout_input(la, M, K), make_layout_input(lb, K, N)}, [=](const Inputs& in) {
                 const auto [a, b] = views(in);
                 return matmul(a, b);
               }};
      c.reference = [=](const Inputs& in) {
        const auto [a, b] = views(in);
        return ref_matmul(a, b);
      };
      check_op(c, device());
    }
  }
}

TEST_P(MatmulTest, BatchedLayouts) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  const int64_t B = 3, M = 5, K = 3, N = 7;
  struct Case {
    const char* what;
    Shape sa, sb;
    std::function<Tensor(const Tensor&)> va, vb;
  };
  auto same = [](const Tensor& t) { return t; };
  auto swap = [](const Tensor& t) { return t.transpose(1, 2); };
  auto share_a = [=](const Tensor& t) { return t.expand({B, M, K}); };
  auto share_swap_b = [=](const Tensor& t) { return t.expand({B, N, K}).transpose(1, 2); };
  auto first_rows = [=](const Tensor& t) { return t.slice(1, 0, M); };
  auto first_cols = [=](const Tensor& t) { return t.slice(2, 0, N); };
  auto every_other = [=](const Tensor& t) { return t.slice(0, 0, 2 * B, 2).slice(2, 0, 2 * K, 2); };
  const std::vector<Case> cases = {
      {"both transposed", {B, K, M}, {B, N, K}, swap, swap},
      {"a transposed", {B, K, M}, {B, K, N}, swap, same},
      {"a shared by every batch (batch stride 0)", {1, M, K}, {B, K, N}, share_a, same},
      {"both shared, b transposed", {1, M, K}, {1, N, K}, share_a, share_swap_b},
      {"padded batches (batch stride larger than a matrix)", {B, M + 2, K}, {B, K, N + 1}, first_rows, first_cols},
      {"every other batch, no unit stride in a", {2 * B, M, 2 * K}, {B, K, N}, every_other, same},
  };
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.what);
    const auto va = cs.va, vb = cs.vb;
    OpCase c{
        "bmm", {rand_input(cs.sa), rand_input(cs.sb)}, [=](const Inputs& in) { return bmm(va(in[0]), vb(in[1])); }};
    c.reference = [=](const Inputs& in) { return ref_matmul(va(in[0]), vb(in[1])); };
    check_op(c, device());
  }
}

TEST_P(MatmulTest, SizeOneDims) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  // Size-1 dims of a view may carry any stride; none of them may decide the layout.
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{1, 7}, {7, 1}}, {{5, 1}, {1, 4}}, {{1, 1}, {1, 6}}, {{4, 1, 1}, {4, 1, 3}}, {{2, 1, 5}, {2, 5, 1}}};
  for (const auto& [sa, sb] : shapes) {
    SCOPED_TRACE(shape_str(sa) + " @ " + shape_str(sb));
    OpCase c{"matmul", {rand_input(sa), rand_input(sb)}, [](const Inputs& in) { return matmul(in[0], in[1]); }};
    c.reference = [](const Inputs& in) { return ref_matmul(in[0], in[1]); };
    check_op(c, device());
  }
  // A column cut from a wider matrix ([5, 1], strides [6, 1]) and a row of a transposed one ([1, 5], strides [1, 4]).
  OpCase col{"matmul", {rand_input({5, 6}), rand_input({1, 3})}, [](const Inputs& in) {
               return matmul(in[0].slice(1, 2, 3), in[1]);
             }};
  col.reference = [](const Inputs& in) { return ref_matmul(in[0].slice(1, 2, 3), in[1]); };
  check_op(col, device());
  OpCase row{"matmul", {rand_input({5, 4}), rand_input({5, 3})}, [](const Inputs& in) {
               return matmul(in[0].t().slice(0, 1, 2), in[1]);
             }};
  row.reference = [](const Inputs& in) { return ref_matmul(in[0].t().slice(0, 1, 2), in[1]); };
  check_op(row, device());
}

TEST_P(MatmulTest, EmptyInnerDimensionEveryDType) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  // K == 0: every output element is an empty sum, 0 (outputs start NaN-poisoned, so each must be written).
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const TensorOptions o(dt, device());
    EXPECT_EQ(bmm(empty({2, 3, 0}, o), empty({2, 0, 5}, o)).to_vector<double>(), std::vector<double>(30, 0.0));
    EXPECT_EQ(matmul(empty({0, 3}, o).t(), empty({4, 0}, o).t()).to_vector<double>(), std::vector<double>(12, 0.0));
  }
}

TEST_P(MatmulTest, ManyBatches) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  // More batches than one GPU launch grid dim holds (65535), b shared by all of them.
  const int64_t B = 66000;
  OpCase c{"bmm", {rand_input({B, 2, 3}), rand_input({1, 3, 2})}, [](const Inputs& in) {
             return bmm(in[0], in[1].expand({in[0].size(0), 3, 2}));
           }};
  c.reference = [](const Inputs& in) { return ref_matmul(in[0], in[1].expand({in[0].size(0), 3, 2})); };
  check_op(c, device());
}

// y[r, o] = sum_i x[r, i] * w[o, i] + b[o], written out directly (b may be undefined); any views.
Tensor ref_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const std::vector<double> vx = x.to_vector<double>(), vw = w.to_vector<double>();
  const std::vector<double> vb = b.defined() ? b.to_vector<double>() : std::vector<double>();
  const int64_t O = w.size(0), I = w.size(1),
                R = I == 0 ? numel_of(Shape(x.sizes().begin(), x.sizes().end() - 1)) : x.numel() / I;
  std::vector<double> y(static_cast<size_t>(R * O));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t o = 0; o < O; ++o) {
      double s = vb.empty() ? 0.0 : vb[o];
      for (int64_t i = 0; i < I; ++i) s += vx[r * I + i] * vw[o * I + i];
      y[r * O + o] = s;
    }
  Shape shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(O);
  return from_vector(y, shape);
}

TEST_P(MatmulTest, LinearMatchesReference) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  auto ref = [](const Inputs& in) { return ref_linear(in[0], in[1], in.size() > 2 ? in[2] : Tensor()); };
  for (const Shape& xs : {Shape{2, 3, 5}, Shape{6, 5}, Shape{5}}) {
    SCOPED_TRACE(shape_str(xs));
    OpCase c{"linear", {rand_input(xs), rand_input({4, 5}), rand_input({4})}, [](const Inputs& in) {
               return linear(in[0], in[1], in[2]);
             }};
    c.reference = ref;
    check_op(c, device());
    OpCase n{"linear", {rand_input(xs), rand_input({4, 5})}, [](const Inputs& in) { return linear(in[0], in[1]); }};
    n.reference = ref;
    check_op(n, device());
  }
}

// The bias paths of linear (on CUDA: cuBLASLt's bias epilogue, or the bias rows then an accumulating GEMM where the
// epilogue does not apply — Note [Bias epilogue] in kernels/cuda/blas.cu): a fresh (aligned) bias, a bias view one
// element into its storage (unaligned), a transposed weight, an input with a row stride, K == 0 (the bias rows), and
// sizes that are no multiple of 8; f64 runs too (check_f64_against_reference), which CUDA sends down the fallback.
TEST_P(MatmulTest, LinearBiasEveryPath) {
  EMBER_REQUIRE_KERNEL(bmm_stub);
  struct Case {
    const char* what;
    Inputs inputs;
    std::function<Tensor(const Inputs&, bool)> args;  // (inputs, reference?) -> linear's result or the reference's
  };
  // Each case takes the same views of its inputs for the op and the reference.
  const std::vector<Case> cases = {
      {"aligned bias",
       {rand_input({37, 24}), rand_input({13, 24}), rand_input({13})},
       [](const Inputs& in, bool r) { return r ? ref_linear(in[0], in[1], in[2]) : linear(in[0], in[1], in[2]); }},
      {"bias one element in",
       {rand_input({9, 16}), rand_input({64, 16}), rand_input({65})},
       [](const Inputs& in, bool r) {
         const Tensor b = in[2].narrow(0, 1, 64);
         return r ? ref_linear(in[0], in[1], b) : linear(in[0], in[1], b);
       }},
      {"transposed weight",
       {rand_input({2, 5, 12}), rand_input({12, 20}), rand_input({20})},
       [](const Inputs& in, bool r) {
         const Tensor w = in[1].t();
         return r ? ref_linear(in[0], w, in[2]) : linear(in[0], w, in[2]);
       }},
      {"input with a row stride",
       {rand_input({11, 40}), rand_input({8, 20}), rand_input({8})},
       [](const Inputs& in, bool r) {
         const Tensor x = in[0].narrow(1, 10, 20);
         return r ? ref_linear(x, in[1], in[2]) : linear(x, in[1], in[2]);
       }},
      {"K == 0",
       {rand_input({3, 0}), rand_input({4, 0}), rand_input({4})},
       [](const Inputs& in, bool r) { return r ? ref_linear(in[0], in[1], in[2]) : linear(in[0], in[1], in[2]); }},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    const auto args = k.args;
    OpCase c{"linear", k.inputs, [args](const Inputs& in) { return args(in, false); }};
    c.reference = [args](const Inputs& in) { return args(in, true); };
    c.tolerance = matmul_tolerance(40);
    check_op(c, device());
  }
#if defined(EMBER_WITH_CUDA)
  // The results are the same on both CUDA paths, so which one ran is read off the fallback counter: a fresh bias
  // (aligned) with sizes in multiples of 8 goes through the epilogue in f32, f16 and bf16; f64 and a bias one element
  // into its storage take the fallback.
  if (device().is_cuda()) {
    for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
      SCOPED_TRACE(dtype_name(dt));
      const TensorOptions o(dt, device());
      const Tensor x = randn({32, 48}, o), w = randn({64, 48}, o), b = randn({64}, o), b1 = randn({65}, o);
      const int64_t before = cuda::gemm_bias_fallbacks();
      (void)linear(x, w, b);
      EXPECT_EQ(cuda::gemm_bias_fallbacks() - before, dt == DType::f64 ? 1 : 0) << "a fresh bias";
      (void)linear(x, w, b1.narrow(0, 1, 64));
      EXPECT_EQ(cuda::gemm_bias_fallbacks() - before, dt == DType::f64 ? 2 : 1) << "a bias one element in";
    }
  }
#endif
}

EMBER_INSTANTIATE_DEVICE_TESTS(MatmulTest);

TEST(MatmulErrors, InnerDimensionMismatchNamesBothShapes) {
  try {
    matmul(zeros({2, 3}), zeros({4, 5}));
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("matmul"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4, 5]"), std::string::npos) << msg;
  }
  EXPECT_THROW(matmul(zeros({3}), zeros({4})), ShapeError);
  EXPECT_THROW(matmul(zeros({3}), zeros({2, 4, 5})), ShapeError);
  EXPECT_THROW(matmul(zeros({2, 5, 3}), zeros({4})), ShapeError);
  EXPECT_THROW(matmul(zeros({2, 5, 3}), zeros({3, 3, 4})), ShapeError);  // batch dims 2 and 3 do not broadcast
}

TEST(MatmulErrors, ZeroDimDTypeAndDevice) {
  EXPECT_THROW(matmul(zeros({}), zeros({3})), ShapeError);
  EXPECT_THROW(matmul(zeros({3}), zeros({})), ShapeError);
  EXPECT_THROW(matmul(zeros({2, 3}), zeros({3, 2}, DType::f64)), DTypeError);  // no silent promotion
  EXPECT_THROW(matmul(zeros({2, 3}, DType::f16), zeros({3, 2}, DType::bf16)), DTypeError);
  EXPECT_THROW(matmul(zeros({2, 3}, DType::i32), zeros({3, 2}, DType::i32)), DTypeError);
  EXPECT_THROW(matmul(zeros({2, 3}, DType::i64), zeros({3, 2}, DType::i64)), DTypeError);
  EXPECT_THROW(matmul(zeros({2, 3}), empty({3, 2}, TensorOptions(DType::f32, Device::meta()))), DeviceError);
}

TEST(MatmulErrors, Bmm) {
  EXPECT_THROW(bmm(zeros({3, 4}), zeros({4, 5})), ShapeError);
  EXPECT_THROW(bmm(zeros({2, 3, 4}), zeros({3, 4, 5})), ShapeError);  // batch sizes differ
  EXPECT_THROW(bmm(zeros({2, 3, 4}), zeros({2, 5, 5})), ShapeError);
  EXPECT_THROW(bmm(zeros({2, 3, 4}), zeros({2, 4, 5}, DType::f64)), DTypeError);
  EXPECT_THROW(bmm(zeros({2, 3, 4}, DType::i32), zeros({2, 4, 5}, DType::i32)), DTypeError);
  EXPECT_THROW(bmm(zeros({2, 3, 4}), empty({2, 4, 5}, TensorOptions(DType::f32, Device::meta()))), DeviceError);
}

TEST(MatmulErrors, Linear) {
  EXPECT_THROW(linear(zeros({2, 5}), zeros({4, 6})), ShapeError);
  EXPECT_THROW(linear(zeros({2, 5}), zeros({4, 5, 1})), ShapeError);
  EXPECT_THROW(linear(zeros({2, 5}), zeros({4, 5}), zeros({3})), ShapeError);
  EXPECT_THROW(linear(zeros({}), zeros({4, 5})), ShapeError);
  EXPECT_THROW(linear(zeros({2, 5}), zeros({4, 5}, DType::f64)), DTypeError);
  EXPECT_THROW(linear(zeros({2, 5}), zeros({4, 5}), zeros({4}, DType::f64)), DTypeError);
  EXPECT_THROW(linear(zeros({2, 5}, DType::i32), zeros({4, 5}, DType::i32)), DTypeError);
  EXPECT_THROW(linear(zeros({2, 5}), zeros({4, 5}), empty({4}, TensorOptions(DType::f32, Device::meta()))),
               DeviceError);
}

TEST(MatmulMeta, ShapesOnlyOnMeta) {
  const TensorOptions meta(DType::f16, Device::meta());
  EXPECT_EQ(matmul(empty({2, 1, 5, 7}, meta), empty({3, 7, 6}, meta)).sizes(), Shape({2, 3, 5, 6}));
  EXPECT_EQ(matmul(empty({8, 16, 32}, meta), empty({32, 4}, meta)).sizes(), Shape({8, 16, 4}));
}

// Note [Bias inside the GEMM] (ember/kernels/ops_linalg.cpp): linear with a bias holds one result-sized tensor, the
// result (matmul then add held two), and its value is the product plus the bias, the bias the first term of each
// sum: in f32 equal to an f64 reference within the GEMM's rounding, in bf16 within one rounding of it.
TEST(LinearBias, OneResultSizedTensorAndTheBiasFirst) {
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  const Tensor x = rand_input({4096, 64}).to(DType::f32), w = rand_input({1024, 64}).to(DType::f32);
  const Tensor b = rand_input({1024}, 100.0, 200.0).to(DType::f32);
  alloc.reset_peak_stats();
  const int64_t before = alloc.stats().allocated_bytes;
  const Tensor y = ops::linear(x, w, b);
  const int64_t rise = alloc.stats().peak_allocated_bytes - before, result = 4096 * 1024 * 4;
  EXPECT_LT(rise, result + result / 4) << "linear's peak rise " << rise << " for a " << result << "-byte result";
  const Tensor want = ops::add(ops::matmul(x.to(DType::f64), w.to(DType::f64).t()), b.to(DType::f64));
  EXPECT_TRUE(allclose(y, want, {1e-6, 1e-5}));
  const Tensor yb = ops::linear(x.to(DType::bf16), w.to(DType::bf16), b.to(DType::bf16));
  const Tensor wantb = ops::add(ops::matmul(x.to(DType::bf16).to(DType::f64), w.to(DType::bf16).to(DType::f64).t()),
                                b.to(DType::bf16).to(DType::f64));
  EXPECT_TRUE(allclose(yb, wantb, {1.0 / 256, 0.0})) << "within one bf16 rounding of the exact sum";
}

}  // namespace
}  // namespace ember::testing
