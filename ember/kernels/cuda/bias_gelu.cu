// CUDA kernels of the fused bias + GELU (Note [Bias and GELU] in kernels/ops_bias_gelu.cpp), three levels as
// DESIGN.md §3. Forward: a grid-stride loop over the elements. Backward: blocks of 32 columns (or 32 16-byte packs of
// columns, bias_gelu_kernels.cuh) x kRowThreads row threads, each over a fixed group of rows, write the input gradient
// and sum it down their columns; the groups' partial
// sums are added in group order by a last kernel (one group: written directly). The grouping depends on the sizes
// alone, so the bias gradient is deterministic (no atomics) and equal on every device. Invariant: arithmetic in
// op_math_t<T> (f32 for f32/f16/bf16, f64 for f64) with elementwise_math.h's GELU, rounded once; every element of the
// outputs is written.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "ember/base/cuda_check.h"
#include "ember/kernels/cuda/scratch_sizes.h"
#include "ember/kernels/cuda/bias_gelu_kernels.cuh"
#include "ember/kernels/cuda/block_reduce.cuh"
#include "ember/kernels/cuda/device_info.h"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/cuda/tensor_iter.cuh"
#include "ember/kernels/elementwise_math.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::DeviceGuard;
using ::ember::cuda::kWarpSize;
using ::ember::cuda::Pack;

using bias_gelu::bias_gelu_backward_pack_kernel;
using bias_gelu::gelu_grad_at;
using bias_gelu::kRowThreads;           // backward blocks: 32 columns x 8 row threads

template <class A>
__device__ __forceinline__ A gelu_at(A v, bool tanh_approx) {
  return tanh_approx ? gelu_tanh_fn(v) : gelu_erf_fn(v);
}

// out[i] = gelu(x[i] + bias[i % cols]) over x, out [rows, cols] contiguous.
template <class T>
__global__ void bias_gelu_kernel(const T* x, const T* bias, int64_t n, int64_t cols, bool tanh_approx, T* out) {
  using A = op_math_t<T>;
  for (int64_t i = ::ember::cuda::grid_stride_begin(); i < n; i += ::ember::cuda::grid_stride_step())
    out[i] = T(gelu_at(static_cast<A>(x[i]) + static_cast<A>(bias[i % cols]), tanh_approx));
}

// The same over 16-byte packs, when cols is a whole number of packs and x, bias and out are 16-byte aligned: a pack
// of x lies in one row, and its bias is pack (i mod col_packs) of bias. One 128-bit load of x and of bias and one
// 128-bit store per pack; the element math is the kernel's above.
template <class T>
__global__ void bias_gelu_packed_kernel(const Pack<T>* x, const Pack<T>* bias, int64_t packs, int64_t col_packs,
                                        bool tanh_approx, Pack<T>* out) {
  using A = op_math_t<T>;
  for (int64_t i = ::ember::cuda::grid_stride_begin(); i < packs; i += ::ember::cuda::grid_stride_step()) {
    const Pack<T> xv = x[i], bv = bias[i % col_packs];
    Pack<T> r;
    EMBER_UNROLL
    for (int k = 0; k < Pack<T>::kSize; ++k)
      r.v[k] = T(gelu_at(static_cast<A>(xv.v[k]) + static_cast<A>(bv.v[k]), tanh_approx));
    out[i] = r;
  }
}

// Block (32 columns, group blockIdx.y of rows): grad_x of its elements (when grad_x is not null) and the column sums
// of the products over the group's rows (when sums is not null), thread row ty taking rows ty, ty + 8, ...; the 8
// partial sums of a column are added in ty order, into grad_bias (T, `final`) or the partial buffer [groups, cols].
template <class T>
__global__ void __launch_bounds__(kWarpSize* kRowThreads)
    bias_gelu_backward_kernel(const T* g, const T* x, const T* bias, int64_t rows, int64_t cols, int64_t rows_per_group,
                              bool tanh_approx, T* grad_x, void* sums, bool final) {
  using A = op_math_t<T>;
  __shared__ A partial[kRowThreads][kWarpSize + 1];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarpSize + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_group;
  const int64_t r1 = r0 + rows_per_group < rows ? r0 + rows_per_group : rows;
  A acc = 0;
  if (col < cols) {
    const A b = static_cast<A>(bias[col]);
    for (int64_t r = r0 + ty; r < r1; r += kRowThreads) {
      const int64_t i = r * cols + col;
      const A d = gelu_grad_at(static_cast<A>(g[i]), static_cast<A>(x[i]) + b, tanh_approx);
      if (grad_x) grad_x[i] = T(d);
      acc += d;
    }
  }
  if (sums == nullptr) return;  // uniform over the grid: no thread reaches the barrier
  partial[ty][tx] = acc;
  __syncthreads();
  if (ty != 0 || col >= cols) return;
  A total = 0;
  EMBER_UNROLL
  for (int k = 0; k < kRowThreads; ++k) total += partial[k][tx];
  if (final)
    static_cast<T*>(sums)[col] = T(total);
  else
    static_cast<A*>(sums)[static_cast<int64_t>(blockIdx.y) * cols + col] = total;
}

void check_cuda_operands(const char* op, std::initializer_list<const Tensor*> ts, Device device) {
  for (const Tensor* t : ts)
    if (t->defined())
      EMBER_CHECK(t->device() == device && t->is_contiguous(), DeviceError, op, ": the CUDA kernel got ",
                  t->description(), " (expected contiguous, on ", device.str(), ")");
}

void bias_gelu_cuda(const Tensor& x, const Tensor& bias, bool tanh_approx, const Tensor& out) {
  const char* op = "bias_gelu";
  const Device device = out.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", out.description());
  check_cuda_operands(op, {&x, &bias, &out}, device);
  EMBER_CHECK(x.dim() == 2 && out.sizes() == x.sizes() && bias.numel() == x.size(1), ShapeError, op,
              ": the CUDA kernel takes x [rows, cols], bias [cols], got ", x.description(), ", ", bias.description());
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  const int64_t cols = x.size(1);
  EMBER_DISPATCH_FLOAT(x.dtype(), op, [&] {
    constexpr int V = Pack<scalar_t>::kSize;
    if (cols % V == 0 && ::ember::cuda::pack_aligned(x.raw_data()) && ::ember::cuda::pack_aligned(bias.raw_data()) &&
        ::ember::cuda::pack_aligned(out.raw_data())) {
      const int64_t packs = n / V;
      bias_gelu_packed_kernel<scalar_t>
          <<<::ember::cuda::grid_for(packs, device.index), ::ember::cuda::kElementwiseThreads, 0, stream>>>(
              static_cast<const Pack<scalar_t>*>(x.raw_data()), static_cast<const Pack<scalar_t>*>(bias.raw_data()),
              packs, cols / V, tanh_approx, static_cast<Pack<scalar_t>*>(out.raw_data()));
      EMBER_CUDA_LAUNCH_CHECK();
      return;
    }
    bias_gelu_kernel<scalar_t>
        <<<::ember::cuda::grid_for(n, device.index), ::ember::cuda::kElementwiseThreads, 0, stream>>>(
            static_cast<const scalar_t*>(x.raw_data()), static_cast<const scalar_t*>(bias.raw_data()), n, x.size(1),
            tanh_approx, static_cast<scalar_t*>(out.raw_data()));
    EMBER_CUDA_LAUNCH_CHECK();
  });
}

template <class T>
void launch_backward(const Tensor& g, const Tensor& x, const Tensor& bias, bool tanh_approx, const Tensor& grad_x,
                     const Tensor& grad_bias, Device device, cudaStream_t stream) {
  using A = op_math_t<T>;
  const int64_t rows = x.size(0), cols = x.size(1);
  const T* pg = static_cast<const T*>(g.raw_data());
  const T* px = static_cast<const T*>(x.raw_data());
  const T* pb = static_cast<const T*>(bias.raw_data());
  T* gx = grad_x.defined() ? static_cast<T*>(grad_x.raw_data()) : nullptr;
  // Groups of rows: from the sizes alone (not the device), so every device adds in the same order.
  const int64_t groups = bias_gelu_backward_groups(rows);  // scratch_sizes.h
  const int64_t rows_per_group = (rows + groups - 1) / groups;
  // 16-byte packs where every operand allows them (bias_gelu_kernels.cuh: the same sums in the same order, so the
  // choice may depend on the device) and their V times fewer blocks still give every SM two.
  constexpr int V = Pack<T>::kSize;
  const int64_t packed_blocks = (cols / V + kWarpSize - 1) / kWarpSize * groups;
  const bool packed = cols % V == 0 && ::ember::cuda::pack_aligned(pg) && ::ember::cuda::pack_aligned(px) &&
                      ::ember::cuda::pack_aligned(pb) && (gx == nullptr || ::ember::cuda::pack_aligned(gx)) &&
                      packed_blocks >= 2 * ::ember::cuda::device_properties(device.index).sm_count;
  const dim3 grid(static_cast<unsigned int>((cols / (packed ? V : 1) + kWarpSize - 1) / kWarpSize),
                  static_cast<unsigned int>(groups));
  auto run = [&](void* sums, bool final) {
    if (packed) {
      bias_gelu_backward_pack_kernel<T><<<grid, kWarpSize * kRowThreads, 0, stream>>>(
          pg, px, pb, rows, cols, rows_per_group, tanh_approx, gx, sums, final);
    } else {
      bias_gelu_backward_kernel<T><<<grid, dim3(kWarpSize, kRowThreads), 0, stream>>>(
          pg, px, pb, rows, cols, rows_per_group, tanh_approx, gx, sums, final);
    }
  };
  if (!grad_bias.defined() || groups == 1) {
    run(grad_bias.defined() ? grad_bias.raw_data() : nullptr, true);
    EMBER_CUDA_LAUNCH_CHECK();
    return;
  }
  // The partial sums, from the caching allocator; freed when this call returns, and since a freed block is handed out
  // again only to later work on the same stream, no one can overwrite it before the kernels below have read it.
  const Tensor partial = empty({groups, cols}, TensorOptions(sizeof(A) == 8 ? DType::f64 : DType::f32, device));
  run(partial.raw_data(), false);
  EMBER_CUDA_LAUNCH_CHECK();
  reduce_pack::sum_groups_kernel<A, T>
      <<<::ember::cuda::grid_for(cols, device.index), ::ember::cuda::kElementwiseThreads, 0, stream>>>(
          static_cast<const A*>(partial.raw_data()), groups, cols, rows, /*mean=*/false,
          static_cast<T*>(grad_bias.raw_data()));
  EMBER_CUDA_LAUNCH_CHECK();
}

void bias_gelu_backward_cuda(const Tensor& g, const Tensor& x, const Tensor& bias, bool tanh_approx,
                             const Tensor& grad_x, const Tensor& grad_bias) {
  const char* op = "bias_gelu_backward";
  const Device device = x.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", x.description());
  check_cuda_operands(op, {&g, &x, &bias, &grad_x, &grad_bias}, device);
  EMBER_CHECK(x.dim() == 2 && g.sizes() == x.sizes() && bias.numel() == x.size(1) &&
                  (!grad_x.defined() || grad_x.sizes() == x.sizes()) &&
                  (!grad_bias.defined() || grad_bias.numel() == x.size(1)),
              ShapeError, op, ": the CUDA kernel takes g, x, grad_x [rows, cols] and bias, grad_bias [cols], got ",
              g.description(), ", ", x.description(), ", ", bias.description());
  const int64_t cols = x.size(1);
  if (cols == 0 || (!grad_x.defined() && !grad_bias.defined())) return;
  EMBER_CHECK((cols + kWarpSize - 1) / kWarpSize <= std::numeric_limits<int32_t>::max(), ShapeError, op, ": ", cols,
              " columns exceed the CUDA kernel's grid");
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  EMBER_DISPATCH_FLOAT(x.dtype(), op,
                       [&] { launch_backward<scalar_t>(g, x, bias, tanh_approx, grad_x, grad_bias, device, stream); });
}

}  // namespace

EMBER_REGISTER_KERNEL(bias_gelu, DeviceType::CUDA, bias_gelu_cuda);
EMBER_REGISTER_KERNEL(bias_gelu_backward, DeviceType::CUDA, bias_gelu_backward_cuda);

}  // namespace ember::kernels::cuda
