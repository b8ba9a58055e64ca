// CPU kernels of the CSR products (ops_sparse.h): y = x W^T + b (csr_linear) and A @ dense (csr_matmul), in f32 or
// f64. i32 column indices with an i32 row_ptr go through Eigen (a Map of a RowMajor SparseMatrix over the tensors'
// data); i16 indices (and i64 row_ptr) through the hand-written loops below. Invariant: the CSR structure was
// checked by the front end's caller (ops::validate), so the loops index without bounds checks.
#include <Eigen/Dense>
#include <Eigen/SparseCore>

#include <type_traits>

#include "ember/kernels/cpu/meta_workspace.h"
#include "ember/kernels/ops_sparse.h"

namespace ember::kernels::cpu {
namespace {

// Note [CSR linear loop order]
// y [B, N] = x [B, K] W^T with W [N, K] in CSR reads, for output (b, n), x[b, k] at the nonzero columns k of row n:
// a gather. For a small batch that dot product per (b, n) is all there is to it. From kCsrTransposeBatch rows on,
// the kernel transposes x into xt [K, B] (workspace) and computes yt [N, B] row by row as yt[n, :] += v * xt[k, :]
// over the nonzeros (k, v) of row n — a contiguous axpy over the batch that vectorises — then transposes yt into y.
constexpr int64_t kCsrTransposeBatch = 4;

template <class T, class I, class P>
void csr_linear_loops(const Tensor& x, const Tensor& values, const Tensor& col_indices, const Tensor& row_ptr,
                      const Tensor& bias, const Tensor& out) {
  const int64_t B = x.size(0), K = x.size(1), N = out.size(1);
  const T* xp = static_cast<const T*>(x.raw_data());
  const T* v = static_cast<const T*>(values.raw_data());
  const I* ci = static_cast<const I*>(col_indices.raw_data());
  const P* rp = static_cast<const P*>(row_ptr.raw_data());
  const T* bp = bias.defined() ? static_cast<const T*>(bias.raw_data()) : nullptr;
  T* y = static_cast<T*>(out.raw_data());
  if (B < kCsrTransposeBatch) {
    for (int64_t b = 0; b < B; ++b) {
      const T* xr = xp + b * K;
      for (int64_t n = 0; n < N; ++n) {
        T acc = bp != nullptr ? bp[n] : T(0);
        for (P k = rp[n]; k < rp[n + 1]; ++k) acc += v[k] * xr[ci[k]];
        y[b * N + n] = acc;
      }
    }
    return;
  }
  Tensor xt_t = empty({K * B}, {x.dtype(), Device::cpu()});
  Tensor yt_t = empty({N * B}, {x.dtype(), Device::cpu()});
  T* xt = static_cast<T*>(xt_t.raw_data());
  T* yt = static_cast<T*>(yt_t.raw_data());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < K; ++k) xt[k * B + b] = xp[b * K + k];
  for (int64_t n = 0; n < N; ++n) {
    T* row = yt + n * B;
    const T init = bp != nullptr ? bp[n] : T(0);
    for (int64_t b = 0; b < B; ++b) row[b] = init;
    for (P k = rp[n]; k < rp[n + 1]; ++k) {
      const T w = v[k];
      const T* src = xt + static_cast<int64_t>(ci[k]) * B;
      for (int64_t b = 0; b < B; ++b) row[b] += w * src[b];
    }
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n) y[b * N + n] = yt[n * B + b];
}

template <class T, class I, class P>
void csr_matmul_loops(const Tensor& values, const Tensor& col_indices, const Tensor& row_ptr, const Tensor& dense,
                      const Tensor& out) {
  const int64_t M = out.size(0), N = out.size(1);
  const T* v = static_cast<const T*>(values.raw_data());
  const I* ci = static_cast<const I*>(col_indices.raw_data());
  const P* rp = static_cast<const P*>(row_ptr.raw_data());
  const T* d = static_cast<const T*>(dense.raw_data());
  T* o = static_cast<T*>(out.raw_data());
  for (int64_t m = 0; m < M; ++m) {
    T* row = o + m * N;
    for (int64_t j = 0; j < N; ++j) row[j] = T(0);
    for (P k = rp[m]; k < rp[m + 1]; ++k) {
      const T w = v[k];
      const T* src = d + static_cast<int64_t>(ci[k]) * N;
      for (int64_t j = 0; j < N; ++j) row[j] += w * src[j];
    }
  }
}

template <class T>
using SparseRowMajor = Eigen::SparseMatrix<T, Eigen::RowMajor, int32_t>;
template <class T>
using ColMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
template <class T>
using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The CSR tensors of a [rows, cols] matrix as an Eigen sparse matrix, without a copy.
template <class T>
Eigen::Map<const SparseRowMajor<T>> map_csr(int64_t rows, int64_t cols, const Tensor& values,
                                            const Tensor& col_indices, const Tensor& row_ptr) {
  return Eigen::Map<const SparseRowMajor<T>>(rows, cols, values.numel(),
                                             static_cast<const int32_t*>(row_ptr.raw_data()),
                                             static_cast<const int32_t*>(col_indices.raw_data()),
                                             static_cast<const T*>(values.raw_data()));
}

template <class T>
void csr_linear_eigen(const Tensor& x, const Tensor& values, const Tensor& col_indices, const Tensor& row_ptr,
                      const Tensor& bias, const Tensor& out) {
  const int64_t B = x.size(0), K = x.size(1), N = out.size(1);
  const auto W = map_csr<T>(N, K, values, col_indices, row_ptr);
  // x [B, K] row-major is x^T [K, B] column-major; y [B, N] row-major is y^T [N, B] column-major: y^T = W x^T.
  Eigen::Map<const ColMajorMatrix<T>> xt(static_cast<const T*>(x.raw_data()), K, B);
  Eigen::Map<ColMajorMatrix<T>> yt(static_cast<T*>(out.raw_data()), N, B);
  yt.noalias() = W * xt;
  if (bias.defined()) {
    Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>> b(static_cast<const T*>(bias.raw_data()), N);
    yt.colwise() += b;
  }
}

template <class T>
void csr_matmul_eigen(const Tensor& values, const Tensor& col_indices, const Tensor& row_ptr, const Tensor& dense,
                      const Tensor& out) {
  const int64_t M = out.size(0), K = dense.size(0), N = out.size(1);
  const auto A = map_csr<T>(M, K, values, col_indices, row_ptr);
  Eigen::Map<const RowMajorMatrix<T>> d(static_cast<const T*>(dense.raw_data()), K, N);
  Eigen::Map<RowMajorMatrix<T>> o(static_cast<T*>(out.raw_data()), M, N);
  o.noalias() = A * d;
}

// Calls f.template operator()<T, I, P>() for the value, index and row_ptr dtypes (f32/f64, i16/i32, i32/i64).
template <class F>
void dispatch_csr(const char* op, const Tensor& values, const Tensor& col_indices, const Tensor& row_ptr, F&& f) {
  auto with_t = [&]<class T>() {
    auto with_i = [&]<class I>() {
      if (row_ptr.dtype() == DType::i32)
        f.template operator()<T, I, int32_t>();
      else
        f.template operator()<T, I, int64_t>();
    };
    if (col_indices.dtype() == DType::i16)
      with_i.template operator()<int16_t>();
    else
      with_i.template operator()<int32_t>();
  };
  switch (values.dtype()) {
    case DType::f32: with_t.template operator()<float>(); break;
    case DType::f64: with_t.template operator()<double>(); break;
    default:
      EMBER_THROW(DTypeError, op, ": the CPU kernel takes f32 or f64 values, got ", values.description(),
                  "; convert the CSR values and the input with .to(f32)");
  }
}

void csr_linear_kernel(const Tensor& x, const Tensor& values, const Tensor& col_indices, const Tensor& row_ptr,
                       const Tensor& bias, const Tensor& out) {
  dispatch_csr("csr_linear", values, col_indices, row_ptr, [&]<class T, class I, class P>() {
    if constexpr (std::is_same_v<I, int32_t> && std::is_same_v<P, int32_t>)
      csr_linear_eigen<T>(x, values, col_indices, row_ptr, bias, out);
    else
      csr_linear_loops<T, I, P>(x, values, col_indices, row_ptr, bias, out);
  });
}

void csr_matmul_kernel(const Tensor& values, const Tensor& col_indices, const Tensor& row_ptr, const Tensor& dense,
                       const Tensor& out) {
  dispatch_csr("csr_matmul", values, col_indices, row_ptr, [&]<class T, class I, class P>() {
    if constexpr (std::is_same_v<I, int32_t> && std::is_same_v<P, int32_t>)
      csr_matmul_eigen<T>(values, col_indices, row_ptr, dense, out);
    else
      csr_matmul_loops<T, I, P>(values, col_indices, row_ptr, dense, out);
  });
}

// csr_linear's workspace on meta (Note [Meta kernels] in kernels/stubs.h): the transposed operands of the loops
// path (Note [CSR linear loop order]); the Eigen path takes none from the allocator.
void csr_linear_meta_kernel(const Tensor& x, const Tensor& values, const Tensor& col_indices, const Tensor& row_ptr,
                            const Tensor& bias, const Tensor& out) {
  const bool eigen = col_indices.dtype() == DType::i32 && row_ptr.dtype() == DType::i32;
  const int64_t B = x.size(0), K = x.size(1), N = out.size(1);
  if (eigen || B < kCsrTransposeBatch) return;
  MetaWorkspace ws;
  ws.take(K * B, x.dtype());
  ws.take(N * B, x.dtype());
}

}  // namespace

EMBER_REGISTER_KERNEL(csr_linear, DeviceType::CPU, csr_linear_kernel);
EMBER_REGISTER_KERNEL(csr_linear, DeviceType::Meta, csr_linear_meta_kernel);
EMBER_REGISTER_KERNEL(csr_matmul, DeviceType::CPU, csr_matmul_kernel);

}  // namespace ember::kernels::cpu
