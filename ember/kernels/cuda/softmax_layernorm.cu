// CUDA softmax / log-softmax along any dim of any strides and layer norm over an [rows, cols] view (three levels per
// op, DESIGN.md §3). Invariant: results follow cpu/softmax_layernorm.cpp (max subtracted first, NaN/+inf rows NaN,
// biased variance, rstd = 1 / sqrt(var + eps)) in op_math_t, and every element of out, mean and rstd is written.
#include <cstdint>
#include <limits>

#include "ember/base/cuda_check.h"
#include "ember/kernels/convert.h"
#include "ember/kernels/cuda/block_reduce.cuh"
#include "ember/kernels/cuda/layer_norm_kernels.cuh"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/cuda/tensor_iter.cuh"
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
using ::ember::cuda::device_properties;
using ::ember::cuda::DeviceGuard;
using ::ember::cuda::grid_for;
using ::ember::cuda::grid_stride_begin;
using ::ember::cuda::grid_stride_step;
using ::ember::cuda::kElementwiseThreads;
using ::ember::cuda::make_offset_calculator;
using ::ember::cuda::OffsetCalculator;
using ::ember::cuda::Pack;
using ::ember::cuda::pack_aligned;

// ---- reductions (block_reduce.cuh) -------------------------------------------------------------------------

template <class A>
__device__ __forceinline__ A neg_inf() {
  return -std::numeric_limits<A>::infinity();
}

// ---- softmax kernels --------------------------------------------------------------------------------------------

// Row r of the softmax: offsets of its first element from `rows` (in, out), then n elements `in_stride` /
// `out_stride` apart.
struct SoftmaxArgs {
  const void* in;
  void* out;
  int64_t rows, n, in_stride, out_stride;
  bool log;
  OffsetCalculator<2> rows_calc;  // over the shape with the softmax dim set to 1; operands (out, in)
};

template <class T>
__global__ void __launch_bounds__(kWarpThreads, kWarpMinBlocksPerSm) softmax_warp_kernel(SoftmaxArgs a) {
  using acc_t = op_math_t<T>;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t warps_per_block = blockDim.x / kWarpSize;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / kWarpSize;
  const int64_t step = static_cast<int64_t>(gridDim.x) * warps_per_block;
  for (int64_t row = first; row < a.rows; row += step) {  // uniform across the warp
    const auto o = a.rows_calc.get(row);
    const T* x = static_cast<const T*>(a.in) + o.v[1];
    T* y = static_cast<T*>(a.out) + o.v[0];
    acc_t v[kWarpPerLane];
    acc_t mx = neg_inf<acc_t>();
    EMBER_UNROLL
    for (int i = 0; i < kWarpPerLane; ++i) {
      const int64_t k = lane + static_cast<int64_t>(i) * kWarpSize;
      v[i] = k < a.n ? static_cast<acc_t>(x[k * a.in_stride]) : acc_t(0);
      if (k < a.n) mx = nan_max(mx, v[i]);
    }
    mx = warp_all_reduce(mx, MaxOp{});
    acc_t sum = 0;
    EMBER_UNROLL
    for (int i = 0; i < kWarpPerLane; ++i) {
      const int64_t k = lane + static_cast<int64_t>(i) * kWarpSize;
      if (k < a.n) {
        const acc_t e = ember_exp(v[i] - mx);
        if (!a.log) v[i] = e;  // exp once per element; the log form needs x - mx again instead
        sum += e;
      }
    }
    sum = warp_all_reduce(sum, SumOp{});
    const acc_t lse = a.log ? ember_log(sum) : acc_t(0);
    const acc_t inv = a.log ? acc_t(0) : acc_t(1) / sum;
    EMBER_UNROLL
    for (int i = 0; i < kWarpPerLane; ++i) {
      const int64_t k = lane + static_cast<int64_t>(i) * kWarpSize;
      if (k < a.n) y[k * a.out_stride] = T(a.log ? v[i] - mx - lse : v[i] * inv);
    }
  }
}

// The warp path over contiguous rows of whole 16-byte packs (the softmax dim innermost in both tensors, n a multiple
// of the pack width, both aligned): lane l holds packs l, l + 32, ... of its row, read and written with 128-bit
// accesses where softmax_warp_kernel moves one element per lane and access. Same arithmetic, another summation order.
template <class T>
__global__ void __launch_bounds__(kWarpThreads, kWarpMinBlocksPerSm) softmax_warp_pack_kernel(SoftmaxArgs a) {
  using acc_t = op_math_t<T>;
  using P = Pack<T>;
  constexpr int V = P::kSize;
  constexpr int kPacks = kWarpPerLane / V;  // per lane
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t warps_per_block = blockDim.x / kWarpSize;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / kWarpSize;
  const int64_t step = static_cast<int64_t>(gridDim.x) * warps_per_block;
  const int64_t packs = a.n / V;
  for (int64_t row = first; row < a.rows; row += step) {  // uniform across the warp
    const P* x = reinterpret_cast<const P*>(static_cast<const T*>(a.in) + row * a.n);
    P* y = reinterpret_cast<P*>(static_cast<T*>(a.out) + row * a.n);
    // Every load is issued before the first use: a load under `if (live)` left the dead path's registers to be
    // copied from the previous pack, which made each load wait for the one before (one row, kPacks latencies). A
    // lane past the row reads the row's last pack again (packs >= 1) and ignores it.
    P pk[kPacks];
    EMBER_UNROLL
    for (int c = 0; c < kPacks; ++c) {
      const int64_t pc = lane + static_cast<int64_t>(c) * kWarpSize;
      pk[c] = x[pc < packs ? pc : packs - 1];
    }
    acc_t v[kPacks][V];
    acc_t mx = neg_inf<acc_t>();
    EMBER_UNROLL
    for (int c = 0; c < kPacks; ++c) {
      const bool live = lane + static_cast<int64_t>(c) * kWarpSize < packs;
      EMBER_UNROLL
      for (int e = 0; e < V; ++e) {
        v[c][e] = static_cast<acc_t>(pk[c].v[e]);
        if (live) mx = nan_max(mx, v[c][e]);
      }
    }
    mx = warp_all_reduce(mx, MaxOp{});
    acc_t sum = 0;
    EMBER_UNROLL
    for (int c = 0; c < kPacks; ++c) {
      if (lane + static_cast<int64_t>(c) * kWarpSize >= packs) continue;
      EMBER_UNROLL
      for (int e = 0; e < V; ++e) {
        const acc_t ex = ember_exp(v[c][e] - mx);
        if (!a.log) v[c][e] = ex;  // exp once per element; the log form needs x - mx again instead
        sum += ex;
      }
    }
    sum = warp_all_reduce(sum, SumOp{});
    const acc_t lse = a.log ? ember_log(sum) : acc_t(0);
    const acc_t inv = a.log ? acc_t(0) : acc_t(1) / sum;
    EMBER_UNROLL
    for (int c = 0; c < kPacks; ++c) {
      if (lane + static_cast<int64_t>(c) * kWarpSize >= packs) continue;
      P o;
      EMBER_UNROLL
      for (int e = 0; e < V; ++e) o.v[e] = T(a.log ? v[c][e] - mx - lse : v[c][e] * inv);
      y[lane + c * kWarpSize] = o;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads) softmax_block_kernel(SoftmaxArgs a, bool cached) {
  using acc_t = op_math_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  acc_t* cache = reinterpret_cast<acc_t*>(smem);  // [n] when `cached`
  __shared__ acc_t slots[kWarpSize];
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {  // uniform across the block
    const auto o = a.rows_calc.get(row);
    const T* x = static_cast<const T*>(a.in) + o.v[1];
    T* y = static_cast<T*>(a.out) + o.v[0];
    acc_t mx = neg_inf<acc_t>();
    for (int64_t k = threadIdx.x; k < a.n; k += blockDim.x) {
      const acc_t v = static_cast<acc_t>(x[k * a.in_stride]);
      if (cached) cache[k] = v;
      mx = nan_max(mx, v);
    }
    mx = block_all_reduce(mx, MaxOp{}, neg_inf<acc_t>(), slots);
    acc_t sum = 0;
    for (int64_t k = threadIdx.x; k < a.n; k += blockDim.x) {
      const acc_t v = cached ? cache[k] : static_cast<acc_t>(x[k * a.in_stride]);
      const acc_t e = ember_exp(v - mx);
      if (cached && !a.log) cache[k] = e;
      sum += e;
    }
    sum = block_all_reduce(sum, SumOp{}, acc_t(0), slots);
    if (a.log) {
      const acc_t lse = ember_log(sum);
      for (int64_t k = threadIdx.x; k < a.n; k += blockDim.x) {
        const acc_t v = cached ? cache[k] : static_cast<acc_t>(x[k * a.in_stride]);
        y[k * a.out_stride] = T(v - mx - lse);
      }
    } else {
      const acc_t inv = acc_t(1) / sum;
      for (int64_t k = threadIdx.x; k < a.n; k += blockDim.x) {
        const acc_t e = cached ? cache[k] : ember_exp(static_cast<acc_t>(x[k * a.in_stride]) - mx);
        y[k * a.out_stride] = T(e * inv);
      }
    }
  }
}

template <class T>
__global__ void softmax_column_kernel(SoftmaxArgs a) {
  using acc_t = op_math_t<T>;
  for (int64_t row = grid_stride_begin(); row < a.rows; row += grid_stride_step()) {
    const auto o = a.rows_calc.get(row);
    const T* x = static_cast<const T*>(a.in) + o.v[1];
    T* y = static_cast<T*>(a.out) + o.v[0];
    acc_t mx = neg_inf<acc_t>();
    for (int64_t k = 0; k < a.n; ++k) mx = nan_max(mx, static_cast<acc_t>(x[k * a.in_stride]));
    acc_t sum = 0;
    for (int64_t k = 0; k < a.n; ++k) sum += ember_exp(static_cast<acc_t>(x[k * a.in_stride]) - mx);
    if (a.log) {
      const acc_t lse = ember_log(sum);
      for (int64_t k = 0; k < a.n; ++k) y[k * a.out_stride] = T(static_cast<acc_t>(x[k * a.in_stride]) - mx - lse);
    } else {
      const acc_t inv = acc_t(1) / sum;
      for (int64_t k = 0; k < a.n; ++k)
        y[k * a.out_stride] = T(ember_exp(static_cast<acc_t>(x[k * a.in_stride]) - mx) * inv);
    }
  }
}

// ---- launchers --------------------------------------------------------------------------------------------------

// Blocks for `work` units of which each block takes `per_block`, capped at `per_sm` blocks per SM (the kernels
// loop over the rest).
unsigned int capped_blocks(int64_t work, int64_t per_block, int64_t per_sm, int device) {
  const int64_t needed = (work + per_block - 1) / per_block;
  const int64_t cap = static_cast<int64_t>(device_properties(device).sm_count) * per_sm;
  const int64_t blocks = needed < cap ? needed : cap;
  return static_cast<unsigned int>(blocks < 1 ? 1 : blocks);
}

// Dynamic shared memory for a block-path row of n values of type A: the whole row when it fits, else none.
template <class A>
size_t row_cache_bytes(int64_t n) {
  const int64_t bytes = n * static_cast<int64_t>(sizeof(A));
  return bytes <= kMaxCacheBytes ? static_cast<size_t>(bytes) : 0;
}

template <class T>
void launch_softmax(const char* op, const Tensor& in, const Tensor& out, int64_t dim, bool log, cudaStream_t stream) {
  SoftmaxArgs a;
  a.in = in.raw_data();
  a.out = out.raw_data();
  a.n = in.size(dim);
  a.rows = in.numel() / a.n;
  a.in_stride = in.stride(dim);
  a.out_stride = out.stride(dim);
  a.log = log;
  Shape row_shape = in.sizes();
  row_shape[static_cast<size_t>(dim)] = 1;  // the calculator skips size-1 dims: it visits each row's first element
  a.rows_calc = make_offset_calculator<2>(row_shape, {&out.strides(), &in.strides()}, op);
  const int device = out.device().index;
  // Note [Softmax and layer norm kernel shapes]: a dim strided in memory goes to the column path when there are
  // enough rows to fill the device (or the rows are too short for a warp to pay); otherwise rows are spread over
  // warps or blocks, whose loads are then strided.
  const bool column = a.in_stride != 1 && a.n > 1 && (a.rows >= kColumnMinRows || a.n <= kColumnMaxShortRow);
  if (column) {
    softmax_column_kernel<T><<<grid_for(a.rows, device), kElementwiseThreads, 0, stream>>>(a);
    EMBER_CUDA_LAUNCH_CHECK();
  } else if (a.n <= kWarpMaxCols) {
    const unsigned int blocks = capped_blocks(a.rows, kWarpThreads / kWarpSize, 16, device);
    const bool packed = dim == in.dim() - 1 && in.is_contiguous() && out.is_contiguous() &&
                        a.n > 0 && a.n % Pack<T>::kSize == 0 && pack_aligned(a.in) &&
                        pack_aligned(a.out);
    if (packed)
      softmax_warp_pack_kernel<T><<<blocks, kWarpThreads, 0, stream>>>(a);
    else
      softmax_warp_kernel<T><<<blocks, kWarpThreads, 0, stream>>>(a);
    EMBER_CUDA_LAUNCH_CHECK();
  } else {
    const size_t smem = row_cache_bytes<op_math_t<T>>(a.n);
    softmax_block_kernel<T><<<capped_blocks(a.rows, 1, 4, device), kBlockThreads, smem, stream>>>(a, smem > 0);
    EMBER_CUDA_LAUNCH_CHECK();
  }
}

// The packed kernel for the residual's dtype (layer_norm_pack_applies<T>(a) holds).
template <class T>
void launch_layer_norm_warp_pack(const LayerNormArgs& a, unsigned int blocks, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    if (a.residual != nullptr && a.res_dtype == DType::bf16) {
      layer_norm_warp_pack_kernel<float, BFloat16><<<blocks, kWarpThreads, 0, stream>>>(a);
      return;
    }
    if (a.residual != nullptr && a.res_dtype == DType::f16) {
      layer_norm_warp_pack_kernel<float, Half><<<blocks, kWarpThreads, 0, stream>>>(a);
      return;
    }
  }
  layer_norm_warp_pack_kernel<T><<<blocks, kWarpThreads, 0, stream>>>(a);
}

template <class T>
void launch_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& sum, const Tensor& weight,
                       const Tensor& bias, double eps, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       cudaStream_t stream) {
  LayerNormArgs a{};
  a.x = x.raw_data();
  a.rows = x.size(0);
  a.cols = x.size(1);
  a.row_stride = x.stride(0);
  a.col_stride = x.stride(1);
  a.weight = weight.defined() ? weight.raw_data() : nullptr;
  a.bias = bias.defined() ? bias.raw_data() : nullptr;
  a.affine_f32 = out.dtype() != x.dtype();
  a.eps = eps;
  a.out = out.raw_data();
  a.mean = mean.raw_data();
  a.rstd = rstd.raw_data();
  if (residual.defined()) {
    a.residual = residual.raw_data();
    a.res_row_stride = residual.stride(0);
    a.res_col_stride = residual.stride(1);
    a.res_dtype = residual.dtype();
    a.sum = sum.raw_data();
  }
  const int device = out.device().index;
  if (a.cols <= kWarpMaxCols) {
    // One row per warp, no grid-stride loop (Note [Softmax and layer norm kernel shapes]): one block per
    // kWarpThreads / 32 rows, within gridDim.x's limit.
    constexpr int64_t rows_per_block = kWarpThreads / kWarpSize;
    const int64_t blocks = (a.rows + rows_per_block - 1) / rows_per_block;
    EMBER_CHECK(blocks <= std::numeric_limits<int32_t>::max(), ShapeError, "layer_norm: ", a.rows,
                " rows exceed the CUDA kernel's grid");
    if (layer_norm_pack_applies<T>(a))
      launch_layer_norm_warp_pack<T>(a, static_cast<unsigned int>(blocks), stream);
    else
      layer_norm_warp_kernel<T><<<static_cast<unsigned int>(blocks), kWarpThreads, 0, stream>>>(a);
    EMBER_CUDA_LAUNCH_CHECK();
  } else {
    const size_t smem = row_cache_bytes<op_math_t<T>>(a.cols);
    layer_norm_block_kernel<T><<<capped_blocks(a.rows, 1, 4, device), kBlockThreads, smem, stream>>>(a, smem > 0);
    EMBER_CUDA_LAUNCH_CHECK();
  }
}

// ---- entry points -----------------------------------------------------------------------------------------------

void check_on_device(const char* op, const Tensor& t, Device device) {
  EMBER_CHECK(t.device() == device, DeviceError, op, ": the CUDA kernel got ", t.description(), " (expected ",
              device.str(), ")");
}

void softmax_cuda(const Tensor& in, const Tensor& out, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  const Device device = out.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", out.description());
  check_on_device(op, in, device);
  EMBER_CHECK(in.dtype() == out.dtype(), DTypeError, op, ": input ", in.description(), " and output ",
              out.description(), " differ in dtype");
  EMBER_CHECK(in.sizes() == out.sizes(), ShapeError, op, ": input ", in.description(), " and output ",
              out.description(), " differ in shape");
  EMBER_CHECK(dim >= 0 && dim < in.dim(), IndexError, op, ": dim ", dim, " out of range for ", in.description());
  if (out.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  EMBER_DISPATCH_FLOAT(in.dtype(), op, [&] { launch_softmax<scalar_t>(op, in, out, dim, log, stream); });
}

void add_layer_norm_cuda(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias, double eps,
                         const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  const char* op = residual.defined() ? "add_layer_norm" : "layer_norm";
  const Device device = out.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", out.description());
  for (const Tensor* t : {&x, &residual, &sum, &weight, &bias, &mean, &rstd})
    if (t->defined()) check_on_device(op, *t, device);
  if (residual.defined())
    EMBER_CHECK(residual.sizes() == x.sizes() &&
                    (residual.dtype() == x.dtype() ||
                     (x.dtype() == DType::f32 && is_reduced_float(residual.dtype()))) &&
                    sum.defined() && sum.sizes() == x.sizes() && sum.dtype() == x.dtype() && sum.is_contiguous(),
                ShapeError, op, ": residual ", residual.description(), " and sum ", sum.description(),
                " must match x ", x.description(), " (sum contiguous)");
  EMBER_CHECK(x.dim() == 2, ShapeError, op, ": the CUDA kernel takes x as [rows, cols], got ", x.description());
  const int64_t rows = x.size(0), cols = x.size(1);
  const DType xt = x.dtype();
  const bool mixed = is_reduced_float(xt) && out.dtype() == DType::f32;
  EMBER_CHECK(out.dtype() == xt || mixed, DTypeError, op, ": output ", out.description(),
              " must have the input's dtype or, for an f16/bf16 input, f32 (input ", x.description(), ")");
  EMBER_CHECK(out.sizes() == x.sizes() && out.is_contiguous(), ShapeError, op, ": output ", out.description(),
              " must be contiguous with the input's shape ", shape_str(x.sizes()));
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    EMBER_CHECK(p->dtype() == out.dtype(), DTypeError, op, ": affine parameter ", p->description(),
                " must have the output's dtype (", out.description(), ")");
    EMBER_CHECK(p->dim() == 1 && p->size(0) == cols, ShapeError, op, ": affine parameter ", p->description(),
                " must be [", cols, "]");
  }
  const DType stats = xt == DType::f64 ? DType::f64 : DType::f32;
  for (const Tensor* s : {&mean, &rstd}) {
    EMBER_CHECK(s->dtype() == stats, DTypeError, op, ": statistics ", s->description(), " must be ", dtype_name(stats),
                " for input ", x.description());
    EMBER_CHECK(s->numel() == rows && s->is_contiguous(), ShapeError, op, ": statistics ", s->description(),
                " must be contiguous with ", rows, " elements");
  }
  // cols == 0 goes through the kernels too: mean 0/0 and rstd 1/sqrt(NaN + eps) come out NaN, as on the CPU.
  if (rows == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  // weight/bias are read once per row element: a strided one (rare: a view of a bigger parameter) is copied to a
  // contiguous [cols] first, on this stream, so the kernels index them by column alone.
  const Tensor w = weight.defined() ? weight.contiguous() : Tensor();
  const Tensor b = bias.defined() ? bias.contiguous() : Tensor();
  EMBER_DISPATCH_FLOAT(xt, op,
                       [&] { launch_layer_norm<scalar_t>(x, residual, sum, w, b, eps, out, mean, rstd, stream); });
}

void layer_norm_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& out,
                     const Tensor& mean, const Tensor& rstd) {
  add_layer_norm_cuda(x, Tensor(), weight, bias, eps, Tensor(), out, mean, rstd);
}

}  // namespace

EMBER_REGISTER_KERNEL(softmax, DeviceType::CUDA, softmax_cuda);
EMBER_REGISTER_KERNEL(layer_norm, DeviceType::CUDA, layer_norm_cuda);
EMBER_REGISTER_KERNEL(add_layer_norm, DeviceType::CUDA, add_layer_norm_cuda);

}  // namespace ember::kernels::cuda
