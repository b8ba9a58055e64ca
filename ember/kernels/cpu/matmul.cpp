// CPU batched matmul through Eigen: each batch of a [B, M, K] and b [B, K, N] is mapped in place (row- or
// column-major with an outer stride, so transposed views need no copy; other strides are packed first) and
// multiplied into the contiguous out [B, M, N]. f16/bf16 are widened to f32 matrices, multiplied, rounded back.
#include <Eigen/Dense>

#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ColMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
template <class T>
using RowMap = Eigen::Map<const RowMat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using ColMap = Eigen::Map<const ColMat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using StridedMap = Eigen::Map<const RowMat<T>, Eigen::Unaligned, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>>;

// One matrix operand: rows x cols at p with element strides rs (between rows) and cs (between columns).
template <class T>
struct MatrixView {
  const T* p;
  int64_t rows, cols, rs, cs;
};

// Calls f with an Eigen expression for v: a row- or column-major map when one stride is unit (size-1 dims count as
// unit), else a packed row-major copy held in `scratch`.
template <class T, class F>
void with_eigen(const MatrixView<T>& v, RowMat<T>& scratch, F&& f) {
  if (v.cs == 1 || v.cols == 1) {
    f(RowMap<T>(v.p, v.rows, v.cols, Eigen::OuterStride<>(v.rows == 1 ? v.cols : v.rs)));
  } else if (v.rs == 1 || v.rows == 1) {
    f(ColMap<T>(v.p, v.rows, v.cols, Eigen::OuterStride<>(v.cols == 1 ? v.rows : v.cs)));
  } else {
    scratch = StridedMap<T>(v.p, v.rows, v.cols, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(v.rs, v.cs));
    f(RowMap<T>(scratch.data(), v.rows, v.cols, Eigen::OuterStride<>(v.cols)));
  }
}

// out (contiguous M x N) = a @ b, T = float or double.
template <class T>
void gemm(const MatrixView<T>& a, const MatrixView<T>& b, T* out, RowMat<T>& scratch_a, RowMat<T>& scratch_b) {
  Eigen::Map<RowMat<T>> c(out, a.rows, b.cols);
  if (a.cols == 0) {
    c.setZero();
    return;
  }
  with_eigen(a, scratch_a, [&](const auto& ma) {
    with_eigen(b, scratch_b, [&](const auto& mb) { c.noalias() = ma * mb; });
  });
}

// A 16-bit operand widened to a contiguous f32 matrix.
template <class T>
void widen(const T* p, int64_t rows, int64_t cols, int64_t rs, int64_t cs, RowMat<float>& dst) {
  dst.resize(rows, cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst(i, j) = static_cast<float>(p[i * rs + j * cs]);
}

template <class T>
void bmm_typed(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t B = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  T* po = static_cast<T*>(out.raw_data());
  const int64_t sa0 = a.stride(0), sa1 = a.stride(1), sa2 = a.stride(2);
  const int64_t sb0 = b.stride(0), sb1 = b.stride(1), sb2 = b.stride(2);
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    RowMat<T> scratch_a, scratch_b;
    for (int64_t i = 0; i < B; ++i) {
      gemm<T>({pa + i * sa0, M, K, sa1, sa2}, {pb + i * sb0, K, N, sb1, sb2}, po + i * M * N, scratch_a, scratch_b);
    }
  } else {
    RowMat<float> wa, wb, scratch_a, scratch_b, c(M, N);
    const bool b_shared = sb0 == 0;  // a broadcast right operand is widened once
    if (b_shared) widen(pb, K, N, sb1, sb2, wb);
    for (int64_t i = 0; i < B; ++i) {
      widen(pa + i * sa0, M, K, sa1, sa2, wa);
      if (!b_shared) widen(pb + i * sb0, K, N, sb1, sb2, wb);
      gemm<float>({wa.data(), M, K, K, 1}, {wb.data(), K, N, N, 1}, c.data(), scratch_a, scratch_b);
      T* dst = po + i * M * N;
      for (int64_t e = 0; e < M * N; ++e) dst[e] = T(c.data()[e]);
    }
  }
}

void bmm_kernel(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return;
  EMBER_DISPATCH_FLOAT(a.dtype(), "bmm", [&] { bmm_typed<scalar_t>(a, b, out); });
}

}  // namespace

EMBER_REGISTER_KERNEL(bmm, DeviceType::CPU, bmm_kernel);

}  // namespace ember::kernels::cpu
