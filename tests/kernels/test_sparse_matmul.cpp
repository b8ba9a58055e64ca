// CSR storage and sparse x dense products (ops_sparse.h): dense_to_csr against a hand-written matrix, the default
// index dtypes, csr_linear / csr_matmul against naive float64 loops over the dense matrix (i16 and i32 indices,
// empty rows, an all-zero matrix, a batch of 1, 3-d inputs), the Eigen and hand-written paths against each other,
// the typed errors of bad arguments and malformed matrices (validate), and the workspace a dry run on meta predicts.
#include <gtest/gtest.h>

#include <vector>

#include "ember/core/meta_scope.h"
#include "ember/ember.h"
#include "ember/kernels/ops_sparse.h"
#include "ember/memory/cpu_allocator.h"
#include "tests/harness/op_harness.h"
#include "tests/kernels/compression_test_util.h"

namespace ember {
namespace {

using ::ember::testing::allclose;
using ::ember::testing::error_message;
using ::ember::testing::naive_linear;
using ::ember::testing::naive_matmul;
using ::ember::testing::rand_input_seeded;
using ::ember::testing::random_sparse;
using ::ember::testing::Tolerance;

Tolerance tol_for(DType dt) { return dt == DType::f64 ? Tolerance{1e-12, 1e-12} : Tolerance{1e-5, 1e-5}; }

TEST(CsrStorage, HandWrittenMatrix) {
  const Tensor dense = from_vector<float>({0, 1.5f, 0, 0, 0, 0, -2, 0, 3}, {3, 3});
  const CsrMatrix m = ops::dense_to_csr(dense);
  EXPECT_EQ(m.rows, 3);
  EXPECT_EQ(m.cols, 3);
  EXPECT_EQ(m.nnz(), 3);
  EXPECT_EQ(m.values.to_vector<float>(), (std::vector<float>{1.5f, -2, 3}));
  EXPECT_EQ(m.col_indices.dtype(), DType::i16);
  EXPECT_EQ(m.col_indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 2}));
  EXPECT_EQ(m.row_ptr.dtype(), DType::i32);
  EXPECT_EQ(m.row_ptr.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 1, 3}));
  EXPECT_EQ(m.nbytes(), 3 * 4 + 3 * 2 + 4 * 4);
  EXPECT_TRUE(allclose(ops::csr_to_dense(m), dense, {0, 0}));

  const CsrMatrix m32 = ops::dense_to_csr(dense, DType::i32);
  EXPECT_EQ(m32.col_indices.dtype(), DType::i32);
  EXPECT_EQ(m32.nbytes(), 3 * 4 + 3 * 4 + 4 * 4);
  EXPECT_TRUE(allclose(ops::csr_to_dense(m32), dense, {0, 0}));
}

TEST(CsrStorage, RoundTripAndIndexDtypes) {
  const Tensor dense = random_sparse(9, 17, 0.3, 11, {0, 4, 8}).to(DType::f32);
  for (DType idx : {DType::i16, DType::i32}) {
    const CsrMatrix m = ops::dense_to_csr(dense, idx);
    EXPECT_NO_THROW(ops::validate(m));
    EXPECT_TRUE(allclose(ops::csr_to_dense(m), dense, {0, 0})) << dtype_name(idx);
  }
  // Columns 0..32767 fit i16; one more column needs i32.
  EXPECT_EQ(ops::dense_to_csr(zeros({1, 32768})).col_indices.dtype(), DType::i16);
  EXPECT_EQ(ops::dense_to_csr(zeros({1, 32769})).col_indices.dtype(), DType::i32);
  EXPECT_NE(error_message<ValueError>([] { ops::dense_to_csr(zeros({1, 32769}), DType::i16); }).find("i16"),
            std::string::npos);
  error_message<DTypeError>([] { ops::dense_to_csr(zeros({2, 2}), DType::i64); });
  error_message<ShapeError>([] { ops::dense_to_csr(zeros({2, 2, 2})); });
  error_message<DTypeError>([] { ops::dense_to_csr(zeros({2, 2}, {DType::i32})); });
  // An all-zero matrix has nnz 0 and a row_ptr of zeros.
  const CsrMatrix empty_m = ops::dense_to_csr(zeros({4, 5}));
  EXPECT_EQ(empty_m.nnz(), 0);
  EXPECT_EQ(empty_m.row_ptr.to_vector<int64_t>(), (std::vector<int64_t>(5, 0)));
}

class CsrProduct : public ::ember::testing::DeviceTest {};

TEST_P(CsrProduct, LinearMatchesNaiveLoops) {
  EMBER_REQUIRE_KERNEL(csr_linear_stub);
  uint64_t seed = 100;
  for (DType dt : {DType::f32, DType::f64})
    for (DType idx : {DType::i16, DType::i32})
      for (int64_t B : {1, 3, 6})      // 1 and 3: the gather path; 6: the transposed path (Note in sparse_matmul.cpp)
        for (bool with_bias : {false, true}) {
          const int64_t K = 13, N = 7;
          const Tensor w = random_sparse(N, K, 0.35, ++seed, {2, 6}).to(dt).to(DType::f64);
          const Tensor x = rand_input_seeded({B, K}, ++seed).to(dt).to(DType::f64);
          const Tensor bias = with_bias ? rand_input_seeded({N}, ++seed).to(dt).to(DType::f64) : Tensor();
          const CsrMatrix m = ops::dense_to_csr(w.to(device(), dt), idx);
          const Tensor y = ops::csr_linear(x.to(device(), dt), m, with_bias ? bias.to(device(), dt) : Tensor());
          EXPECT_EQ(y.dtype(), dt);
          EXPECT_TRUE(allclose(y, naive_linear(x, w, bias), tol_for(dt)))
              << dtype_name(dt) << " " << dtype_name(idx) << " B=" << B << " bias=" << with_bias;
        }
}

TEST_P(CsrProduct, LinearTakesLeadingBatchDims) {
  EMBER_REQUIRE_KERNEL(csr_linear_stub);
  const Tensor w = random_sparse(5, 8, 0.5, 7).to(DType::f32).to(DType::f64);
  const Tensor x = rand_input_seeded({2, 3, 8}, 8).to(DType::f32).to(DType::f64);
  const Tensor bias = rand_input_seeded({5}, 9).to(DType::f32).to(DType::f64);
  for (DType idx : {DType::i16, DType::i32}) {
    const Tensor y = ops::csr_linear(x.to(device(), DType::f32), ops::dense_to_csr(w.to(device(), DType::f32), idx),
                                     bias.to(device(), DType::f32));
    ASSERT_EQ(y.sizes(), (Shape{2, 3, 5}));
    EXPECT_TRUE(allclose(y.reshape({6, 5}), naive_linear(x.reshape({6, 8}), w, bias), tol_for(DType::f32)));
  }
  // A non-contiguous input is read through a contiguous copy.
  const Tensor xt = rand_input_seeded({8, 4}, 10).to(DType::f32);
  const Tensor y = ops::csr_linear(xt.to(device()).t(), ops::dense_to_csr(w.to(device(), DType::f32)));
  EXPECT_TRUE(allclose(y, naive_linear(xt.t().contiguous().to(DType::f64), w, Tensor()), tol_for(DType::f32)));
}

TEST_P(CsrProduct, AllZeroMatrixGivesTheBias) {
  EMBER_REQUIRE_KERNEL(csr_linear_stub);
  const Tensor bias = from_vector<float>({1, -2, 3}, {3}).to(device());
  for (DType idx : {DType::i16, DType::i32})
    for (int64_t B : {1, 5}) {
      const CsrMatrix m = ops::dense_to_csr(zeros({3, 4}, {DType::f32, device()}), idx);
      const Tensor x = ones({B, 4}, {DType::f32, device()});
      const Tensor y = ops::csr_linear(x, m, bias);
      EXPECT_TRUE(allclose(y, from_vector<double>({1, -2, 3}, {1, 3}).expand({B, 3}), {0, 0}));
      EXPECT_TRUE(allclose(ops::csr_linear(x, m), zeros({B, 3}), {0, 0}));
    }
}

TEST_P(CsrProduct, MatmulMatchesNaiveLoops) {
  EMBER_REQUIRE_KERNEL(csr_matmul_stub);
  uint64_t seed = 500;
  for (DType dt : {DType::f32, DType::f64})
    for (DType idx : {DType::i16, DType::i32})
      for (int64_t N : {1, 5}) {
        const Tensor a = random_sparse(6, 9, 0.3, ++seed, {0, 5}).to(dt).to(DType::f64);
        const Tensor d = rand_input_seeded({9, N}, ++seed).to(dt).to(DType::f64);
        const Tensor y = ops::csr_matmul(ops::dense_to_csr(a.to(device(), dt), idx), d.to(device(), dt));
        EXPECT_TRUE(allclose(y, naive_matmul(a, d), tol_for(dt))) << dtype_name(dt) << " " << dtype_name(idx);
      }
  const CsrMatrix z = ops::dense_to_csr(zeros({3, 4}, {DType::f32, device()}));
  EXPECT_TRUE(allclose(ops::csr_matmul(z, ones({4, 2}, {DType::f32, device()})), zeros({3, 2}), {0, 0}));
}

TEST_P(CsrProduct, EigenAndHandWrittenPathsAgree) {
  EMBER_REQUIRE_KERNEL(csr_linear_stub);
  const Tensor w = random_sparse(31, 40, 0.5, 77).to(DType::f32).to(device());
  const Tensor x = rand_input_seeded({8, 40}, 78).to(DType::f32).to(device());
  const Tensor d = rand_input_seeded({40, 6}, 79).to(DType::f32).to(device());
  const CsrMatrix m16 = ops::dense_to_csr(w, DType::i16), m32 = ops::dense_to_csr(w, DType::i32);
  EXPECT_TRUE(allclose(ops::csr_linear(x, m16), ops::csr_linear(x, m32), {1e-6, 1e-6}));
  EXPECT_TRUE(allclose(ops::csr_matmul(m16, d), ops::csr_matmul(m32, d), {1e-6, 1e-6}));
}

TEST_P(CsrProduct, BadArgumentsRaiseTypedErrors) {
  EMBER_REQUIRE_KERNEL(csr_linear_stub);
  const CsrMatrix m = ops::dense_to_csr(random_sparse(4, 6, 0.5, 3).to(DType::f32).to(device()));
  const Tensor x = ones({2, 6}, {DType::f32, device()});
  EXPECT_NE(error_message<ShapeError>([&] { ops::csr_linear(ones({2, 5}, {DType::f32, device()}), m); })
                .find("in_features 6"),
            std::string::npos);
  error_message<DTypeError>([&] { ops::csr_linear(x.to(DType::f64), m); });
  error_message<ShapeError>([&] { ops::csr_linear(x, m, ones({3}, {DType::f32, device()})); });
  error_message<DTypeError>([&] { ops::csr_linear(x, m, ones({4}, {DType::f64, device()})); });
  error_message<DeviceError>([&] { ops::csr_linear(empty({2, 6}, {DType::f32, Device::meta()}), m); });
  error_message<ShapeError>([&] { ops::csr_matmul(m, ones({5, 2}, {DType::f32, device()})); });
  error_message<DTypeError>([&] { ops::csr_matmul(m, ones({6, 2}, {DType::f64, device()})); });
  // f16 values: no CPU kernel for them.
  if (device().is_cpu()) {
    const CsrMatrix h = ops::dense_to_csr(ones({2, 3}, {DType::f16}));
    EXPECT_NE(error_message<DTypeError>([&] { ops::csr_linear(ones({1, 3}, {DType::f16}), h); }).find("f32 or f64"),
              std::string::npos);
  }
}

EMBER_INSTANTIATE_DEVICE_TESTS(CsrProduct);

// A hand-built 2x4 matrix [[0, 5, 0, 6], [7, 0, 0, 0]] with one field broken at a time.
CsrMatrix hand_csr() {
  CsrMatrix m;
  m.values = from_vector<float>({5, 6, 7}, {3});
  m.col_indices = from_vector<int32_t>({1, 3, 0}, {3});
  m.row_ptr = from_vector<int32_t>({0, 2, 3}, {3});
  m.rows = 2;
  m.cols = 4;
  return m;
}

TEST(CsrValidate, AcceptsAGoodMatrixAndRejectsMalformedOnes) {
  CsrMatrix good = hand_csr();
  EXPECT_NO_THROW(ops::validate(good));
  EXPECT_TRUE(allclose(ops::csr_to_dense(good), from_vector<double>({0, 5, 0, 6, 7, 0, 0, 0}, {2, 4}), {0, 0}));

  CsrMatrix m = hand_csr();
  m.row_ptr = from_vector<int32_t>({0, 3, 2}, {3});  // not monotone (and last != nnz)
  error_message<ValueError>([&] { ops::validate(m); });
  m.row_ptr = from_vector<int32_t>({0, 2, 3, 3}, {4});  // wrong length for 2 rows
  error_message<ShapeError>([&] { ops::validate(m); });
  m.row_ptr = from_vector<int32_t>({0, 2, 2}, {3});  // last != nnz
  EXPECT_NE(error_message<ValueError>([&] { ops::validate(m); }).find("nnz"), std::string::npos);
  m.row_ptr = from_vector<int32_t>({1, 2, 3}, {3});  // first != 0
  error_message<ValueError>([&] { ops::validate(m); });
  m.row_ptr = from_vector<int32_t>({0, 2, 1}, {3});  // decreasing at the end
  error_message<ValueError>([&] { ops::validate(m); });

  m = hand_csr();
  m.col_indices = from_vector<int32_t>({1, 4, 0}, {3});  // column 4 of 4
  EXPECT_NE(error_message<IndexError>([&] { ops::validate(m); }).find("out of range"), std::string::npos);
  m.col_indices = from_vector<int32_t>({1, -1, 0}, {3});
  error_message<IndexError>([&] { ops::validate(m); });
  m.col_indices = from_vector<int32_t>({3, 1, 0}, {3});  // unsorted row
  error_message<ValueError>([&] { ops::validate(m); });
  m.col_indices = from_vector<int64_t>({1, 3, 0}, {3});  // i64 indices are not a CSR index dtype here
  error_message<DTypeError>([&] { ops::validate(m); });
  m.col_indices = from_vector<int32_t>({1, 3}, {2});  // one index short
  error_message<ShapeError>([&] { ops::validate(m); });

  m = hand_csr();
  m.values = from_vector<int32_t>({5, 6, 7}, {3});
  error_message<DTypeError>([&] { ops::validate(m); });
  m = hand_csr();
  m.values = Tensor();
  error_message<ValueError>([&] { ops::validate(m); });
}

// Note [Meta kernels]: csr_linear on meta takes what the CPU run takes (output, and the transposed operands of the
// loops path), measured as the rise of each allocator's high-water mark.
TEST(CsrMeta, DryRunTakesTheCpuWorkspace) {
  for (DType idx : {DType::i16, DType::i32})
    for (int64_t B : {2, 6}) {
      SCOPED_TRACE(std::string(dtype_name(idx)) + " B=" + std::to_string(B));
      const int64_t K = 13, N = 7;
      const CsrMatrix m = ops::dense_to_csr(random_sparse(N, K, 0.4, 61).to(DType::f32), idx);
      auto rise = [&](memory::Allocator& a, const Tensor& x, const CsrMatrix& w) {
        a.reset_peak_stats();
        const int64_t before = a.stats().allocated_bytes;
        { const Tensor y = ops::csr_linear(x, w); }
        return a.stats().peak_allocated_bytes - before;
      };
      const int64_t cpu = rise(memory::cpu_allocator(), rand_input_seeded({B, K}, 62).to(DType::f32), m);
      MetaAllocationScope scope;
      CsrMatrix mm;
      mm.rows = N;
      mm.cols = K;
      mm.values = empty({m.nnz()}, {DType::f32, Device::meta()});
      mm.col_indices = empty({m.nnz()}, {idx, Device::meta()});
      mm.row_ptr = empty({N + 1}, {DType::i32, Device::meta()});
      const int64_t meta = rise(scope.allocator(), empty({B, K}, {DType::f32, Device::meta()}), mm);
      EXPECT_GT(cpu, 0);
      EXPECT_EQ(meta, cpu);
    }
}

}  // namespace
}  // namespace ember
