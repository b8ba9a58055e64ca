// The layer norm kernels of softmax_layernorm.cu (forward, and the fused residual add + layer norm) and the row
// shapes the softmax kernels there share (Note [Softmax and layer norm kernel shapes]), in a header so that a host
// compiler can build them too: tests/kernels/test_layer_norm_emulated.cpp runs them on the CPU under
// tests/harness/simt_emulator.h.
// Invariant: one warp per row of at most kWarpMaxCols columns, one block per longer row; every row's mean, rstd and
// out (and sum, for the residual form) are written by the warp or block that owns it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ember/base/host_device.h"
#include "ember/core/dtype.h"
#include "ember/core/half.h"
#include "ember/kernels/convert.h"
#include "ember/kernels/cuda/block_reduce.cuh"
#include "ember/kernels/cuda/kernel_macros.h"
#include "ember/kernels/cuda/tensor_iter.cuh"
#include "ember/kernels/elementwise_math.h"

namespace ember::kernels::cuda {

using ::ember::cuda::block_all_reduce;
using ::ember::cuda::kWarpSize;
using ::ember::cuda::Pack;
using ::ember::cuda::SumOp;
using ::ember::cuda::warp_all_reduce;

// Note [Softmax and layer norm kernel shapes]
// A "row" is the set of elements one result depends on: the n elements along the softmax dim, or one layer-norm row.
//   * warp path (n <= kWarpMaxCols): one warp per row, lane l holding elements l, l + 32, ... in registers
//     (kWarpPerLane of them), reductions by xor shuffles, so every lane ends with the row's max / sum;
//   * block path (n > kWarpMaxCols): one block of kBlockThreads per row, reductions through shared memory
//     (block_all_reduce). The row is cached in dynamic shared memory (op_math_t values) when it fits in kMaxCacheBytes,
//     otherwise re-read from global memory on each pass; either way thread t only ever touches the elements
//     t, t + blockDim.x, ..., so the cache needs no barrier of its own;
//   * column path (softmax whose dim is strided in memory, with many rows or short rows): one thread per row, each
//     walking its row, so that consecutive threads read neighbouring addresses.
// Rows are visited in grid-stride loops whose trip count is uniform per warp (warp path) or per block (block path),
// so full-mask shuffles always see 32 active lanes and every __syncthreads is reached by the whole block. The layer
// norm warp kernel takes exactly one row per warp instead (a warp past the last row exits as a whole): inside a row
// loop the compiler hoists the loop-invariant weight/bias loads out of it and runs out of registers.
constexpr int kWarpPerLane = 32;
constexpr int64_t kWarpMaxCols = kWarpSize * kWarpPerLane;  // 1024
constexpr int kWarpThreads = 128;                           // 4 rows per block on the warp path
constexpr int kWarpMinBlocksPerSm = 4;                      // softmax: caps registers at 128 a thread
constexpr int kBlockThreads = 512;
constexpr int64_t kMaxCacheBytes = 32 * 1024;  // + 32 reduction slots: below the 48 KiB default limit
constexpr int64_t kColumnMinRows = 1024;
constexpr int64_t kColumnMaxShortRow = 32;
static_assert(kWarpThreads % kWarpSize == 0 && kBlockThreads % kWarpSize == 0, "whole warps only");
static_assert(kBlockThreads / kWarpSize <= kWarpSize, "block_reduce finishes in one warp");

// ---- layer norm kernels -----------------------------------------------------------------------------------------

// x [rows, cols] with any strides; weight/bias [cols] (contiguous) or null; out [rows, cols] and mean/rstd [rows]
// contiguous. weight, bias and out hold T, or float when `affine_f32` (Note [Mixed layer norm] in ops_norm.cpp);
// mean/rstd hold op_math_t<T> (f32, or f64 for an f64 x).
struct LayerNormArgs {
  const void* x;
  int64_t rows, cols, row_stride, col_stride;
  const void* weight;  // contiguous
  const void* bias;    // contiguous
  bool affine_f32;
  double eps;
  void* out;
  void* mean;
  void* rstd;
  // add_layer_norm (Note [Residual add and layer norm] in ops_norm.cpp): the row normalised is x + residual, rounded
  // to T and stored into sum [rows, cols] (contiguous) by the pass that first reads it. Null for layer_norm.
  const void* residual;
  int64_t res_row_stride, res_col_stride;
  DType res_dtype;  // T's, or f16/bf16 added to an f32 x
  void* sum;
};

// Element i (in elements) of the residual: T, or with an f32 x also f16/bf16 (res_dtype, uniform per launch).
template <class T>
__device__ __forceinline__ op_math_t<T> residual_at(const LayerNormArgs& a, int64_t i) {
  using A = op_math_t<T>;
  if constexpr (std::is_same_v<T, float>) {
    if (a.res_dtype == DType::f16) return static_cast<A>(static_cast<const Half*>(a.residual)[i]);
    if (a.res_dtype == DType::bf16) return static_cast<A>(static_cast<const BFloat16*>(a.residual)[i]);
  }
  return static_cast<A>(static_cast<const T*>(a.residual)[i]);
}

// Element k of the row normalised: x's, or the rounded x + residual (stored into sum when `store`: once per element,
// by the first pass over the row).
template <class T>
__device__ __forceinline__ op_math_t<T> layer_norm_load(const LayerNormArgs& a, int64_t row, const T* x, int64_t k,
                                                        bool store) {
  using A = op_math_t<T>;
  if (a.residual == nullptr) return static_cast<A>(x[k * a.col_stride]);
  const A r = residual_at<T>(a, row * a.res_row_stride + k * a.res_col_stride);
  const T s = T(static_cast<A>(x[k * a.col_stride]) + r);
  if (store) static_cast<T*>(a.sum)[row * a.cols + k] = s;
  return static_cast<A>(s);
}

// out[row, j] from x's value v, as the CPU: (v - mean) * rstd, times weight, plus bias. P: the element type of
// weight, bias and out (T, or float for the mixed form), chosen once per kernel so the element loop has one path.
template <class P, class A>
__device__ __forceinline__ void layer_norm_store(const LayerNormArgs& a, int64_t row, int64_t j, A v, A mu, A inv) {
  A r = (v - mu) * inv;
  if (a.weight) r *= static_cast<A>(static_cast<const P*>(a.weight)[j]);
  if (a.bias) r += static_cast<A>(static_cast<const P*>(a.bias)[j]);
  static_cast<P*>(a.out)[row * a.cols + j] = P(r);
}

// The write pass of one row on the warp path, from the lane's values v.
template <class P, class A>
__device__ __forceinline__ void layer_norm_warp_write(const LayerNormArgs& a, int64_t row, int lane,
                                                      const A (&v)[kWarpPerLane], A mu, A inv) {
  EMBER_UNROLL
  for (int i = 0; i < kWarpPerLane; ++i) {
    const int64_t k = lane + static_cast<int64_t>(i) * kWarpSize;
    if (k < a.cols) layer_norm_store<P>(a, row, k, v[i], mu, inv);
  }
}

// The write pass of one row on the block path, from the cache or from x.
template <class T, class P, class A>
__device__ __forceinline__ void layer_norm_block_write(const LayerNormArgs& a, int64_t row, const T* x, const A* cache,
                                                       bool cached, A mu, A inv) {
  for (int64_t k = threadIdx.x; k < a.cols; k += blockDim.x)
    layer_norm_store<P>(a, row, k, cached ? cache[k] : layer_norm_load<T>(a, row, x, k, false), mu, inv);
}

template <class T>
__device__ __forceinline__ void layer_norm_store_stats(const LayerNormArgs& a, int64_t row, op_math_t<T> mu,
                                                       op_math_t<T> inv) {
  static_cast<op_math_t<T>*>(a.mean)[row] = mu;
  static_cast<op_math_t<T>*>(a.rstd)[row] = inv;
}

template <class T>
__global__ void __launch_bounds__(kWarpThreads) layer_norm_warp_kernel(LayerNormArgs a) {
  using acc_t = op_math_t<T>;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t warps_per_block = blockDim.x / kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / kWarpSize;
  const acc_t n = static_cast<acc_t>(a.cols), eps = static_cast<acc_t>(a.eps);
  if (row < a.rows) {  // uniform across the warp
    const T* x = static_cast<const T*>(a.x) + row * a.row_stride;
    acc_t v[kWarpPerLane];
    acc_t s = 0;
    EMBER_UNROLL
    for (int i = 0; i < kWarpPerLane; ++i) {
      const int64_t k = lane + static_cast<int64_t>(i) * kWarpSize;
      v[i] = k < a.cols ? layer_norm_load<T>(a, row, x, k, true) : acc_t(0);
      s += v[i];
    }
    const acc_t mu = warp_all_reduce(s, SumOp{}) / n;
    acc_t ss = 0;
    EMBER_UNROLL
    for (int i = 0; i < kWarpPerLane; ++i) {
      const int64_t k = lane + static_cast<int64_t>(i) * kWarpSize;
      if (k < a.cols) {
        const acc_t d = v[i] - mu;
        ss += d * d;
      }
    }
    const acc_t inv = acc_t(1) / ember_sqrt(warp_all_reduce(ss, SumOp{}) / n + eps);
    if (lane == 0) layer_norm_store_stats<T>(a, row, mu, inv);
    if constexpr (detail::is_half_v<T>) {
      if (a.affine_f32) {
        layer_norm_warp_write<float>(a, row, lane, v, mu, inv);
      } else {
        layer_norm_warp_write<T>(a, row, lane, v, mu, inv);
      }
    } else {
      layer_norm_warp_write<T>(a, row, lane, v, mu, inv);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads) layer_norm_block_kernel(LayerNormArgs a, bool cached) {
  using acc_t = op_math_t<T>;
  EMBER_DYNAMIC_SHARED(unsigned char, smem);
  acc_t* cache = reinterpret_cast<acc_t*>(smem);  // [cols] when `cached`
  __shared__ acc_t slots[kWarpSize];
  const acc_t n = static_cast<acc_t>(a.cols), eps = static_cast<acc_t>(a.eps);
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {  // uniform across the block
    const T* x = static_cast<const T*>(a.x) + row * a.row_stride;
    acc_t s = 0;
    for (int64_t k = threadIdx.x; k < a.cols; k += blockDim.x) {
      const acc_t v = layer_norm_load<T>(a, row, x, k, true);
      if (cached) cache[k] = v;
      s += v;
    }
    const acc_t mu = block_all_reduce(s, SumOp{}, acc_t(0), slots) / n;
    acc_t ss = 0;
    for (int64_t k = threadIdx.x; k < a.cols; k += blockDim.x) {
      const acc_t d = (cached ? cache[k] : layer_norm_load<T>(a, row, x, k, false)) - mu;
      ss += d * d;
    }
    const acc_t inv = acc_t(1) / ember_sqrt(block_all_reduce(ss, SumOp{}, acc_t(0), slots) / n + eps);
    if (threadIdx.x == 0) layer_norm_store_stats<T>(a, row, mu, inv);
    if constexpr (detail::is_half_v<T>) {
      if (a.affine_f32) {
        layer_norm_block_write<T, float>(a, row, x, cache, cached, mu, inv);
      } else {
        layer_norm_block_write<T, T>(a, row, x, cache, cached, mu, inv);
      }
    } else {
      layer_norm_block_write<T, T>(a, row, x, cache, cached, mu, inv);
    }
  }
}

// V elements of a residual of type R: a 16-byte pack when R is T, 8 bytes for an f16/bf16 residual added to an f32
// x (the same V columns as x's pack).
template <class R, int V>
struct alignas(sizeof(R) * V) ResidualPack {
  R v[V];
};

// The warp path of layer_norm_warp_kernel over rows that are whole 16-byte packs (layer_norm_pack_applies): lane l
// holds packs l, l + 32, ... of its row in registers, so x (and the residual) are read and out (and sum) written
// with 128-bit accesses (64-bit for an f16/bf16 residual R of an f32 x: GPT-2's residual stream under autocast adds a
// bf16 projection to f32, 54 µs a call on the scalar kernel on an H100 against 12 for the packed one without a
// residual), where the scalar kernel moves one element per lane and access; weight and bias are read as packs of
// the same columns. The arithmetic is the scalar kernel's, in another order of summation.
template <class T, class R = T>
__global__ void __launch_bounds__(kWarpThreads) layer_norm_warp_pack_kernel(LayerNormArgs a) {
  using acc_t = op_math_t<T>;
  using P = Pack<T>;
  constexpr int V = P::kSize;
  using RP = ResidualPack<R, V>;
  static_assert(std::is_same_v<R, T> || (std::is_same_v<T, float> && sizeof(R) == 2),
                "residual: T, or 16-bit into f32");
  constexpr int kPacks = kWarpPerLane / V;  // per lane: kWarpMaxCols elements over 32 lanes
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (row >= a.rows) return;  // uniform across the warp
  const acc_t n = static_cast<acc_t>(a.cols), eps = static_cast<acc_t>(a.eps);
  const int64_t packs = a.cols / V;
  const P* x = reinterpret_cast<const P*>(static_cast<const T*>(a.x) + row * a.cols);
  const RP* res = a.residual ? reinterpret_cast<const RP*>(static_cast<const R*>(a.residual) + row * a.cols) : nullptr;
  // Every load (x, and the residual) is issued before the first use or store: loads under `if (pc < packs)` next to
  // the store into sum waited for each other, one row costing kPacks latencies. A lane past the row reads the row's
  // last pack again and ignores it; an empty row (cols 0) reads nothing.
  P xp[kPacks];
  RP rp[kPacks];
  if (packs > 0) {
    EMBER_UNROLL
    for (int c = 0; c < kPacks; ++c) {
      const int64_t pc = lane + static_cast<int64_t>(c) * kWarpSize;
      xp[c] = x[pc < packs ? pc : packs - 1];
      if (res != nullptr) rp[c] = res[pc < packs ? pc : packs - 1];
    }
  }
  acc_t v[kPacks][V];
  acc_t s = 0;
  EMBER_UNROLL
  for (int c = 0; c < kPacks; ++c) {
    const int64_t pc = lane + static_cast<int64_t>(c) * kWarpSize;
    P p = pc < packs ? xp[c] : P{};
    if (res != nullptr && pc < packs) {  // the rounded x + residual, stored into sum
      EMBER_UNROLL
      for (int e = 0; e < V; ++e) p.v[e] = T(static_cast<acc_t>(p.v[e]) + static_cast<acc_t>(rp[c].v[e]));
      reinterpret_cast<P*>(static_cast<T*>(a.sum) + row * a.cols)[pc] = p;
    }
    EMBER_UNROLL
    for (int e = 0; e < V; ++e) {
      v[c][e] = pc < packs ? static_cast<acc_t>(p.v[e]) : acc_t(0);
      s += v[c][e];
    }
  }
  const acc_t mu = warp_all_reduce(s, SumOp{}) / n;
  acc_t ss = 0;
  EMBER_UNROLL
  for (int c = 0; c < kPacks; ++c) {
    if (lane + static_cast<int64_t>(c) * kWarpSize >= packs) continue;
    EMBER_UNROLL
    for (int e = 0; e < V; ++e) {
      const acc_t d = v[c][e] - mu;
      ss += d * d;
    }
  }
  const acc_t inv = acc_t(1) / ember_sqrt(warp_all_reduce(ss, SumOp{}) / n + eps);
  if (lane == 0) layer_norm_store_stats<T>(a, row, mu, inv);
  const P* w = static_cast<const P*>(a.weight);
  const P* b = static_cast<const P*>(a.bias);
  P* out = reinterpret_cast<P*>(static_cast<T*>(a.out) + row * a.cols);
  EMBER_UNROLL
  for (int c = 0; c < kPacks; ++c) {
    const int64_t pc = lane + static_cast<int64_t>(c) * kWarpSize;
    if (pc >= packs) continue;
    P wp, bp, o;
    if (w != nullptr) wp = w[pc];
    if (b != nullptr) bp = b[pc];
    EMBER_UNROLL
    for (int e = 0; e < V; ++e) {
      acc_t r = (v[c][e] - mu) * inv;
      if (w != nullptr) r *= static_cast<acc_t>(wp.v[e]);
      if (b != nullptr) r += static_cast<acc_t>(bp.v[e]);
      o.v[e] = T(r);
    }
    out[pc] = o;
  }
}

// Whether the packed warp kernel takes the call: x and out of one dtype (not the mixed form), contiguous rows of
// whole packs that fit the warp path, a residual (if any) of x's dtype, or f16/bf16 with an f32 x, in x's layout, and
// every pointer aligned to its pack (16 bytes; 8 for a 16-bit residual of an f32 x).
template <class T>
bool layer_norm_pack_applies(const LayerNormArgs& a) {
  auto aligned = [](const void* p, uintptr_t to) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % to == 0; };
  constexpr int64_t V = Pack<T>::kSize;
  const bool rows_packed = a.col_stride == 1 && (a.rows == 1 || a.row_stride == a.cols) && a.cols % V == 0 &&
                           a.cols <= kWarpMaxCols && aligned(a.x, 16) && aligned(a.out, 16) &&
                           aligned(a.weight, 16) && aligned(a.bias, 16);
  if (a.affine_f32 || !rows_packed) return false;
  if (a.residual == nullptr) return true;
  const bool same = a.res_dtype == dtype_of<T>::value;
  const bool half_into_f32 = std::is_same_v<T, float> && (a.res_dtype == DType::f16 || a.res_dtype == DType::bf16);
  return (same || half_into_f32) && a.res_col_stride == 1 && (a.rows == 1 || a.res_row_stride == a.cols) &&
         aligned(a.residual, same ? 16 : 8) && aligned(a.sum, 16);
}

}  // namespace ember::kernels::cuda
