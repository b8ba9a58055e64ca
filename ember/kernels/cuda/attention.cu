// CUDA kernels of the fused attention over packed q, k, v (`attention`, `attention_backward` stubs). The tiled path:
// the products run through gemm() (blas.h), reading q, k, v and grad_out and writing the columns of out and grad_qkv
// in place, and one row kernel does the masked softmax with its lse, the weights' recomputation from lse, and the
// softmax backward. Under the Flash strategy (attention.h) the calls it covers run attention_flash.cu instead.
// Invariant: nothing of size T x T outlives a call, the scratch of a call is bounded (Note [Attention tiles]), and
// every element of out, lse and grad_qkv is written.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ember/base/cuda_check.h"
#include "ember/core/tensor.h"
#include "ember/kernels/cuda/scratch_sizes.h"
#include "ember/kernels/cuda/attention_flash.h"
#include "ember/kernels/cuda/blas.h"
#include "ember/kernels/cuda/block_reduce.cuh"
#include "ember/kernels/cuda/device_info.h"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/elementwise_math.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::block_all_reduce;
using ::ember::cuda::kFullMask;
using ::ember::cuda::kWarpSize;
using ::ember::cuda::MaxOp;
using ::ember::cuda::nan_max;
using ::ember::cuda::SumOp;
using ::ember::cuda::warp_all_reduce;
using ::ember::cuda::DeviceGuard;
using ::ember::cuda::MatrixRef;
using ::ember::cuda::Pack;
using ::ember::cuda::pack_aligned;

// Note [Attention tiles]
// A tile is one head h, the batch elements [b0, b0 + nb) and the query rows [i0, i0 + ni). Its keys are [0, nk):
// nk = T, or i0 + ni when causal (the later keys are masked for every row of the tile). The tile's scores, weights,
// d weights and d scores live in scratch buffers [nb, ni, nk] (row stride nk), allocated once per call for the largest
// tile and reused by every tile on the same stream. One gemm() call covers a tile, its batch being the nb batch
// elements: gemm() requires the outputs of one call not to overlap (batch stride >= (M - 1) ldo + N), and the heads'
// columns of out and grad_qkv interleave (head stride hd, row stride C or 3 C), while the rows of one head for
// successive batch elements are T C (T 3 C) apart. So the heads are a loop and the batch elements the batch.
// Size: the tiles are planned against kAttentionTileBytes (scratch_sizes.h) per buffer (forward one buffer, backward
// two): whole batch elements (ni = T, nb = min(B, budget / T^2)) when one T x T matrix fits, else one batch element
// and ni = budget / T query rows. Forward and backward plan the same tiles, so backward recomputes the scores with the same products.
// With ni < T, dv and dk (sums over the query rows) are accumulated over the row tiles: a tile adds (beta = 1) to
// the key rows [0, w) that earlier tiles wrote and stores (beta = 0) the key rows [w, nk), where w = 0 for the first
// tile, i0 for a later causal one (earlier tiles reached the keys < i0) and T for a later non-causal one (each tile
// covers every key). So every key row is stored once before it is added to, and every element of grad_qkv is written:
// the q columns by the tile holding the query row, the k and v columns by the first tile reaching the key row.

// Note [Attention precision]
// gemm() takes one dtype for all its operands, so the scores come out in qkv's dtype: for f16/bf16 the product
// accumulates in f32 (and is scaled there by alpha = 1 / sqrt(hd)) and is rounded to 16 bits once when stored, as
// PyTorch's math path of scaled_dot_product_attention does (its q k^T is a half matmul). The row kernel then computes
// in f32 (f64 for f64): lse (kept in f32) is that of the rounded scores, and each weight e^(s - lse) is rounded to 16
// bits once for the weights @ v product, as flash attention rounds its P. Likewise d weights and d scores are stored
// in 16 bits between the products. A score is then off by up to 2^-11 |s| (f16) or 2^-8 |s| (bf16), which e^(s - lse)
// turns into that relative error of the weight; an f16 score beyond 65504 is +inf and makes its row NaN (a +inf
// score does the same on the CPU). Converting q and k to f32 first would avoid the rounding but cost f32 copies of
// them and the f16/bf16 tensor-core rate of the largest products. (The flash path keeps its scores in f32: Note
// [Flash attention] in attention_flash.cu.)

constexpr int kRowThreads = 256;         // both paths: 8 rows per block on the warp path, 1 on the block path
constexpr int64_t kWarpMaxCols = 1024;   // rows longer than this take a block each
constexpr int64_t kRowBlocksPerSm = 32;  // grid cap: the grid-stride loops take the remaining rows
static_assert(kRowThreads % kWarpSize == 0 && kRowThreads / kWarpSize <= kWarpSize, "whole warps, one-warp finish");

memory::StreamId stream_id(cudaStream_t s) { return static_cast<memory::StreamId>(reinterpret_cast<uintptr_t>(s)); }

// ---- reductions (block_reduce.cuh) -------------------------------------------------------------------------

// The reduction over one row's group of threads: the whole block (block_per_row, uniform over the grid) or a warp.
template <class A, class Op>
__device__ __forceinline__ A row_all_reduce(A v, Op op, A identity, A* slots, bool block_per_row) {
  return block_per_row ? block_all_reduce(v, op, identity, slots) : warp_all_reduce(v, op);
}

// ---- the row kernel ---------------------------------------------------------------------------------------------

enum class RowMode : int {
  Softmax,   // s: scores -> weights e^(s - lse) (0 where masked), lse written
  Weights,   // s: scores -> weights from the saved lse
  Backward,  // d: d weights -> d scores = w (d - <d, w>) scale (0 where masked), w read from s
};

// Rows r < rows of a tile's [nb, ni, nk] scratch (Note [Attention tiles]): query row i = i0 + r % ni of batch element
// b0 + r / ni, whose first n = (causal ? i + 1 : nk) entries are unmasked; its lse sits at lse_offset + (r / ni) *
// lse_batch_stride + i (acc_t elements).
struct RowArgs {
  void* s = nullptr;
  void* d = nullptr;
  void* lse = nullptr;
  int64_t rows = 0, ni = 1, nk = 0, i0 = 0, lse_offset = 0, lse_batch_stride = 0;
  double scale = 1.0;
  RowMode mode = RowMode::Softmax;
  bool causal = false, block_per_row = false;
};

// Each row is visited by one group: a warp (rows of at most kWarpMaxCols) or the whole block. The row loop's trip
// count is uniform per warp (warp path) or per block (block path), so every shuffle sees 32 active lanes and every
// __syncthreads is reached by the whole block; a thread only ever touches the entries j = t, t + width, ... of a row,
// so rewriting a row in place needs no barrier.
template <class T>
__global__ void __launch_bounds__(kRowThreads) attention_rows_kernel(RowArgs a) {
  using acc_t = op_math_t<T>;
  __shared__ acc_t slots[kWarpSize];
  __shared__ double dot_slots[kWarpSize];  // the backward's <d, w>, summed in double as the CPU kernel does
  const int64_t groups = a.block_per_row ? 1 : blockDim.x / kWarpSize;
  const int64_t group = a.block_per_row ? 0 : threadIdx.x / kWarpSize;
  const int64_t t0 = a.block_per_row ? threadIdx.x : threadIdx.x % kWarpSize;
  const int64_t width = a.block_per_row ? blockDim.x : kWarpSize;
  const acc_t inf = std::numeric_limits<acc_t>::infinity();
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * groups + group; r < a.rows;
       r += static_cast<int64_t>(gridDim.x) * groups) {
    const int64_t i = a.i0 + r % a.ni;
    const int64_t n = a.causal ? i + 1 : a.nk;  // <= nk: a causal tile's keys reach its last row
    T* s = static_cast<T*>(a.s) + r * a.nk;
    if (a.mode == RowMode::Backward) {
      T* d = static_cast<T*>(a.d) + r * a.nk;
      double dot_sum = 0;
      for (int64_t j = t0; j < n; j += width) dot_sum += static_cast<double>(s[j]) * static_cast<double>(d[j]);
      const acc_t dot = static_cast<acc_t>(row_all_reduce(dot_sum, SumOp{}, 0.0, dot_slots, a.block_per_row));
      const acc_t scale = static_cast<acc_t>(a.scale);
      for (int64_t j = t0; j < a.nk; j += width)
        d[j] = T(j < n ? static_cast<acc_t>(s[j]) * (static_cast<acc_t>(d[j]) - dot) * scale : acc_t(0));
      continue;
    }
    acc_t* lse = static_cast<acc_t*>(a.lse) + a.lse_offset + (r / a.ni) * a.lse_batch_stride + i;
    acc_t l;
    if (a.mode == RowMode::Softmax) {
      // As the CPU's softmax_row: the max first (NaN if any entry is), so a NaN or +inf score, or a row of only -inf,
      // gives a NaN lse and a NaN row.
      acc_t mx = -inf;
      for (int64_t j = t0; j < n; j += width) mx = nan_max(mx, static_cast<acc_t>(s[j]));
      mx = row_all_reduce(mx, MaxOp{}, -inf, slots, a.block_per_row);
      acc_t sum = 0;
      for (int64_t j = t0; j < n; j += width) sum += ember_exp(static_cast<acc_t>(s[j]) - mx);
      sum = row_all_reduce(sum, SumOp{}, acc_t(0), slots, a.block_per_row);
      l = mx + ember_log(sum);
      if (t0 == 0) *lse = l;
    } else {
      l = *lse;
    }
    for (int64_t j = t0; j < a.nk; j += width) s[j] = T(j < n ? ember_exp(static_cast<acc_t>(s[j]) - l) : acc_t(0));
  }
}

// The warp path of attention_rows_kernel over rows that are whole 16-byte packs (Pack: nk a multiple of the pack
// width, scratch aligned): lane l holds packs l, l + 32, ... of its row in registers (at most kWarpMaxCols / 32
// values), so a row is read once and written once with 128-bit accesses, where the scalar kernel reads it two or
// three times, one element per lane. The packs wholly past a causal row's last key are not read, only zeroed. The
// arithmetic is the scalar kernel's (the same max, sums and rounding), in another order of summation.
template <class T>
__global__ void __launch_bounds__(kRowThreads) attention_rows_pack_kernel(RowArgs a) {
  using acc_t = op_math_t<T>;
  using P = Pack<T>;
  constexpr int V = P::kSize;
  constexpr int kPacks = static_cast<int>(kWarpMaxCols / kWarpSize) / V;  // per lane
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t groups = blockDim.x / kWarpSize;
  const acc_t inf = std::numeric_limits<acc_t>::infinity();
  const int64_t packs = a.nk / V;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * groups + threadIdx.x / kWarpSize; r < a.rows;
       r += static_cast<int64_t>(gridDim.x) * groups) {  // uniform across the warp
    const int64_t i = a.i0 + r % a.ni;
    const int64_t n = a.causal ? i + 1 : a.nk;
    P* s = reinterpret_cast<P*>(static_cast<T*>(a.s) + r * a.nk);
    acc_t v[kPacks][V];
    EMBER_UNROLL
    for (int c = 0; c < kPacks; ++c) {
      const int64_t pc = lane + static_cast<int64_t>(c) * kWarpSize;
      const bool live = pc < packs && pc * V < n;
      P p;
      if (live) p = s[pc];
      EMBER_UNROLL
      for (int e = 0; e < V; ++e) v[c][e] = live ? static_cast<acc_t>(p.v[e]) : acc_t(0);
    }
    if (a.mode == RowMode::Backward) {
      P* d = reinterpret_cast<P*>(static_cast<T*>(a.d) + r * a.nk);
      acc_t dw[kPacks][V];
      double dot_sum = 0;  // summed in double as the CPU kernel does
      EMBER_UNROLL
      for (int c = 0; c < kPacks; ++c) {
        const int64_t pc = lane + static_cast<int64_t>(c) * kWarpSize;
        const bool live = pc < packs && pc * V < n;
        P p;
        if (live) p = d[pc];
        EMBER_UNROLL
        for (int e = 0; e < V; ++e) {
          dw[c][e] = live ? static_cast<acc_t>(p.v[e]) : acc_t(0);
          if (live && pc * V + e < n) dot_sum += static_cast<double>(v[c][e]) * static_cast<double>(dw[c][e]);
        }
      }
      const acc_t dot = static_cast<acc_t>(warp_all_reduce(dot_sum, SumOp{}));
      const acc_t scale = static_cast<acc_t>(a.scale);
      EMBER_UNROLL
      for (int c = 0; c < kPacks; ++c) {
        const int64_t pc = lane + static_cast<int64_t>(c) * kWarpSize;
        if (pc >= packs) continue;
        P o;
        EMBER_UNROLL
        for (int e = 0; e < V; ++e) o.v[e] = T(pc * V + e < n ? v[c][e] * (dw[c][e] - dot) * scale : acc_t(0));
        d[pc] = o;
      }
      continue;
    }
    acc_t* lse = static_cast<acc_t*>(a.lse) + a.lse_offset + (r / a.ni) * a.lse_batch_stride + i;
    acc_t l;
    if (a.mode == RowMode::Softmax) {
      acc_t mx = -inf;  // NaN if any entry is (nan_max), as the scalar kernel
      EMBER_UNROLL
      for (int c = 0; c < kPacks; ++c)
        EMBER_UNROLL
        for (int e = 0; e < V; ++e)
          if ((lane + static_cast<int64_t>(c) * kWarpSize) * V + e < n) mx = nan_max(mx, v[c][e]);
      mx = warp_all_reduce(mx, MaxOp{});
      acc_t sum = 0;
      EMBER_UNROLL
      for (int c = 0; c < kPacks; ++c)
        EMBER_UNROLL
        for (int e = 0; e < V; ++e)
          if ((lane + static_cast<int64_t>(c) * kWarpSize) * V + e < n) sum += ember_exp(v[c][e] - mx);
      sum = warp_all_reduce(sum, SumOp{});
      l = mx + ember_log(sum);
      if (lane == 0) *lse = l;
    } else {
      l = *lse;
    }
    EMBER_UNROLL
    for (int c = 0; c < kPacks; ++c) {
      const int64_t pc = lane + static_cast<int64_t>(c) * kWarpSize;
      if (pc >= packs) continue;
      P o;
      EMBER_UNROLL
      for (int e = 0; e < V; ++e) o.v[e] = T(pc * V + e < n ? ember_exp(v[c][e] - l) : acc_t(0));
      s[pc] = o;
    }
  }
}

// ---- launchers --------------------------------------------------------------------------------------------------

template <class T>
void launch_rows(const RowArgs& a, int device, cudaStream_t stream) {
  const int64_t per_block = a.block_per_row ? 1 : kRowThreads / kWarpSize;
  const int64_t needed = (a.rows + per_block - 1) / per_block;
  const int64_t cap = static_cast<int64_t>(::ember::cuda::device_properties(device).sm_count) * kRowBlocksPerSm;
  const int64_t blocks = std::max<int64_t>(1, std::min(needed, cap));
  const bool packed = !a.block_per_row && a.nk % Pack<T>::kSize == 0 && pack_aligned(a.s) &&
                      (a.mode != RowMode::Backward || pack_aligned(a.d));
  if (packed)
    attention_rows_pack_kernel<T><<<static_cast<unsigned int>(blocks), kRowThreads, 0, stream>>>(a);
  else
    attention_rows_kernel<T><<<static_cast<unsigned int>(blocks), kRowThreads, 0, stream>>>(a);
  EMBER_CUDA_LAUNCH_CHECK();
}

// Sizes of one call, the dtype and the scale 1 / sqrt(hd).
struct Geometry {
  int64_t B, T, C, H, hd;
  DType dtype;
  double scale;
};

// One tile (Note [Attention tiles]).
struct Tile {
  int64_t h, b0, nb, i0, ni, nk;
};

// The largest tile: nb batch elements of ni query rows.
struct TilePlan {
  int64_t nb, ni;
};

TilePlan plan_tiles(const Geometry& g) {
  const AttentionTiles t = attention_tiles(g.B, g.T, g.dtype);
  return {t.nb, t.ni};
}

// Runs fn(tile) over every tile, heads outermost.
template <class Fn>
void for_each_tile(const Geometry& g, const TilePlan& plan, bool causal, Fn&& fn) {
  for (int64_t h = 0; h < g.H; ++h)
    for (int64_t b0 = 0; b0 < g.B; b0 += plan.nb)
      for (int64_t i0 = 0; i0 < g.T; i0 += plan.ni) {
        const int64_t ni = std::min(plan.ni, g.T - i0);
        fn(Tile{h, b0, std::min(plan.nb, g.B - b0), i0, ni, causal ? i0 + ni : g.T});
      }
}

// Row-kernel arguments for tile t over the scratch `s` (and `d`).
RowArgs row_args(const Geometry& g, const Tile& t, RowMode mode, bool causal, void* s, void* d, void* lse) {
  RowArgs a;
  a.s = s;
  a.d = d;
  a.lse = lse;
  a.rows = t.nb * t.ni;
  a.ni = t.ni;
  a.nk = t.nk;
  a.i0 = t.i0;
  a.lse_offset = (t.b0 * g.H + t.h) * g.T;
  a.lse_batch_stride = g.H * g.T;
  a.scale = g.scale;
  a.mode = mode;
  a.causal = causal;
  a.block_per_row = t.nk > kWarpMaxCols;
  return a;
}

void run_rows(const Geometry& g, const RowArgs& a, int device, cudaStream_t stream) {
  EMBER_DISPATCH_FLOAT(g.dtype, "attention_qkv", [&] { launch_rows<scalar_t>(a, device, stream); });
}

// Untyped pointer arithmetic in elements of `dtype`.
const void* at(const void* p, int64_t elems, DType dtype) {
  return static_cast<const char*>(p) + elems * itemsize(dtype);
}
void* at(void* p, int64_t elems, DType dtype) { return static_cast<char*>(p) + elems * itemsize(dtype); }

// A scratch buffer for the largest tile, from the allocator's pool for `stream`.
Tensor tile_scratch(const Geometry& g, const TilePlan& plan, int device, cudaStream_t stream) {
  return empty_on_stream({plan.nb * plan.ni * g.T}, TensorOptions(g.dtype, Device::cuda(device)), stream_id(stream));
}

// Element offsets: (b, row 0, head h) in qkv (its q; k is + C, v + 2 C) and in out / grad_out.
int64_t qkv_offset(const Geometry& g, int64_t b, int64_t h) { return b * g.T * 3 * g.C + h * g.hd; }
int64_t out_offset(const Geometry& g, int64_t b, int64_t h) { return b * g.T * g.C + h * g.hd; }

// scores [nb, ni, nk] = scale * q[rows i0..] k[keys 0..]^T of tile t, into `s`.
void scores(const Geometry& g, const Tile& t, const void* qkv, void* s, int device, cudaStream_t stream) {
  const int64_t R = 3 * g.C, qb = qkv_offset(g, t.b0, t.h);
  const MatrixRef q{at(qkv, qb + t.i0 * R, g.dtype), g.T * R, R, 1};
  const MatrixRef kt{at(qkv, qb + g.C, g.dtype), g.T * R, 1, R};  // k^T: [hd, nk]
  ::ember::cuda::gemm(g.dtype, t.nb, t.ni, t.nk, g.hd, q, kt, s, t.ni * t.nk, t.nk, g.scale, 0.0, device, stream);
}

void forward(const Geometry& g, bool causal, const void* qkv, void* out, void* lse, int device, cudaStream_t stream) {
  const TilePlan plan = plan_tiles(g);
  const Tensor scratch = tile_scratch(g, plan, device, stream);
  void* s = scratch.raw_data();
  const int64_t R = 3 * g.C;
  for_each_tile(g, plan, causal, [&](const Tile& t) {
    scores(g, t, qkv, s, device, stream);
    run_rows(g, row_args(g, t, RowMode::Softmax, causal, s, nullptr, lse), device, stream);
    // out[rows i0..] (columns of head h, row stride C) = weights [ni, nk] @ v[keys 0..].
    const MatrixRef w{s, t.ni * t.nk, t.nk, 1};
    const MatrixRef v{at(qkv, qkv_offset(g, t.b0, t.h) + 2 * g.C, g.dtype), g.T * R, R, 1};
    ::ember::cuda::gemm(g.dtype, t.nb, t.ni, g.hd, t.nk, w, v, at(out, out_offset(g, t.b0, t.h) + t.i0 * g.C, g.dtype),
                        g.T * g.C, g.C, 1.0, 0.0, device, stream);
  });
}

// grad[key rows 0..nk) (columns of head h at `col` within the 3 C of grad_qkv) = m[ni, nk]^T @ x[rows i0..] for tile
// t: stored on the key rows no earlier tile reached, added to the others (Note [Attention tiles]).
void key_side_product(const Geometry& g, const Tile& t, bool causal, const void* m, const MatrixRef& x, void* grad_qkv,
                      int64_t col, int device, cudaStream_t stream) {
  const int64_t R = 3 * g.C;
  const int64_t written = t.i0 == 0 ? 0 : (causal ? t.i0 : g.T);
  const int64_t bounds[3] = {0, std::min(written, t.nk), t.nk};
  for (int part = 0; part < 2; ++part) {
    const int64_t j0 = bounds[part], j1 = bounds[part + 1];
    if (j1 <= j0) continue;
    const MatrixRef mt{at(m, j0, g.dtype), t.ni * t.nk, 1, t.nk};  // m^T rows j0..j1: [j1 - j0, ni]
    void* o = at(grad_qkv, qkv_offset(g, t.b0, t.h) + col + j0 * R, g.dtype);
    ::ember::cuda::gemm(g.dtype, t.nb, j1 - j0, g.hd, t.ni, mt, x, o, g.T * R, R, 1.0, part == 0 ? 1.0 : 0.0, device,
                        stream);
  }
}

void backward(const Geometry& g, bool causal, const void* grad_out, const void* qkv, void* lse, void* grad_qkv,
              int device, cudaStream_t stream) {
  const TilePlan plan = plan_tiles(g);
  const Tensor scratch_w = tile_scratch(g, plan, device, stream), scratch_d = tile_scratch(g, plan, device, stream);
  void* w = scratch_w.raw_data();
  void* d = scratch_d.raw_data();
  const int64_t R = 3 * g.C;
  for_each_tile(g, plan, causal, [&](const Tile& t) {
    const int64_t qb = qkv_offset(g, t.b0, t.h);
    const MatrixRef go{at(grad_out, out_offset(g, t.b0, t.h) + t.i0 * g.C, g.dtype), g.T * g.C, g.C, 1};
    const MatrixRef q{at(qkv, qb + t.i0 * R, g.dtype), g.T * R, R, 1};
    const MatrixRef k{at(qkv, qb + g.C, g.dtype), g.T * R, R, 1};
    const MatrixRef vt{at(qkv, qb + 2 * g.C, g.dtype), g.T * R, 1, R};  // v^T: [hd, nk]
    // The weights again (Note [Attention saves lse] in kernels/cpu/attention.cpp).
    scores(g, t, qkv, w, device, stream);
    run_rows(g, row_args(g, t, RowMode::Weights, causal, w, nullptr, lse), device, stream);
    // d weights = grad_out v^T; dv = weights^T grad_out.
    ::ember::cuda::gemm(g.dtype, t.nb, t.ni, t.nk, g.hd, go, vt, d, t.ni * t.nk, t.nk, 1.0, 0.0, device, stream);
    key_side_product(g, t, causal, w, go, grad_qkv, 2 * g.C, device, stream);
    // d scores (scaled) in place of d weights; dq = d scores k; dk = d scores^T q.
    run_rows(g, row_args(g, t, RowMode::Backward, causal, w, d, nullptr), device, stream);
    const MatrixRef ds{d, t.ni * t.nk, t.nk, 1};
    ::ember::cuda::gemm(g.dtype, t.nb, t.ni, g.hd, t.nk, ds, k, at(grad_qkv, qb + t.i0 * R, g.dtype), g.T * R, R, 1.0,
                        0.0, device, stream);
    key_side_product(g, t, causal, d, q, grad_qkv, g.C, device, stream);
  });
}

// ---- entry points -----------------------------------------------------------------------------------------------

DType lse_dtype(DType dtype) { return is_reduced_float(dtype) ? DType::f32 : dtype; }

// The layout ops_attention.cpp guarantees, re-checked because the products index raw memory: qkv a contiguous
// [B, T, 3 C] of f32/f64/f16/bf16 on a CUDA device with C a multiple of n_head, lse [B, H, T] contiguous in the
// accumulation dtype on the same device.
Geometry check_qkv(const char* op, const Tensor& qkv, int64_t n_head, const Tensor& lse) {
  EMBER_CHECK(qkv.device().is_cuda(), DeviceError, op, ": the CUDA kernel got ", qkv.description());
  const DType dt = qkv.dtype();
  EMBER_CHECK(is_floating(dt), DTypeError, op,
              ": expects f32, f64, f16 or bf16 qkv, got ", qkv.description());
  EMBER_CHECK(n_head > 0, ValueError, op, ": n_head must be positive, got ", n_head);
  EMBER_CHECK(qkv.dim() == 3 && qkv.size(2) > 0 && qkv.size(2) % (3 * n_head) == 0 && qkv.is_contiguous(), ShapeError,
              op, ": expects a contiguous qkv [B, T, 3 C] with C a multiple of n_head = ", n_head, ", got ",
              qkv.description());
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  EMBER_CHECK(lse.device() == qkv.device(), DeviceError, op, ": lse ", lse.description(), " is not on ",
              qkv.device().str());
  EMBER_CHECK(lse.dtype() == lse_dtype(dt), DTypeError, op, ": lse must be ", dtype_name(lse_dtype(dt)), " for ",
              qkv.description(), ", got ", lse.description());
  EMBER_CHECK(lse.sizes() == Shape({B, n_head, T}) && lse.is_contiguous(), ShapeError, op, ": lse ", lse.description(),
              " must be a contiguous [", B, ", ", n_head, ", ", T, "]");
  return {B, T, C, n_head, C / n_head, dt, 1.0 / std::sqrt(static_cast<double>(C / n_head))};
}

// t must be a contiguous tensor of `sizes` with qkv's dtype and device.
void check_like_qkv(const char* op, const char* what, const Tensor& t, const Tensor& qkv, const Shape& sizes) {
  EMBER_CHECK(t.device() == qkv.device(), DeviceError, op, ": ", what, " ", t.description(), " is not on ",
              qkv.device().str());
  EMBER_CHECK(t.dtype() == qkv.dtype(), DTypeError, op, ": ", what, " ", t.description(), " must have qkv's dtype (",
              qkv.description(), ")");
  EMBER_CHECK(t.sizes() == sizes && t.is_contiguous(), ShapeError, op, ": ", what, " ", t.description(),
              " must be a contiguous ", shape_str(sizes));
}

void attention_cuda(const Tensor& qkv, int64_t n_head, bool causal, const Tensor& out, const Tensor& lse) {
  const char* op = "attention_qkv";
  const Geometry g = check_qkv(op, qkv, n_head, lse);
  check_like_qkv(op, "out", out, qkv, Shape({g.B, g.T, g.C}));
  if (out.numel() == 0) return;
  const int device = qkv.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = ::ember::cuda::current_stream(device).get();
  const ::ember::cuda::FlashShape fs{g.B, g.T, g.C, g.H};
  // Note [One attention path a call]: the path depends on qkv alone (strategy, dtype, head size, alignment), never
  // on where out or grad_qkv happen to lie, so a backward always takes its forward's path and reads an lse of the
  // same scores. A result the flash kernels cannot store to (not 4-byte aligned: a view) is staged and copied.
  if (::ember::cuda::flash_attention_applies(g.dtype, fs, qkv.raw_data(), device)) {
    const bool direct = reinterpret_cast<uintptr_t>(out.raw_data()) % 4 == 0;
    const Tensor dst = direct ? out : empty(out.sizes(), TensorOptions(out.dtype(), out.device()));
    ::ember::cuda::flash_attention_forward(g.dtype, fs, causal, qkv.raw_data(), dst.raw_data(),
                                           static_cast<float*>(lse.raw_data()), device, stream);
    if (!direct) Tensor(out).copy_(dst);  // a handle on out's storage
    return;
  }
  forward(g, causal, qkv.raw_data(), out.raw_data(), lse.raw_data(), device, stream);
}

void attention_backward_cuda(const Tensor& grad_out, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                             int64_t n_head, bool causal, const Tensor& grad_qkv) {
  const char* op = "attention_qkv_backward";
  const Geometry g = check_qkv(op, qkv, n_head, lse);
  check_like_qkv(op, "grad_out", grad_out, qkv, Shape({g.B, g.T, g.C}));
  check_like_qkv(op, "grad_qkv", grad_qkv, qkv, qkv.sizes());
  if (grad_qkv.numel() == 0) return;
  const int device = qkv.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = ::ember::cuda::current_stream(device).get();
  const ::ember::cuda::FlashShape fs{g.B, g.T, g.C, g.H};
  if (::ember::cuda::flash_attention_applies(g.dtype, fs, qkv.raw_data(), device)) {
    // The backward takes the forward's path (Note [One attention path a call]): a grad_out that is not 16-byte
    // aligned (a view) is copied, a grad_qkv that is not 4-byte aligned staged, rather than sent to the tiled path,
    // whose weights would come from lse of other scores.
    const Tensor go = ::ember::cuda::pack_aligned(grad_out.raw_data()) ? grad_out : grad_out.clone();
    const bool direct = reinterpret_cast<uintptr_t>(grad_qkv.raw_data()) % 4 == 0;
    const Tensor dst =
        direct ? grad_qkv : empty(grad_qkv.sizes(), TensorOptions(grad_qkv.dtype(), grad_qkv.device()));
    // The forward's output spares the flash backward a pass (its 32-bit fragment loads need 4-byte alignment).
    if (out.defined()) check_like_qkv(op, "out", out, qkv, Shape({g.B, g.T, g.C}));
    const bool use_out = out.defined() && reinterpret_cast<uintptr_t>(out.raw_data()) % 4 == 0;
    ::ember::cuda::flash_attention_backward(g.dtype, fs, causal, go.raw_data(), qkv.raw_data(),
                                            use_out ? out.raw_data() : nullptr,
                                            static_cast<const float*>(lse.raw_data()), dst.raw_data(), device, stream);
    if (!direct) Tensor(grad_qkv).copy_(dst);
    return;
  }
  backward(g, causal, grad_out.raw_data(), qkv.raw_data(), lse.raw_data(), grad_qkv.raw_data(), device, stream);
}

}  // namespace

EMBER_REGISTER_KERNEL(attention, DeviceType::CUDA, attention_cuda);
EMBER_REGISTER_KERNEL(attention_backward, DeviceType::CUDA, attention_backward_cuda);

}  // namespace ember::kernels::cuda
