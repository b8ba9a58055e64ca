// CPU batched matmul through Eigen: each batch of a [B, M, K] and b [B, K, N] is mapped in place (row- or
// column-major with an outer stride, so transposed views need no copy; other strides are packed first) and
// multiplied into the contiguous out [B, M, N]. f16/bf16 are widened to f32 matrices, multiplied, rounded back.
// Packing, staging and GEMM panel buffers are host-allocator tensors (Note [Kernel workspace] in conv_pool.cpp).
#include <Eigen/Dense>

#include <algorithm>
#include <type_traits>

#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/cpu/meta_workspace.h"
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

// Packing buffer for one operand: a host-allocator tensor made on first use and reused by every batch (the
// operand has the same shape in each).
template <class T>
class PackBuffer {
 public:
  T* get(int64_t n) {
    if (!holder_.defined()) holder_ = empty({n}, TensorOptions(dtype_of_v<T>, Device::cpu()));
    return static_cast<T*>(holder_.raw_data());
  }

 private:
  Tensor holder_;
};

// Calls f with an Eigen expression for v: a row- or column-major map when one stride is unit (size-1 dims count as
// unit), else a map of a packed row-major copy in `pack`.
template <class T, class F>
void with_eigen(const MatrixView<T>& v, PackBuffer<T>& pack, F&& f) {
  if (v.cs == 1 || v.cols == 1) {
    f(RowMap<T>(v.p, v.rows, v.cols, Eigen::OuterStride<>(v.rows == 1 ? v.cols : v.rs)));
  } else if (v.rs == 1 || v.rows == 1) {
    f(ColMap<T>(v.p, v.rows, v.cols, Eigen::OuterStride<>(v.cols == 1 ? v.rows : v.cs)));
  } else {
    T* buf = pack.get(v.rows * v.cols);
    Eigen::Map<RowMat<T>>(buf, v.rows, v.cols) =
        StridedMap<T>(v.p, v.rows, v.cols, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(v.rs, v.cs));
    f(RowMap<T>(buf, v.rows, v.cols, Eigen::OuterStride<>(v.cols)));
  }
}

// Note [GEMM panels from the allocator]
// Eigen's blocked GEMM packs cache-sized panels of both operands (kc x mc and kc x nc elements: several MiB for a
// large convolution) into buffers it would otherwise allocate itself, outside the allocator. With Eigen 3.4 a
// product that Eigen would run blocked is instead handed to Eigen's blocked GEMM routine
// (internal::general_matrix_matrix_product, the one `c.noalias() = a * b` reaches) with a level3_blocking whose
// panels are host-allocator tensors and whose block sizes come from the same computeProductBlockingSizes call, so
// the result is bit-identical. Products Eigen evaluates without panels (coefficient-based when K + M + N is below
// EIGEN_GEMM_TO_COEFFBASED_THRESHOLD, matrix-vector when M or N is 1) keep the ordinary expression, as does every
// product with another Eigen version or with Eigen's OpenMP parallel GEMM.
#if EIGEN_VERSION_AT_LEAST(3, 4, 0) && !EIGEN_VERSION_AT_LEAST(3, 4, 90) && !defined(EIGEN_HAS_OPENMP)
#define EMBER_GEMM_PANELS_FROM_ALLOCATOR 1
#else
#define EMBER_GEMM_PANELS_FROM_ALLOCATOR 0
#endif

// Panel buffers for the blocked GEMMs of one bmm call (every batch has the same M, N, K, so the same blocking).
template <class T>
class GemmPanels
#if EMBER_GEMM_PANELS_FROM_ALLOCATOR
    : public Eigen::internal::level3_blocking<T, T>
#endif
{
 public:
  // True when Eigen would run [M, K] x [K, N] as a blocked GEMM with packed panels.
  static bool blocked(int64_t m, int64_t n, int64_t k) {
    return EMBER_GEMM_PANELS_FROM_ALLOCATOR && m > 1 && n > 1 && k > 0 &&
           k + m + n >= EIGEN_GEMM_TO_COEFFBASED_THRESHOLD;
  }

  struct Blocking {
    int64_t kc, mc, nc;
    int64_t panel_a, panel_b;  // elements of the two panels
  };
  // The blocking as Eigen's gemm_blocking_space sizes it for a row-major destination (which runs the transposed,
  // column-major product: mc along N, nc along M). The routine packs at most kc x min(rows, mc) and
  // kc x min(cols, nc) elements (rows = N, cols = M).
  static Blocking sizes(int64_t m, int64_t n, int64_t k) {
#if EMBER_GEMM_PANELS_FROM_ALLOCATOR
    Eigen::Index kc = k, mc = n, nc = m;
    Eigen::internal::computeProductBlockingSizes<T, T, 1>(kc, mc, nc, Eigen::Index{1});
    return {kc, mc, nc, kc * std::min<int64_t>(n, mc), kc * std::min<int64_t>(m, nc)};
#else
    return {0, 0, 0, 0, 0};
#endif
  }

#if EMBER_GEMM_PANELS_FROM_ALLOCATOR
  // Takes the panels of sizes() from the host allocator on first use.
  Eigen::internal::level3_blocking<T, T>& blocking(int64_t m, int64_t n, int64_t k) {
    if (!panel_a_.defined()) {
      const Blocking b = sizes(m, n, k);
      this->m_kc = b.kc;
      this->m_mc = b.mc;
      this->m_nc = b.nc;
      panel_a_ = empty({b.panel_a}, TensorOptions(dtype_of_v<T>, Device::cpu()));
      panel_b_ = empty({b.panel_b}, TensorOptions(dtype_of_v<T>, Device::cpu()));
      this->m_blockA = static_cast<T*>(panel_a_.raw_data());
      this->m_blockB = static_cast<T*>(panel_b_.raw_data());
    }
    return *this;
  }

 private:
  Tensor panel_a_, panel_b_;  // 64-byte aligned (memory::kAlignment), as Eigen's packet loads require
#endif
};

// c = ma * mb through Eigen's blocked GEMM with the panels of `panels` (Note [GEMM panels from the allocator]).
template <class T, class MA, class MB>
void blocked_gemm(const MA& ma, const MB& mb, Eigen::Map<RowMat<T>>& c, GemmPanels<T>& panels) {
#if EMBER_GEMM_PANELS_FROM_ALLOCATOR
  constexpr int kLhsOrder = (MA::Flags & Eigen::RowMajorBit) ? Eigen::RowMajor : Eigen::ColMajor;
  constexpr int kRhsOrder = (MB::Flags & Eigen::RowMajorBit) ? Eigen::RowMajor : Eigen::ColMajor;
  using Gemm = Eigen::internal::general_matrix_matrix_product<Eigen::Index, T, kLhsOrder, false, T, kRhsOrder, false,
                                                              Eigen::RowMajor, 1>;
  const Eigen::Index m = c.rows(), n = c.cols(), k = ma.cols();
  c.setZero();  // the routine accumulates: c += alpha * a * b
  Gemm::run(m, n, k, ma.data(), ma.outerStride(), mb.data(), mb.outerStride(), c.data(), 1, c.outerStride(), T(1),
            panels.blocking(m, n, k));
#else
  (void)panels;
  c.noalias() = ma * mb;
#endif
}

// out (contiguous M x N) = a @ b, T = float or double.
template <class T>
void gemm(const MatrixView<T>& a, const MatrixView<T>& b, T* out, PackBuffer<T>& pack_a, PackBuffer<T>& pack_b,
          GemmPanels<T>& panels) {
  Eigen::Map<RowMat<T>> c(out, a.rows, b.cols);
  if (a.cols == 0) {
    c.setZero();
    return;
  }
  const bool blocked = GemmPanels<T>::blocked(a.rows, b.cols, a.cols);
  with_eigen(a, pack_a, [&](const auto& ma) {
    with_eigen(b, pack_b, [&](const auto& mb) {
      if (blocked) blocked_gemm<T>(ma, mb, c, panels);
      else c.noalias() = ma * mb;
    });
  });
}

// A 16-bit operand widened into the contiguous row-major f32 buffer dst.
template <class T>
void widen(const T* p, int64_t rows, int64_t cols, int64_t rs, int64_t cs, float* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = static_cast<float>(p[i * rs + j * cs]);
}

template <class T>
void bmm_typed(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t B = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  T* po = static_cast<T*>(out.raw_data());
  const int64_t sa0 = a.stride(0), sa1 = a.stride(1), sa2 = a.stride(2);
  const int64_t sb0 = b.stride(0), sb1 = b.stride(1), sb2 = b.stride(2);
  // An empty operand (K == 0) may have no storage (null base): its batch offsets are never applied (nothing is read).
  const int64_t step_a = pa == nullptr ? 0 : sa0, step_b = pb == nullptr ? 0 : sb0;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    PackBuffer<T> pack_a, pack_b;
    GemmPanels<T> panels;
    for (int64_t i = 0; i < B; ++i) {
      gemm<T>({pa + i * step_a, M, K, sa1, sa2}, {pb + i * step_b, K, N, sb1, sb2}, po + i * M * N, pack_a, pack_b,
              panels);
    }
  } else {
    // f32 staging: widened a [M, K], widened b [K, N] and the f32 product [M, N], in one workspace tensor.
    const Tensor staging = empty({M * K + K * N + M * N}, TensorOptions(DType::f32, Device::cpu()));
    float* wa = static_cast<float*>(staging.raw_data());
    float* wb = wa + M * K;
    float* c = wb + K * N;
    PackBuffer<float> unused_a, unused_b;  // the widened operands are contiguous: never packed
    GemmPanels<float> panels;
    const bool b_shared = sb0 == 0;        // a broadcast right operand is widened once
    if (b_shared) widen(pb, K, N, sb1, sb2, wb);
    for (int64_t i = 0; i < B; ++i) {
      widen(pa + i * step_a, M, K, sa1, sa2, wa);
      if (!b_shared) widen(pb + i * step_b, K, N, sb1, sb2, wb);
      gemm<float>({wa, M, K, K, 1}, {wb, K, N, N, 1}, c, unused_a, unused_b, panels);
      T* dst = po + i * M * N;
      for (int64_t e = 0; e < M * N; ++e) dst[e] = T(c[e]);
    }
  }
}

void bmm_kernel(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return;
  EMBER_DISPATCH_FLOAT(a.dtype(), "bmm", [&] { bmm_typed<scalar_t>(a, b, out); });
}

// ---- the same workspace on meta (Note [Meta kernels]) ---------------------------------------------------------------

// True when with_eigen packs the operand (neither stride is unit).
bool packs(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  return !(cs == 1 || cols == 1) && !(rs == 1 || rows == 1);
}

// What gemm takes on its first call, in gemm's order: a's packing, b's packing, then the two panels. Later calls of a
// bmm reuse them; all are freed when the bmm returns, last-taken first.
template <class T>
void take_gemm_workspace(MetaWorkspace& ws, int64_t M, int64_t K, int64_t N, int64_t a_rs, int64_t a_cs,
                         int64_t b_rs, int64_t b_cs) {
  if (K == 0) return;  // gemm zero-fills and returns
  if (packs(M, K, a_rs, a_cs)) ws.take(M * K, dtype_of_v<T>);
  if (packs(K, N, b_rs, b_cs)) ws.take(K * N, dtype_of_v<T>);
  if (GemmPanels<T>::blocked(M, N, K)) {
    const typename GemmPanels<T>::Blocking b = GemmPanels<T>::sizes(M, N, K);
    ws.take(b.panel_a, dtype_of_v<T>);
    ws.take(b.panel_b, dtype_of_v<T>);
  }
}

void bmm_meta_kernel(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return;
  replay_bmm_workspace(a.dtype(), a.size(1), a.size(2), b.size(2), a.stride(1), a.stride(2), b.stride(1), b.stride(2));
}

}  // namespace

void replay_bmm_workspace(DType dtype, int64_t M, int64_t K, int64_t N, int64_t a_rs, int64_t a_cs, int64_t b_rs,
                          int64_t b_cs) {
  MetaWorkspace ws;
  switch (dtype) {
    case DType::f32: take_gemm_workspace<float>(ws, M, K, N, a_rs, a_cs, b_rs, b_cs); break;
    case DType::f64: take_gemm_workspace<double>(ws, M, K, N, a_rs, a_cs, b_rs, b_cs); break;
    case DType::f16:
    case DType::bf16:
      // bmm_typed's f32 staging, then the f32 gemm of the contiguous widened operands.
      ws.take(M * K + K * N + M * N, DType::f32);
      take_gemm_workspace<float>(ws, M, K, N, K, 1, N, 1);
      break;
    default: EMBER_THROW(DTypeError, "bmm: expects a floating dtype, got ", dtype_name(dtype));
  }
}

EMBER_REGISTER_KERNEL(bmm, DeviceType::CPU, bmm_kernel);
EMBER_REGISTER_KERNEL(bmm, DeviceType::Meta, bmm_meta_kernel);

}  // namespace ember::kernels::cpu
