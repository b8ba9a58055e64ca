// CPU batched matmul: each batch of a [B, M, K] and b [B, K, N] is multiplied by the Eigen GEMM of gemm.h (operands
// in place when one stride is unit, packed otherwise) into the contiguous out [B, M, N]. f16/bf16 are widened to f32
// matrices, multiplied, rounded back. Large products run on the CPU threads with results independent of their number
// (Note [Parallel GEMM] in gemm.cpp).
// Packing, staging and GEMM panel buffers are host-allocator tensors (Note [Kernel workspace] in conv_pool.cpp).
#include <algorithm>
#include <type_traits>
#include <vector>

#include "ember/core/parallel.h"
#include "ember/kernels/cpu/gemm.h"
#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/cpu/meta_workspace.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

// out [B, M, N] (contiguous) = a @ b (+= when accumulate) for f32/f64 matrices at pa/pb with batch steps and element
// strides: chunks of batches over the CPU threads, or one batch after another, each product split itself when large
// (Note [Parallel GEMM] in gemm.cpp).
template <class T>
void bmm_native(const T* pa, const T* pb, T* po, int64_t B, int64_t M, int64_t K, int64_t N, int64_t step_a,
                int64_t step_b, int64_t sa1, int64_t sa2, int64_t sb1, int64_t sb2, bool accumulate) {
  const int64_t chunks = gemm_batch_chunks(B, M, K, N);
  if (chunks == 1) {
    Gemm<T> g(M, K, N, sa1, sa2, sb1, sb2, /*split=*/true);
    for (int64_t i = 0; i < B; ++i) g.run(pa + i * step_a, pb + i * step_b, po + i * M * N, N, accumulate);
    return;
  }
  std::vector<Gemm<T>> g;
  g.reserve(static_cast<size_t>(chunks));
  for (int64_t c = 0; c < chunks; ++c) g.emplace_back(M, K, N, sa1, sa2, sb1, sb2, /*split=*/false);
  parallel::parallel_for(B, 1, 1, [&](int64_t c, int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i)
      g[static_cast<size_t>(c)].run(pa + i * step_a, pb + i * step_b, po + i * M * N, N, accumulate);
  });
}

// A 16-bit operand widened into the contiguous row-major f32 buffer dst.
template <class T>
void widen(const T* p, int64_t rows, int64_t cols, int64_t rs, int64_t cs, float* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = static_cast<float>(p[i * rs + j * cs]);
}

template <class T>
void bmm_typed(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  const int64_t B = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  T* po = static_cast<T*>(out.raw_data());
  const int64_t sa0 = a.stride(0), sa1 = a.stride(1), sa2 = a.stride(2);
  const int64_t sb0 = b.stride(0), sb1 = b.stride(1), sb2 = b.stride(2);
  // An empty operand (K == 0) may have no storage (null base): its batch offsets are never applied (nothing is read).
  const int64_t step_a = pa == nullptr ? 0 : sa0, step_b = pb == nullptr ? 0 : sb0;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    bmm_native<T>(pa, pb, po, B, M, K, N, step_a, step_b, sa1, sa2, sb1, sb2, accumulate);
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
      T* dst = po + i * M * N;
      if (accumulate)  // the old value is the first term, in f32; one rounding at the end
        for (int64_t e = 0; e < M * N; ++e) c[e] = static_cast<float>(dst[e]);
      bmm_native<float>(wa, wb, c, 1, M, K, N, 0, 0, K, 1, N, 1, accumulate);
      for (int64_t e = 0; e < M * N; ++e) dst[e] = T(c[e]);
    }
  }
}

void bmm_kernel(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  if (out.numel() == 0) return;
  EMBER_DISPATCH_FLOAT(a.dtype(), "bmm", [&] { bmm_typed<scalar_t>(a, b, out, accumulate); });
}

// ---- the same workspace on meta (Note [Meta kernels]) ---------------------------------------------------------------

// bmm_native's workspace: each chunk's Gemm in chunk order, or the one Gemm of a call that runs the batches in turn.
template <class T>
void take_bmm_native_workspace(MetaWorkspace& ws, int64_t B, int64_t M, int64_t K, int64_t N, int64_t a_rs,
                               int64_t a_cs, int64_t b_rs, int64_t b_cs) {
  const int64_t chunks = gemm_batch_chunks(B, M, K, N);
  for (int64_t c = 0; c < chunks; ++c)
    take_gemm_workspace(ws, dtype_of_v<T>, M, K, N, a_rs, a_cs, b_rs, b_cs, chunks == 1);
}

void bmm_meta_kernel(const Tensor& a, const Tensor& b, const Tensor& out, bool /*accumulate*/) {
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
