// CPU GEMM through Eigen for f32/f64 (gemm.h): operands mapped in place (row- or column-major with an outer stride,
// so transposed views need no copy; other strides are packed first), Eigen's blocked GEMM with panels from the host
// allocator, and the split of one product over the CPU threads (Note [Parallel GEMM]). Used by the bmm kernel
// (matmul.cpp) and by the kernels that run many products of one shape (convolutions, int8 linear).
#include "ember/kernels/cpu/gemm.h"

#include <Eigen/Dense>
#include <algorithm>
#include <vector>

#include "ember/core/parallel.h"
#include "ember/core/tensor.h"
#include "ember/kernels/cpu/meta_workspace.h"

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

// c = ma * mb (c += ma * mb when accumulate) through Eigen's blocked GEMM with the panels of `panels` (Note [GEMM
// panels from the allocator]).
template <class T, class MA, class MB, class MC>
void blocked_gemm(const MA& ma, const MB& mb, MC& c, GemmPanels<T>& panels, bool accumulate) {
#if EMBER_GEMM_PANELS_FROM_ALLOCATOR
  constexpr int kLhsOrder = (MA::Flags & Eigen::RowMajorBit) ? Eigen::RowMajor : Eigen::ColMajor;
  constexpr int kRhsOrder = (MB::Flags & Eigen::RowMajorBit) ? Eigen::RowMajor : Eigen::ColMajor;
  using Gemm = Eigen::internal::general_matrix_matrix_product<Eigen::Index, T, kLhsOrder, false, T, kRhsOrder, false,
                                                              Eigen::RowMajor, 1>;
  const Eigen::Index m = c.rows(), n = c.cols(), k = ma.cols();
  if (!accumulate) c.setZero();  // the routine accumulates: c += alpha * a * b
  Gemm::run(m, n, k, ma.data(), ma.outerStride(), mb.data(), mb.outerStride(), c.data(), 1, c.outerStride(), T(1),
            panels.blocking(m, n, k));
#else
  (void)panels;
  if (accumulate)
    c.noalias() += ma * mb;
  else
    c.noalias() = ma * mb;
#endif
}

// True when with_eigen packs the operand (neither stride is unit).
bool packs(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  return !(cs == 1 || cols == 1) && !(rs == 1 || rows == 1);
}

// c (a.rows x b.cols, row-major with row stride ldc) = a @ b (c += a @ b when accumulate), T = float or double,
// with workspace taken ahead by prepare_gemm for these shapes and strides.
template <class T>
void gemm(const MatrixView<T>& a, const MatrixView<T>& b, T* out, int64_t ldc, bool accumulate, PackBuffer<T>& pack_a,
          PackBuffer<T>& pack_b, GemmPanels<T>& panels) {
  Eigen::Map<RowMat<T>, Eigen::Unaligned, Eigen::OuterStride<>> c(out, a.rows, b.cols, Eigen::OuterStride<>(ldc));
  if (a.cols == 0) {
    if (!accumulate) c.setZero();
    return;
  }
  const bool blocked = GemmPanels<T>::blocked(a.rows, b.cols, a.cols);
  with_eigen(a, pack_a, [&](const auto& ma) {
    with_eigen(b, pack_b, [&](const auto& mb) {
      if (blocked)
        blocked_gemm<T>(ma, mb, c, panels, accumulate);
      else if (accumulate)
        c.noalias() += ma * mb;
      else
        c.noalias() = ma * mb;
    });
  });
}

// Takes what gemm needs for an [M, K] x [K, N] product with these operand strides: packing buffers, then panels.
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
// A product with at least kParallelGemmMacs multiply-adds runs on the CPU threads (core/parallel.h). A batch of
// B >= 2 products is split into chunks of batches (gemm_batch_chunks), each chunk with its own Gemm. A single product
// (a Gemm made with split) is split along the larger of M and N into blocks of rows (boundaries multiples of
// kRowAlign) or columns (kColAlign), after a strided operand has been packed once; each block is one blocked Eigen
// GEMM with its own packing buffers and panels. Eigen's kc depends
// on K only, its register panels and cache blocks along a dimension are multiples of nr (rows of C) and mr (columns
// of C), and the split points are multiples of both, so each element is summed in the same order as by one GEMM over
// the whole matrix: results are bitwise independent of the thread count (tests/kernels/test_parallel_kernels.cpp).
// Blocks of at least kMinBlock rows/columns keep every block a blocked GEMM (never Eigen's coefficient-based or
// matrix-vector paths, which sum in another order). With accumulate, c's old value is the first term of every sum,
// split or not. All workspace is taken when the Gemm is made, on the calling thread, in block order;
// take_gemm_workspace takes the same on meta.
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

}  // namespace

template <class T>
struct Gemm<T>::State {
  struct Part {
    PackBuffer<T> pack_a, pack_b;
    GemmPanels<T> panels;
  };
  int64_t M, K, N, a_rs, a_cs, b_rs, b_cs;
  GemmSplit split;                      // kSerial, kRows or kCols
  bool pack_a = false, pack_b = false;  // split: the operand is packed once per run into shared_a / shared_b
  PackBuffer<T> shared_a, shared_b;
  std::vector<Part> parts;  // one per block (one when serial)
};

template <class T>
Gemm<T>::Gemm(int64_t M, int64_t K, int64_t N, int64_t a_rs, int64_t a_cs, int64_t b_rs, int64_t b_cs, bool split)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.M = M, s.K = K, s.N = N, s.a_rs = a_rs, s.a_cs = a_cs, s.b_rs = b_rs, s.b_cs = b_cs;
  if (split) s.split = plan_gemm_split(1, M, K, N);
  if (s.split.kind == GemmSplit::kSerial) {
    s.parts.resize(1);
    prepare_gemm<T>(M, K, N, a_rs, a_cs, b_rs, b_cs, s.parts[0].pack_a, s.parts[0].pack_b, s.parts[0].panels);
    return;
  }
  // A strided operand is packed once per run, row-major, and shared by the blocks.
  if (packs(M, K, a_rs, a_cs)) {
    s.pack_a = true;
    s.shared_a.get(M * K);
    a_rs = K, a_cs = 1;
  }
  if (packs(K, N, b_rs, b_cs)) {
    s.pack_b = true;
    s.shared_b.get(K * N);
    b_rs = N, b_cs = 1;
  }
  const bool rows = s.split.kind == GemmSplit::kRows;
  s.parts.resize(static_cast<size_t>(s.split.chunks));
  for (int64_t c = 0; c < s.split.chunks; ++c) {
    const int64_t ext = s.split.begin(c + 1) - s.split.begin(c);
    typename State::Part& part = s.parts[static_cast<size_t>(c)];
    if (ext > 0)
      prepare_gemm<T>(rows ? ext : M, K, rows ? N : ext, a_rs, a_cs, b_rs, b_cs, part.pack_a, part.pack_b, part.panels);
  }
}

template <class T>
Gemm<T>::~Gemm() = default;
template <class T>
Gemm<T>::Gemm(Gemm&&) noexcept = default;
template <class T>
Gemm<T>& Gemm<T>::operator=(Gemm&&) noexcept = default;

template <class T>
void Gemm<T>::run(const T* pa, const T* pb, T* c, int64_t ldc, bool accumulate) {
  State& s = *s_;
  MatrixView<T> a{pa, s.M, s.K, s.a_rs, s.a_cs}, b{pb, s.K, s.N, s.b_rs, s.b_cs};
  if (s.split.kind == GemmSplit::kSerial) {
    typename State::Part& part = s.parts[0];
    gemm<T>(a, b, c, ldc, accumulate, part.pack_a, part.pack_b, part.panels);
    return;
  }
  auto pack = [](MatrixView<T>& v, PackBuffer<T>& buf) {
    T* dst = buf.get(v.rows * v.cols);  // taken by the constructor
    for (int64_t r = 0; r < v.rows; ++r)
      for (int64_t q = 0; q < v.cols; ++q) dst[r * v.cols + q] = v.p[r * v.rs + q * v.cs];
    v = {dst, v.rows, v.cols, v.cols, 1};
  };
  if (s.pack_a) pack(a, s.shared_a);
  if (s.pack_b) pack(b, s.shared_b);
  const bool rows = s.split.kind == GemmSplit::kRows;
  // One chunk per block (the blocks were planned for this thread count); nested inside another parallel chunk, the
  // blocks run one after another, each with its own workspace.
  parallel::parallel_for(s.split.chunks, 1, 1, [&](int64_t, int64_t first, int64_t last) {
    for (int64_t blk = first; blk < last; ++blk) {
      const int64_t lo = s.split.begin(blk), hi = s.split.begin(blk + 1);
      if (lo == hi) continue;
      typename State::Part& part = s.parts[static_cast<size_t>(blk)];
      if (rows)
        gemm<T>({a.p + lo * a.rs, hi - lo, s.K, a.rs, a.cs}, b, c + lo * ldc, ldc, accumulate, part.pack_a, part.pack_b,
                part.panels);
      else
        gemm<T>(a, {b.p + lo * b.cs, s.K, hi - lo, b.rs, b.cs}, c + lo, ldc, accumulate, part.pack_a, part.pack_b,
                part.panels);
    }
  });
}

template class Gemm<float>;
template class Gemm<double>;

namespace {

// prepare_gemm's workspace on meta, in its order: a's packing, b's packing, then the two panels.
template <class T>
void take_prepared(MetaWorkspace& ws, int64_t M, int64_t K, int64_t N, int64_t a_rs, int64_t a_cs, int64_t b_rs,
                   int64_t b_cs) {
  if (K == 0) return;
  if (packs(M, K, a_rs, a_cs)) ws.take(M * K, dtype_of_v<T>);
  if (packs(K, N, b_rs, b_cs)) ws.take(K * N, dtype_of_v<T>);
  if (GemmPanels<T>::blocked(M, N, K)) {
    const typename GemmPanels<T>::Blocking b = GemmPanels<T>::sizes(M, N, K);
    ws.take(b.panel_a, dtype_of_v<T>);
    ws.take(b.panel_b, dtype_of_v<T>);
  }
}

// Gemm<T>'s constructor on meta.
template <class T>
void take_gemm(MetaWorkspace& ws, int64_t M, int64_t K, int64_t N, int64_t a_rs, int64_t a_cs, int64_t b_rs,
               int64_t b_cs, bool split) {
  const GemmSplit plan = split ? plan_gemm_split(1, M, K, N) : GemmSplit{};
  if (plan.kind == GemmSplit::kSerial) return take_prepared<T>(ws, M, K, N, a_rs, a_cs, b_rs, b_cs);
  if (packs(M, K, a_rs, a_cs)) {
    ws.take(M * K, dtype_of_v<T>);
    a_rs = K, a_cs = 1;
  }
  if (packs(K, N, b_rs, b_cs)) {
    ws.take(K * N, dtype_of_v<T>);
    b_rs = N, b_cs = 1;
  }
  const bool rows = plan.kind == GemmSplit::kRows;
  for (int64_t c = 0; c < plan.chunks; ++c) {
    const int64_t ext = plan.begin(c + 1) - plan.begin(c);
    if (ext > 0) take_prepared<T>(ws, rows ? ext : M, K, rows ? N : ext, a_rs, a_cs, b_rs, b_cs);
  }
}

}  // namespace

void take_gemm_workspace(MetaWorkspace& ws, DType dtype, int64_t M, int64_t K, int64_t N, int64_t a_rs, int64_t a_cs,
                         int64_t b_rs, int64_t b_cs, bool split) {
  if (dtype == DType::f64)
    take_gemm<double>(ws, M, K, N, a_rs, a_cs, b_rs, b_cs, split);
  else
    take_gemm<float>(ws, M, K, N, a_rs, a_cs, b_rs, b_cs, split);
}

int64_t gemm_batch_chunks(int64_t B, int64_t M, int64_t K, int64_t N) {
  const GemmSplit s = plan_gemm_split(B, M, K, N);
  return s.kind == GemmSplit::kBatches ? s.chunks : 1;
}

}  // namespace ember::kernels::cpu
