// CPU batched matmul through Eigen: each batch of a [B, M, K] and b [B, K, N] is mapped in place (row- or
// column-major with an outer stride, so transposed views need no copy; other strides are packed first) and
// multiplied into the contiguous out [B, M, N]. f16/bf16 are widened to f32 matrices, multiplied, rounded back.
// Large products run on the CPU threads with results independent of their number (Note [Parallel GEMM]).
// Packing, staging and GEMM panel buffers are host-allocator tensors (Note [Kernel workspace] in conv_pool.cpp).
#include <Eigen/Dense>
#include <algorithm>
#include <type_traits>
#include <vector>

#include "ember/core/parallel.h"
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
template <class T, class MA, class MB, class MC>
void blocked_gemm(const MA& ma, const MB& mb, MC& c, GemmPanels<T>& panels) {
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

// True when with_eigen packs the operand (neither stride is unit).
bool packs(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  return !(cs == 1 || cols == 1) && !(rs == 1 || rows == 1);
}

// c (a.rows x b.cols, row-major with row stride ldc) = a @ b, T = float or double. Takes a strided operand's packing
// buffer and the panels on first use (prepare_gemm takes them ahead, for a call inside a parallel chunk).
template <class T>
void gemm(const MatrixView<T>& a, const MatrixView<T>& b, T* out, int64_t ldc, PackBuffer<T>& pack_a,
          PackBuffer<T>& pack_b, GemmPanels<T>& panels) {
  Eigen::Map<RowMat<T>, Eigen::Unaligned, Eigen::OuterStride<>> c(out, a.rows, b.cols, Eigen::OuterStride<>(ldc));
  if (a.cols == 0) {
    c.setZero();
    return;
  }
  const bool blocked = GemmPanels<T>::blocked(a.rows, b.cols, a.cols);
  with_eigen(a, pack_a, [&](const auto& ma) {
    with_eigen(b, pack_b, [&](const auto& mb) {
      if (blocked)
        blocked_gemm<T>(ma, mb, c, panels);
      else
        c.noalias() = ma * mb;
    });
  });
}

// Takes what gemm would take on its first call for an [M, K] x [K, N] product with these operand strides.
template <class T>
void prepare_gemm(int64_t M, int64_t K, int64_t N, int64_t a_rs, int64_t a_cs, int64_t b_rs, int64_t b_cs,
                  PackBuffer<T>& pack_a, PackBuffer<T>& pack_b, GemmPanels<T>& panels) {
  if (K == 0) return;
  if (packs(M, K, a_rs, a_cs)) pack_a.get(M * K);
  if (packs(K, N, b_rs, b_cs)) pack_b.get(K * N);
#if EMBER_GEMM_PANELS_FROM_ALLOCATOR
  if (GemmPanels<T>::blocked(M, N, K)) panels.blocking(M, N, K);
#else
  (void)panels;
#endif
}

// Note [Parallel GEMM]
// A bmm with at least kParallelGemmMacs multiply-adds runs on the CPU threads (core/parallel.h). With B >= 2 the
// batches are split into chunks, each with its own packing buffers and panels. A single product (B == 1) is split
// along the larger of M and N into blocks of rows (boundaries multiples of kRowAlign) or columns (kColAlign), after a
// strided operand has been packed once; each block is one blocked Eigen GEMM with its own panels. Eigen's kc depends
// on K only, its register panels and cache blocks along a dimension are multiples of nr (rows of C) and mr (columns
// of C), and the split points are multiples of both, so each element is summed in the same order as by one GEMM over
// the whole matrix: results are bitwise independent of the thread count (tests/kernels/test_parallel_kernels.cpp).
// Blocks of at least kMinBlock rows/columns keep every block a blocked GEMM (never Eigen's coefficient-based or
// matrix-vector paths, which sum in another order). All workspace is taken on the calling thread before the chunks
// run, in chunk order; replay_bmm_workspace takes the same on meta.
constexpr int64_t kParallelGemmMacs = int64_t{1} << 18;
constexpr int64_t kRowAlign = 8;   // a multiple of Eigen's nr (4) for float and double
constexpr int64_t kColAlign = 48;  // a multiple of Eigen's mr for float and double with SSE, AVX2 or AVX-512
constexpr int64_t kMinBlock = 48;

struct GemmSplit {
  enum Kind { kSerial, kBatches, kRows, kCols } kind = kSerial;
  int64_t chunks = 1, extent = 1, align = 1;  // chunks over [0, extent), boundaries multiples of align
  int64_t begin(int64_t i) const { return parallel::chunk_begin(i, chunks, extent, align); }
};

GemmSplit plan_gemm_split(int64_t B, int64_t M, int64_t K, int64_t N) {
  GemmSplit s;
  if (M <= 1 || N <= 1 || K == 0 || B * M * N * K < kParallelGemmMacs || !GemmPanels<float>::blocked(M, N, K)) return s;
  if (B >= 2)
    s = {GemmSplit::kBatches, parallel::chunk_count(B, 1), B, 1};
  else if (M >= N)
    s = {GemmSplit::kRows, parallel::chunk_count(M, kMinBlock), M, kRowAlign};
  else
    s = {GemmSplit::kCols, parallel::chunk_count(N, kMinBlock), N, kColAlign};
  if (s.chunks <= 1) s = GemmSplit{};
  return s;
}

// out [B, M, N] (contiguous) = a @ b for f32/f64 matrices at pa/pb with batch steps and element strides.
template <class T>
void bmm_native(const T* pa, const T* pb, T* po, int64_t B, int64_t M, int64_t K, int64_t N, int64_t step_a,
                int64_t step_b, int64_t sa1, int64_t sa2, int64_t sb1, int64_t sb2) {
  const GemmSplit split = plan_gemm_split(B, M, K, N);
  if (split.kind == GemmSplit::kSerial) {
    PackBuffer<T> pack_a, pack_b;
    GemmPanels<T> panels;
    for (int64_t i = 0; i < B; ++i)
      gemm<T>({pa + i * step_a, M, K, sa1, sa2}, {pb + i * step_b, K, N, sb1, sb2}, po + i * M * N, N, pack_a, pack_b,
              panels);
    return;
  }
  const auto chunks = static_cast<size_t>(split.chunks);
  std::vector<PackBuffer<T>> pack_a(chunks), pack_b(chunks);
  std::vector<GemmPanels<T>> panels(chunks);
  if (split.kind == GemmSplit::kBatches) {
    for (size_t c = 0; c < chunks; ++c) prepare_gemm<T>(M, K, N, sa1, sa2, sb1, sb2, pack_a[c], pack_b[c], panels[c]);
    parallel::parallel_for(B, 1, 1, [&](int64_t c, int64_t b0, int64_t b1) {
      const auto u = static_cast<size_t>(c);
      for (int64_t i = b0; i < b1; ++i)
        gemm<T>({pa + i * step_a, M, K, sa1, sa2}, {pb + i * step_b, K, N, sb1, sb2}, po + i * M * N, N, pack_a[u],
                pack_b[u], panels[u]);
    });
    return;
  }
  // One product in row or column blocks: a strided operand is packed once, here, and shared by the blocks.
  PackBuffer<T> shared_a, shared_b;
  MatrixView<T> a{pa, M, K, sa1, sa2}, b{pb, K, N, sb1, sb2};
  auto pack_once = [](MatrixView<T>& v, PackBuffer<T>& buf) {
    if (!packs(v.rows, v.cols, v.rs, v.cs)) return;
    T* dst = buf.get(v.rows * v.cols);
    for (int64_t r = 0; r < v.rows; ++r)
      for (int64_t q = 0; q < v.cols; ++q) dst[r * v.cols + q] = v.p[r * v.rs + q * v.cs];
    v = {dst, v.rows, v.cols, v.cols, 1};
  };
  pack_once(a, shared_a);
  pack_once(b, shared_b);
  const bool rows = split.kind == GemmSplit::kRows;
  for (size_t c = 0; c < chunks; ++c) {
    const int64_t ext = split.begin(static_cast<int64_t>(c) + 1) - split.begin(static_cast<int64_t>(c));
    if (ext > 0)
      prepare_gemm<T>(rows ? ext : M, K, rows ? N : ext, a.rs, a.cs, b.rs, b.cs, pack_a[c], pack_b[c], panels[c]);
  }
  parallel::parallel_for(split.extent, kMinBlock, split.align, [&](int64_t c, int64_t lo, int64_t hi) {
    const auto u = static_cast<size_t>(c);
    if (rows)
      gemm<T>({a.p + lo * a.rs, hi - lo, K, a.rs, a.cs}, b, po + lo * N, N, pack_a[u], pack_b[u], panels[u]);
    else
      gemm<T>(a, {b.p + lo * b.cs, K, hi - lo, b.rs, b.cs}, po + lo, N, pack_a[u], pack_b[u], panels[u]);
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
    bmm_native<T>(pa, pb, po, B, M, K, N, step_a, step_b, sa1, sa2, sb1, sb2);
  } else {
    // f32 staging: widened a [M, K], widened b [K, N] and the f32 product [M, N], in one workspace tensor; each
    // batch is one f32 bmm_native call.
    const Tensor staging = empty({M * K + K * N + M * N}, TensorOptions(DType::f32, Device::cpu()));
    float* wa = static_cast<float*>(staging.raw_data());
    float* wb = wa + M * K;
    float* c = wb + K * N;
    const bool b_shared = sb0 == 0;  // a broadcast right operand is widened once
    if (b_shared) widen(pb, K, N, sb1, sb2, wb);
    for (int64_t i = 0; i < B; ++i) {
      widen(pa + i * step_a, M, K, sa1, sa2, wa);
      if (!b_shared) widen(pb + i * step_b, K, N, sb1, sb2, wb);
      bmm_native<float>(wa, wb, c, 1, M, K, N, 0, 0, K, 1, N, 1);
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

// What one gemm takes on its first call, in gemm's order: a's packing, b's packing, then the two panels.
template <class T>
void take_gemm_workspace(MetaWorkspace& ws, int64_t M, int64_t K, int64_t N, int64_t a_rs, int64_t a_cs, int64_t b_rs,
                         int64_t b_cs) {
  if (K == 0) return;  // gemm zero-fills and returns
  if (packs(M, K, a_rs, a_cs)) ws.take(M * K, dtype_of_v<T>);
  if (packs(K, N, b_rs, b_cs)) ws.take(K * N, dtype_of_v<T>);
  if (GemmPanels<T>::blocked(M, N, K)) {
    const typename GemmPanels<T>::Blocking b = GemmPanels<T>::sizes(M, N, K);
    ws.take(b.panel_a, dtype_of_v<T>);
    ws.take(b.panel_b, dtype_of_v<T>);
  }
}

// bmm_native's workspace (Note [Parallel GEMM]): one gemm's when serial (later batches reuse it), else each chunk's
// in chunk order, after the operands packed once for a split product. All of it is freed when the call returns.
template <class T>
void take_bmm_native_workspace(MetaWorkspace& ws, int64_t B, int64_t M, int64_t K, int64_t N, int64_t a_rs,
                               int64_t a_cs, int64_t b_rs, int64_t b_cs) {
  const GemmSplit split = plan_gemm_split(B, M, K, N);
  if (split.kind == GemmSplit::kSerial) return take_gemm_workspace<T>(ws, M, K, N, a_rs, a_cs, b_rs, b_cs);
  if (split.kind == GemmSplit::kBatches) {
    for (int64_t c = 0; c < split.chunks; ++c) take_gemm_workspace<T>(ws, M, K, N, a_rs, a_cs, b_rs, b_cs);
    return;
  }
  if (packs(M, K, a_rs, a_cs)) {
    ws.take(M * K, dtype_of_v<T>);
    a_rs = K, a_cs = 1;
  }
  if (packs(K, N, b_rs, b_cs)) {
    ws.take(K * N, dtype_of_v<T>);
    b_rs = N, b_cs = 1;
  }
  const bool rows = split.kind == GemmSplit::kRows;
  for (int64_t c = 0; c < split.chunks; ++c) {
    const int64_t ext = split.begin(c + 1) - split.begin(c);
    if (ext > 0) take_gemm_workspace<T>(ws, rows ? ext : M, K, rows ? N : ext, a_rs, a_cs, b_rs, b_cs);
  }
}

void bmm_meta_kernel(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return;
  replay_bmm_workspace(a.dtype(), a.size(0), a.size(1), a.size(2), b.size(2), a.stride(1), a.stride(2), b.stride(1),
                       b.stride(2));
}

}  // namespace

void replay_bmm_workspace(DType dtype, int64_t B, int64_t M, int64_t K, int64_t N, int64_t a_rs, int64_t a_cs,
                          int64_t b_rs, int64_t b_cs) {
  MetaWorkspace ws;
  switch (dtype) {
    case DType::f32:
      take_bmm_native_workspace<float>(ws, B, M, K, N, a_rs, a_cs, b_rs, b_cs);
      break;
    case DType::f64:
      take_bmm_native_workspace<double>(ws, B, M, K, N, a_rs, a_cs, b_rs, b_cs);
      break;
    case DType::f16:
    case DType::bf16:
      // bmm_typed's f32 staging, then one batch's bmm_native of the contiguous widened operands.
      ws.take(M * K + K * N + M * N, DType::f32);
      take_bmm_native_workspace<float>(ws, 1, M, K, N, K, 1, N, 1);
      break;
    default:
      EMBER_THROW(DTypeError, "bmm: expects a floating dtype, got ", dtype_name(dtype));
  }
}

EMBER_REGISTER_KERNEL(bmm, DeviceType::CPU, bmm_kernel);
EMBER_REGISTER_KERNEL(bmm, DeviceType::Meta, bmm_meta_kernel);

}  // namespace ember::kernels::cpu
