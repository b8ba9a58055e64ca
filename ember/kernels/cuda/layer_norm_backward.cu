// CUDA layer-norm backward (Note [Fused layer-norm backward] in kernels/ops_norm.cpp), three levels as DESIGN.md §3.
// grad_x: one warp per row (cols <= kWarpMaxCols) or one block per row, two passes over the row (the sums, then the
// writes; the second reads hit the cache). grad_weight / grad_bias: blocks of 32 columns x kColumnRowThreads rows sum
// a fixed group of rows each into partial sums, which a last kernel adds in group order. The grouping depends on the
// sizes alone, so the results are deterministic (no atomics) and equal on every device. Dense rows of whole 16-byte
// packs take packed forms of both passes (Note [Packed layer-norm backward]).
// Invariant: arithmetic in op_math_t<T> (f32 for f32/f16/bf16, f64 for f64), as the forward kernel's.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "ember/base/cuda_check.h"
#include "ember/kernels/cuda/scratch_sizes.h"
#include "ember/kernels/cuda/block_reduce.cuh"
#include "ember/kernels/cuda/layer_norm_backward_kernels.cuh"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/cuda/tensor_iter.cuh"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::block_all_reduce;
using ::ember::cuda::device_properties;
using ::ember::cuda::DeviceGuard;
using ::ember::cuda::kWarpSize;
using ::ember::cuda::SumOp;
using ::ember::cuda::warp_all_reduce;

constexpr int64_t kWarpMaxCols = 1024;  // rows up to this long: one warp each
constexpr int kRowThreads = 128;        // 4 rows per block on the warp path
constexpr int kBlockThreads = 512;      // one row per block otherwise
constexpr int kColumnRowThreads = 8;    // column pass: blocks of 32 columns x 8 row threads
static_assert(kRowThreads % kWarpSize == 0 && kBlockThreads % kWarpSize == 0, "whole warps only");
static_assert(kBlockThreads / kWarpSize <= kWarpSize, "block_all_reduce finishes in one warp");

using layer_norm_backward::Args;  // layer_norm_backward_kernels.cuh

// Note [Packed layer-norm backward]
// Where g, x, grad_x (and grad_add) are contiguous, 16-byte aligned and of one dtype (weight too, when given), and a
// row is a whole number of 16-byte packs, both passes read and write packs (layer_norm_backward_kernels.cuh) where
// the kernels below move one element per access through the row and column strides:
//   grad_x   a warp per row of at most kWarpMaxCols columns, g and x read once into registers (the strided warp
//            kernel reads them twice, the second time from the cache);
//   affine   blocks of 32 packs of columns x 8 row threads over row groups of at least kLayerNormPackGroupRows
//            rows (at most kLayerNormMaxGroups groups; scratch_sizes.h): V times fewer blocks than the strided
//            pass's, so the groups are smaller to keep the device busy.
// The sums come in another order than the strided kernels' (results may differ in the last bits); which pass runs
// depends on the operands alone, never on the device.
static_assert(kColumnRowThreads == reduce_pack::kRowThreads && kWarpSize == reduce_pack::kPackColumns,
              "the packed affine pass launches the strided pass's block shape");

// grad_x of one row by `nt` threads of which this is `tid`; Reduce turns a thread's partial sum into the row's.
template <class T, class P, class Reduce>
__device__ __forceinline__ void grad_x_row(const Args& a, int64_t row, int tid, int nt, Reduce reduce) {
  using A = op_math_t<T>;
  const P* g = static_cast<const P*>(a.g) + row * a.g_rs;
  const T* x = static_cast<const T*>(a.x) + row * a.x_rs;
  const P* w = static_cast<const P*>(a.weight);
  const A mu = static_cast<const A*>(a.mean)[row], k = static_cast<const A*>(a.rstd)[row];
  A sa = 0, sb = 0;  // sum dxhat, sum dxhat * xhat
  for (int64_t j = tid; j < a.cols; j += nt) {
    A d = static_cast<A>(g[j * a.g_cs]);
    if (w) d *= static_cast<A>(w[j]);
    sa += d;
    sb += d * ((static_cast<A>(x[j * a.x_cs]) - mu) * k);
  }
  const A n = static_cast<A>(a.cols);
  const A ma = reduce(sa) / n, mb = reduce(sb) / n;
  T* out = static_cast<T*>(a.grad_x) + row * a.cols;
  const T* add = a.grad_add ? static_cast<const T*>(a.grad_add) + row * a.add_rs : nullptr;
  for (int64_t j = tid; j < a.cols; j += nt) {
    A d = static_cast<A>(g[j * a.g_cs]);
    if (w) d *= static_cast<A>(w[j]);
    const A xhat = (static_cast<A>(x[j * a.x_cs]) - mu) * k;
    A v = k * (d - ma - xhat * mb);
    if (add) v += static_cast<A>(add[j * a.add_cs]);
    out[j] = T(v);
  }
}

// One row per warp, rows in a grid-stride loop whose trip count is uniform per warp.
template <class T, class P>
__global__ void __launch_bounds__(kRowThreads) grad_x_warp_kernel(Args a) {
  using A = op_math_t<T>;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t warps = static_cast<int64_t>(blockDim.x / kWarpSize);
  for (int64_t row = blockIdx.x * warps + threadIdx.x / kWarpSize; row < a.rows; row += gridDim.x * warps)
    grad_x_row<T, P>(a, row, lane, kWarpSize, [](A v) { return warp_all_reduce(v, SumOp{}); });
}

// One row per block, rows in a grid-stride loop whose trip count is uniform per block.
template <class T, class P>
__global__ void __launch_bounds__(kBlockThreads) grad_x_block_kernel(Args a) {
  using A = op_math_t<T>;
  __shared__ A slots[kWarpSize];
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x)
    grad_x_row<T, P>(a, row, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x),
                     [&](A v) { return block_all_reduce(v, SumOp{}, A(0), slots); });
}

// Column pass, block (32 columns, group blockIdx.y of rows): sums g * xhat (into wsum) and g (into bsum) down its
// columns over the group's rows, thread row ty taking rows ty, ty + 8, ...; the 8 partial sums of a column are then
// added in ty order. With one group the sums go straight to grad_weight / grad_bias (P), else to the partial buffers
// [groups, cols] (A). Either destination may be null.
template <class T, class P>
__global__ void __launch_bounds__(kWarpSize* kColumnRowThreads)
    affine_partial_kernel(Args a, int64_t rows_per_group, void* wsum, void* bsum, bool final) {
  using A = op_math_t<T>;
  __shared__ A sw[kColumnRowThreads][kWarpSize + 1];
  __shared__ A sb[kColumnRowThreads][kWarpSize + 1];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarpSize + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_group;
  const int64_t r1 = r0 + rows_per_group < a.rows ? r0 + rows_per_group : a.rows;
  A accw = 0, accb = 0;
  if (col < a.cols) {
    const P* g = static_cast<const P*>(a.g) + col * a.g_cs;
    const T* x = static_cast<const T*>(a.x);
    const A* mean = static_cast<const A*>(a.mean);
    const A* rstd = static_cast<const A*>(a.rstd);
    for (int64_t r = r0 + ty; r < r1; r += kColumnRowThreads) {
      const A gv = static_cast<A>(g[r * a.g_rs]);
      if (wsum) accw += gv * ((static_cast<A>(x[r * a.x_rs + col * a.x_cs]) - mean[r]) * rstd[r]);
      accb += gv;
    }
  }
  sw[ty][tx] = accw;
  sb[ty][tx] = accb;
  __syncthreads();
  if (ty != 0 || col >= a.cols) return;
  A tw = 0, tb = 0;
  EMBER_UNROLL
  for (int i = 0; i < kColumnRowThreads; ++i) {
    tw += sw[i][tx];
    tb += sb[i][tx];
  }
  if (final) {
    if (wsum) static_cast<P*>(wsum)[col] = P(tw);
    if (bsum) static_cast<P*>(bsum)[col] = P(tb);
  } else {
    const int64_t at = static_cast<int64_t>(blockIdx.y) * a.cols + col;
    if (wsum) static_cast<A*>(wsum)[at] = tw;
    if (bsum) static_cast<A*>(bsum)[at] = tb;
  }
}

// The dtypes the packed kernels take: one for every operand, and not f64 (whose rows would hold 128 registers a lane).
template <class T, class P>
constexpr bool kPackable = std::is_same_v<T, P> && sizeof(T) <= 4;

// Whether the packed kernels may read g and x (Note [Packed layer-norm backward]).
template <class T, class P>
bool packed_operands(const Args& a) {
  constexpr int64_t V = ::ember::cuda::Pack<T>::kSize;
  using ::ember::cuda::pack_aligned;
  return kPackable<T, P> && a.cols % V == 0 && a.g_rs == a.cols && a.g_cs == 1 && pack_aligned(a.g) &&
         (a.x == nullptr || (a.x_rs == a.cols && a.x_cs == 1 && pack_aligned(a.x)));
}

template <class T, class P>
void launch(const Args& a, const Tensor& grad_weight, const Tensor& grad_bias, Device device, cudaStream_t stream) {
  using A = op_math_t<T>;
  namespace lb = layer_norm_backward;
  using ::ember::cuda::pack_aligned;
  const int64_t sms = device_properties(device.index).sm_count;
  const bool packed = packed_operands<T, P>(a);
  if (a.grad_x && a.rows > 0) {
    if (packed && a.cols <= kWarpMaxCols && pack_aligned(a.grad_x) && (a.weight == nullptr || pack_aligned(a.weight)) &&
        (a.grad_add == nullptr || (a.add_rs == a.cols && a.add_cs == 1 && pack_aligned(a.grad_add)))) {
      const int64_t per_block = lb::kPackRowThreads / kWarpSize;
      const int64_t blocks = (a.rows + per_block - 1) / per_block;
      EMBER_CHECK(blocks <= std::numeric_limits<int32_t>::max(), ShapeError, "layer_norm_backward: ", a.rows,
                  " rows exceed the CUDA kernel's grid");
      if constexpr (kPackable<T, P>)
        lb::grad_x_warp_pack_kernel<T><<<static_cast<unsigned int>(blocks), lb::kPackRowThreads, 0, stream>>>(a);
    } else if (a.cols <= kWarpMaxCols) {
      const int64_t per_block = kRowThreads / kWarpSize;
      const int64_t blocks = std::min<int64_t>((a.rows + per_block - 1) / per_block, sms * 16);
      grad_x_warp_kernel<T, P><<<static_cast<unsigned int>(blocks), kRowThreads, 0, stream>>>(a);
    } else {
      const int64_t blocks = std::min<int64_t>(a.rows, sms * 4);
      grad_x_block_kernel<T, P><<<static_cast<unsigned int>(blocks), kBlockThreads, 0, stream>>>(a);
    }
    EMBER_CUDA_LAUNCH_CHECK();
  }
  if (!grad_weight.defined() && !grad_bias.defined()) return;
  // Groups of rows: from the sizes alone (not the device), so every device adds in the same order.
  constexpr int64_t V = ::ember::cuda::Pack<T>::kSize;
  const int64_t groups = layer_norm_backward_groups(a.rows, packed);  // scratch_sizes.h
  const int64_t rows_per_group = (a.rows + groups - 1) / groups;
  const int64_t col_blocks = packed ? (a.cols / V + kWarpSize - 1) / kWarpSize : (a.cols + kWarpSize - 1) / kWarpSize;
  const dim3 grid(static_cast<unsigned int>(col_blocks), static_cast<unsigned int>(groups));
  void* gw = grad_weight.defined() ? grad_weight.raw_data() : nullptr;
  void* gb = grad_bias.defined() ? grad_bias.raw_data() : nullptr;
  auto affine = [&](void* wsum, void* bsum, bool final) {
    if constexpr (kPackable<T, P>) {
      if (packed) {
        lb::affine_partial_pack_kernel<T>
            <<<grid, kWarpSize * kColumnRowThreads, 0, stream>>>(a, rows_per_group, wsum, bsum, final);
        EMBER_CUDA_LAUNCH_CHECK();
        return;
      }
    }
    affine_partial_kernel<T, P>
        <<<grid, dim3(kWarpSize, kColumnRowThreads), 0, stream>>>(a, rows_per_group, wsum, bsum, final);
    EMBER_CUDA_LAUNCH_CHECK();
  };
  if (groups == 1) {
    affine(gw, gb, true);
    return;
  }
  // The partial sums, from the caching allocator; freed when this call returns, and since a freed block is handed out
  // again only to later work on the same stream, no one can overwrite it before the kernels below have read it.
  const DType acc = sizeof(A) == 8 ? DType::f64 : DType::f32;
  const Tensor pw = gw ? empty({groups, a.cols}, TensorOptions(acc, device)) : Tensor();
  const Tensor pb = gb ? empty({groups, a.cols}, TensorOptions(acc, device)) : Tensor();
  affine(gw ? pw.raw_data() : nullptr, gb ? pb.raw_data() : nullptr, false);
  const unsigned int blocks = ::ember::cuda::grid_for(a.cols, device.index);
  for (const auto& [partial, out] : {std::pair<const Tensor*, void*>{&pw, gw}, {&pb, gb}}) {
    if (out == nullptr) continue;
    reduce_pack::sum_groups_kernel<A, P><<<blocks, ::ember::cuda::kElementwiseThreads, 0, stream>>>(
        static_cast<const A*>(partial->raw_data()), groups, a.cols, a.rows, /*mean=*/false, static_cast<P*>(out));
    EMBER_CUDA_LAUNCH_CHECK();
  }
}

void layer_norm_backward_cuda(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, const Tensor& grad_add, const Tensor& grad_x,
                              const Tensor& grad_weight, const Tensor& grad_bias) {
  const char* op = "layer_norm_backward";
  const Device device = g.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", g.description());
  for (const Tensor* t : {&x, &weight, &mean, &rstd, &grad_add, &grad_x, &grad_weight, &grad_bias})
    EMBER_CHECK(!t->defined() || t->device() == device, DeviceError, op, ": the CUDA kernel got ", t->description(),
                " (expected ", device.str(), ")");
  EMBER_CHECK(g.dim() == 2, ShapeError, op, ": the CUDA kernel takes g as [rows, cols], got ", g.description());
  const bool need_xhat = grad_x.defined() || grad_weight.defined();
  EMBER_CHECK(!need_xhat || (x.defined() && x.sizes() == g.sizes() && mean.is_contiguous() && rstd.is_contiguous()),
              ShapeError, op, ": x must match g ", g.description(), " and the statistics be contiguous");
  for (const Tensor* t : {&grad_x, &grad_weight, &grad_bias})
    EMBER_CHECK(!t->defined() || t->is_contiguous(), ShapeError, op, ": output ", t->description(),
                " must be contiguous");
  Args a{};
  a.rows = g.size(0);
  a.cols = g.size(1);
  a.g = g.raw_data();
  a.g_rs = g.stride(0);
  a.g_cs = g.stride(1);
  if (need_xhat) {
    a.x = x.raw_data();
    a.x_rs = x.stride(0);
    a.x_cs = x.stride(1);
    a.mean = mean.raw_data();
    a.rstd = rstd.raw_data();
  }
  a.grad_x = grad_x.defined() ? grad_x.raw_data() : nullptr;
  if (grad_x.defined() && grad_add.defined()) {
    EMBER_CHECK(grad_add.sizes() == g.sizes() && grad_add.dtype() == grad_x.dtype(), ShapeError, op, ": grad_add ",
                grad_add.description(), " must match grad_x ", grad_x.description());
    a.grad_add = grad_add.raw_data();
    a.add_rs = grad_add.stride(0);
    a.add_cs = grad_add.stride(1);
  }
  if (a.cols == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  // The weight is read once per element: a strided one (a view of a bigger parameter) is copied to a contiguous
  // [cols] first, on this stream.
  const Tensor w = weight.defined() ? weight.contiguous() : Tensor();
  a.weight = w.defined() ? w.raw_data() : nullptr;
  const DType xt = need_xhat ? x.dtype() : g.dtype();
  if (g.dtype() != xt) {  // mixed: f16/bf16 x, f32 g/weight/affine gradients (ops_norm.cpp checked the pairing)
    if (xt == DType::f16)
      launch<Half, float>(a, grad_weight, grad_bias, device, stream);
    else
      launch<BFloat16, float>(a, grad_weight, grad_bias, device, stream);
    return;
  }
  EMBER_DISPATCH_FLOAT(xt, op, [&] { launch<scalar_t, scalar_t>(a, grad_weight, grad_bias, device, stream); });
}

}  // namespace

EMBER_REGISTER_KERNEL(layer_norm_backward, DeviceType::CUDA, layer_norm_backward_cuda);

}  // namespace ember::kernels::cuda
